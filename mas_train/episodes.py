"""Episode records: a bounded sample of what the agents said, written beside the metrics of every step.

Each training step writes ``log_episodes`` of its episodes, and each evaluation ``log_eval_episodes``, to
``RUN/rollouts/step-NNNNNN.jsonl`` (one JSON object a line, ``kind`` ``"train"`` or ``"eval"``; a step's training
sample first, then that step's evaluation). ``mas-eval --output FILE`` writes the same records for its episodes to
``FILE``'s ``.episodes.jsonl`` twin. ``docs/training.md`` ("Episode records") has the table of fields; in short,
one record is one episode: the task, the team reward and success, the env metrics, and its ``transcript``: every
agent turn in order (agent, model group, prompt as indices into the record's ``messages`` table, the text the env
received, invalid flag, token counts, finish reason, score ``s = R - c*invalid``, advantage, sampler logprob sum,
the weight version that generated it and the one its group's update trained at) with the env's own messages
(tool results) between them.

Which episodes (bounded, so a run's files grow by a fixed amount per step):

* training: ``n`` of the step's ``tasks_per_step * G`` episodes, half successes and half failures where the step
  has both (the rest from the other side), drawn with a seed of (run seed, step): the same episodes on a rerun;
* evaluation: the first episode of each of the first ``n`` eval tasks. The eval tasks and seeds do not depend on
  the step (:mod:`mas_train.eval`), so every evaluation of a run logs the same tasks and the report can put the
  step-0 and the last evaluation side by side on them.

The records are built from the collector's :class:`~mas_train.rollout.RolloutBatch` (its samples, trajectories
and :class:`EpisodeText`) and the advantages the trainer computed for its samples.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from mas_train.samples import RolloutBatch

__all__ = [
    "EpisodeLog",
    "EpisodeText",
    "TextEvent",
    "EvalRecorder",
    "episode_records",
    "episodes_markdown",
    "read_episodes",
    "select_train_episodes",
    "step_file",
    "write_records",
]


@dataclass(frozen=True)
class TextEvent:
    """One line of what an episode said, in the order it happened: an agent's action or an env message.

    Attributes:
        speaker: the agent name, or ``"env"`` for an env message (a tool result such as retrieved passages).
        turn: the global turn index (``infos[agent]["turn"]``; an env message carries the turn it belongs to).
        text: the action text exactly as the env received it, or the env message.
        invalid: the env judged the action malformed (always ``False`` for env messages).
        messages: the agent's prompt as chat messages (``None`` for env messages).
        skipped: the turn was skipped for a prompt over ``max_prompt_length`` (the env got ``""``; no sample).
        played_by: the league opponent that played the seat this turn (``mas_train.league``; no sample), or
            ``None`` for the run's own model.
    """

    speaker: str
    turn: int
    text: str
    invalid: bool = False
    messages: Sequence[Mapping[str, str]] | None = None
    skipped: bool = False
    played_by: str | None = None


@dataclass(frozen=True)
class EpisodeText:
    """The text of one episode (one per env copy, parallel to :attr:`mas_train.rollout.RolloutBatch.trajectories`).

    ``events`` interleave the collector's agent turns with the env's own messages where the env keeps a
    transcript (``TextAECEnv.transcript``: ``TranscriptEntry`` rows, speaker ``"env"`` for env messages); an
    env without one gives the agent turns only. :func:`episode_records` turns these into episode records.
    """

    traj_uid: str
    task: Mapping[str, Any]
    events: tuple[TextEvent, ...]


def step_file(folder: str | Path, step: int) -> Path:
    """``folder/step-NNNNNN.jsonl``: the episode file of ``step`` (0 = the evaluation before training)."""
    return Path(folder) / f"step-{int(step):06d}.jsonl"


def select_train_episodes(successes: Sequence[bool], n: int, seed: int, step: int) -> list[int]:
    """Indices of ``n`` episodes out of a step's, mixing successes and failures.

    Args:
        successes: each episode's success flag, in batch order.
        n: how many to keep (all when there are fewer).
        seed, step: seed the draw (``numpy.random.default_rng([seed, step])``).

    Returns:
        Sorted indices: ``ceil(n/2)`` successes and ``floor(n/2)`` failures when both sides have enough; a side
        that is short gives its places to the other.
    """
    if n <= 0:
        return []
    rng = np.random.default_rng([abs(int(seed)), abs(int(step))])
    good = [i for i, s in enumerate(successes) if s]
    bad = [i for i, s in enumerate(successes) if not s]
    n_good = min(len(good), (n + 1) // 2)
    n_bad = min(len(bad), n - n_good)
    n_good = min(len(good), n - n_bad)
    pick = list(rng.choice(good, n_good, replace=False)) if n_good else []
    pick += list(rng.choice(bad, n_bad, replace=False)) if n_bad else []
    return sorted(int(i) for i in pick)


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _gold(task: Mapping[str, Any]) -> Any:
    if task.get("answer") is not None:
        return task["answer"]
    return task.get("golden_answers")


def episode_records(
    batch: RolloutBatch,
    indices: Sequence[int],
    *,
    penalty: float,
    kind: str,
    step: int,
    advantages: Sequence[float] | None = None,
    trained_at: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """The records of episodes ``indices`` of ``batch`` (a :class:`~mas_train.rollout.RolloutBatch`).

    Args:
        batch: the collector's batch; its ``texts`` must be filled (every collector batch has them).
        indices: trajectory indices (positions in ``batch.trajectories``).
        penalty: the env's invalid-action coefficient ``c`` (score ``s = R - c*invalid``).
        kind: ``"train"`` or ``"eval"``.
        step: the training step the episodes belong to (0 = before training).
        advantages: one per ``batch.samples`` entry (the trainer's); ``None`` (evaluation): ``null`` advantages.
        trained_at: model group → the weight version its update trained at in this step (each turn's
            ``trained_at_version``; ``null`` for a group not in it, and everywhere when ``None``: evaluation).

    Returns:
        JSON-able dicts, the fields of docs/training.md ("Episode records").

    Raises:
        ValueError: ``batch.texts`` does not match ``batch.trajectories``, or ``advantages`` not ``batch.samples``.
    """
    from mas_envs.core import task_id_of

    trajs, texts, samples = batch.trajectories, batch.texts, batch.samples
    if len(texts) != len(trajs):
        raise ValueError(f"batch has {len(texts)} episode texts for {len(trajs)} trajectories")
    if advantages is not None and len(advantages) != len(samples):
        raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples")
    by_traj: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_traj.setdefault(s.traj_uid, []).append(i)
    groups: dict[str, list[Any]] = {}
    for t in trajs:
        groups.setdefault(t.task_uid, []).append(t)
    out = []
    for j in indices:
        traj, text = trajs[j], texts[j]
        task = dict(text.task)
        group = groups[traj.task_uid]
        mine = iter(by_traj.get(traj.traj_uid, []))
        table: dict[tuple[str, str], int] = {}
        transcript = []
        for ev in text.events:
            if ev.speaker == "env" and ev.messages is None:
                transcript.append({"speaker": "env", "turn": ev.turn, "text": ev.text})
                continue
            # a turn without a sample (skipped, or a league opponent's): its seat's own return in a game
            reward = traj.agent_rewards.get(ev.speaker, traj.team_reward)
            score = _finite(reward - penalty * float(ev.invalid))
            row: dict[str, Any] = {
                "speaker": ev.speaker,
                "turn": ev.turn,
                "model_group": None,
                "prompt": [
                    table.setdefault((str(m.get("role", "")), str(m.get("content", ""))), len(table))
                    for m in (ev.messages or ())
                ],
                "text": ev.text,
                "invalid": ev.invalid,
                "skipped": ev.skipped,
                "played_by": ev.played_by,
                "prompt_tokens": None,
                "completion_tokens": None,
                "finish_reason": None,
                "score": score,
                "advantage": None,
                "logprob_sum": None,
                "weight_version": None,
                "trained_at_version": None,
            }
            if not ev.skipped and ev.played_by is None:
                k = next(mine)
                s = samples[k]
                row.update(
                    model_group=s.model_group,
                    prompt_tokens=len(s.prompt_ids),
                    completion_tokens=len(s.completion_ids),
                    finish_reason=s.finish_reason,
                    score=_finite(s.score(penalty)),
                    advantage=None if advantages is None else _finite(advantages[k]),
                    logprob_sum=_finite(float(sum(s.sampling_logprobs))),
                    weight_version=s.weight_version,
                    trained_at_version=None if trained_at is None else trained_at.get(s.model_group),
                )
            transcript.append(row)
        out.append(
            {
                "kind": kind,
                "step": int(step),
                "task_uid": traj.task_uid,
                "traj_uid": traj.traj_uid,
                "task_id": task_id_of(task),
                "sample": group.index(traj),
                "data_source": traj.data_source,
                "question": task.get("question", ""),
                "gold": _gold(task),
                "team_reward": _finite(traj.team_reward),
                # a game's per-seat returns (its team reward says nothing there: zero-sum) and league opponents
                "returns": {a: _finite(r) for a, r in traj.agent_rewards.items()},
                "opponents": dict(traj.opponents),
                "success": traj.success,
                "num_turns": traj.num_turns,
                "metrics": {k: _finite(v) for k, v in traj.metrics.items()},
                "task_group": {
                    "size": len(group),
                    "successes": sum(bool(t.success) for t in group),
                    "mean_reward": _finite(float(np.mean([t.team_reward for t in group]))),
                },
                "messages": [{"role": r, "content": c} for (r, c) in table],
                "transcript": transcript,
            }
        )
    return out


def write_records(
    path: str | Path, records: Sequence[Mapping[str, Any]], *, replace_kind: str | None = None
) -> Path:
    """Write ``records`` to ``path`` as JSON lines, through a temporary file and a rename.

    ``replace_kind=None`` replaces the whole file; ``replace_kind="eval"`` keeps the file's records of other kinds
    (the step's training sample) and replaces its ``eval`` records (a repeated evaluation of the step).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keep: list[Mapping[str, Any]] = []
    if replace_kind is not None and path.is_file():
        keep = [r for r in read_episodes(path) if r.get("kind") != replace_kind]
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in [*keep, *records]:
            fh.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)
    return path


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """The records of one episode file, or of every ``step-*.jsonl`` of a ``rollouts/`` folder (step order).

    A half-written last line (a run killed while writing) is skipped.
    """
    path = Path(path)
    files = sorted(path.glob("step-*.jsonl")) if path.is_dir() else [path]
    out = []
    for f in files:
        lines = f.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                if i != len(lines) - 1:
                    raise ValueError(f"{f}:{i + 1} is not JSON; the episode file is corrupt") from None
    return out


def _block(text: str) -> str:
    # an indented code block: shows the text verbatim whatever it holds (no fence it could close)
    return "\n".join("    " + line for line in (text or "(empty)").splitlines() or [""])


def _outcome(r: Mapping[str, Any]) -> str:
    """``R = 1`` for a team task; a game's returns per seat and who played the league's seats,
    ``player_0 +1, player_1 -1 (player_1: random)``."""
    if not r.get("returns"):
        return f"R = {r['team_reward']:g}"
    by = ", ".join(f"{a}: {o}" for a, o in r.get("opponents", {}).items())
    return ", ".join(f"{a} {v:+g}" for a, v in r["returns"].items()) + (f" ({by})" if by else "")


def episodes_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """The records as one markdown text (TensorBoard's text plugin): per episode, the task, then each turn."""
    parts = []
    for r in records:
        ok = "success" if r["success"] else "failure"
        parts.append(
            f"### {r['kind']} step {r['step']}: task {r['task_id']} ({r['data_source']}), {ok}, {_outcome(r)}"
            f"\n\n**question**\n\n{_block(str(r['question']))}\n\n**gold** `{r['gold']}`"
        )
        for t in r["transcript"]:
            if t["speaker"] == "env":
                parts.append(f"**env** (turn {t['turn']})\n\n{_block(t['text'])}")
                continue
            adv = "-" if t["advantage"] is None else f"{t['advantage']:+.3f}"
            flags = (
                (" **invalid**" if t["invalid"] else "")
                + (" (skipped: prompt too long)" if t["skipped"] else "")
                + (f" (played by {t['played_by']})" if t.get("played_by") else "")
            )
            ver = "" if t.get("weight_version") is None else f", weights v{t['weight_version']}"
            if ver and t.get("trained_at_version") is not None:
                ver += f" (trained at v{t['trained_at_version']})"
            parts.append(
                f"**{t['speaker']}** (turn {t['turn']}){flags}: score {t['score']:g}, advantage {adv}{ver}\n\n"
                f"{_block(t['text'])}"
            )
        parts.append("---")
    return "\n\n".join(parts)


class EvalRecorder:
    """Collects the records of one evaluation: pass :meth:`add` as ``evaluate(on_batch=...)``.

    Args:
        k: episodes per task of the evaluation (the collector's batches hold ``k`` per task, task-major).
        penalty: the env's invalid-action coefficient.
        limit: keep the first episode of each of the first ``limit`` tasks; ``None``: every episode.
        step: the ``step`` of the records.
    """

    def __init__(self, k: int, penalty: float, *, limit: int | None, step: int = 0) -> None:
        self.k, self.penalty, self.limit, self.step = int(k), float(penalty), limit, int(step)
        self.records: list[dict[str, Any]] = []
        self._tasks_seen = 0

    def add(self, batch: RolloutBatch) -> None:
        n_tasks = len(batch.trajectories) // self.k
        if self.limit is None:
            idx = list(range(len(batch.trajectories)))
        else:
            room = max(0, min(n_tasks, self.limit - self._tasks_seen))
            idx = [t * self.k for t in range(room)]
        self._tasks_seen += n_tasks
        if idx:
            self.records += episode_records(batch, idx, penalty=self.penalty, kind="eval", step=self.step)


class EpisodeLog:
    """The episode files of a run (``RUN/rollouts/``) and their TensorBoard text.

    Args:
        folder: the ``rollouts/`` folder.
        per_step: ``log_episodes``, episodes of each training step (0: none).
        per_eval: ``log_eval_episodes``, eval tasks per evaluation (0: none).
        penalty: the env's invalid-action coefficient.
        seed: the run seed (which training episodes are drawn).
        text_sink: ``text_sink(tag, markdown, step)``, e.g. :meth:`~mas_train.tracking.RunLogger.log_text`.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        per_step: int,
        per_eval: int,
        penalty: float,
        seed: int = 0,
        text_sink: Callable[[str, str, int], None] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.per_step, self.per_eval = int(per_step), int(per_eval)
        self.penalty, self.seed = float(penalty), int(seed)
        self.text_sink = text_sink

    def train(
        self,
        step: int,
        batch: RolloutBatch,
        advantages: Sequence[float],
        trained_at: Mapping[str, int] | None = None,
    ) -> list[dict[str, Any]]:
        """Write the sample of training step ``step`` (replacing the file of a redone step); ``advantages``
        and ``trained_at`` as :func:`episode_records` takes them."""
        if self.per_step <= 0:
            return []
        idx = select_train_episodes([t.success for t in batch.trajectories], self.per_step, self.seed, step)
        records = episode_records(
            batch,
            idx,
            penalty=self.penalty,
            kind="train",
            step=step,
            advantages=list(advantages),
            trained_at=trained_at,
        )
        write_records(step_file(self.folder, step), records)
        if self.text_sink is not None and records:
            self.text_sink("episodes/train", episodes_markdown(records), step)
        return records

    def eval_recorder(self, k: int, step: int) -> EvalRecorder | None:
        """A recorder for an evaluation at ``step`` with ``k`` episodes per task (``None`` when off)."""
        return EvalRecorder(k, self.penalty, limit=self.per_eval, step=step) if self.per_eval > 0 else None

    def write_eval(self, recorder: EvalRecorder | None) -> None:
        """Add an evaluation's records to its step's file (replacing that step's earlier eval records)."""
        if recorder is None:
            return
        write_records(step_file(self.folder, recorder.step), recorder.records, replace_kind="eval")
        if self.text_sink is not None and recorder.records:
            self.text_sink("episodes/eval", episodes_markdown(recorder.records), recorder.step)

"""Who plays a game's seat when it is not the learner: the :class:`Opponent` protocol the rollout calls once per
tick with that opponent's pending turns, a scripted policy (:class:`ScriptedOpponent`) and a frozen snapshot of the
learner's LoRA adapters (:class:`SnapshotOpponent`). :mod:`mas_train.league` draws them; :mod:`mas_train.rollout`
steps their turns, which give no training samples."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mas_envs.games.moves import format_move
from mas_train import lora
from mas_train.move_choice import choose_moves

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from mas_train.backends.base import SamplingParams
    from mas_train.hosting.protocols import WorkerPool

__all__ = ["Opponent", "OpponentTurn", "ScriptedOpponent", "SnapshotOpponent"]


@dataclass(frozen=True)
class OpponentTurn:
    """One pending turn of a seat an opponent plays: the env (its ``observe``/``infos``), the seat, the prompt the
    env gave it and the sampling the learner would have used (the env's stop strings, a per-request seed)."""

    env: AECEnv[str, str, str]
    agent: str
    messages: Sequence[Mapping[str, str]]
    sampling: SamplingParams


class Opponent(Protocol):
    """Plays the seats the learner does not hold in a task group.

    Attributes:
        name: what the metrics and transcripts call it (``random``, ``minimax?epsilon=0.2``, ``snapshot``...).
    """

    name: str

    def play(self, turns: Sequence[OpponentTurn]) -> list[str]:
        """One action text per turn (all turns of one tick, batched)."""
        ...


class ScriptedOpponent:
    """A scripted policy (:func:`mas_envs.games.opponents.scripted_policy`) from its spec; reads each turn's
    observation (``env.observe(agent)``) and legal moves (``infos[agent]["legal_moves"]``)."""

    def __init__(self, spec: str, game: str, seed: int) -> None:
        from mas_envs.games.opponents import scripted_policy

        self.name = spec
        self.policy = scripted_policy(spec, game, seed)

    def play(self, turns: Sequence[OpponentTurn]) -> list[str]:
        return [self.policy(str(t.env.observe(t.agent)), t.env.infos[t.agent]["legal_moves"]) for t in turns]


class SnapshotOpponent:
    """A frozen snapshot: each seat is played with the snapshot of that seat's model group (a group that does not
    train, which has no snapshot, plays with its own fixed weights).

    Args:
        adapters: trainable model group → the snapshot's adapter name on that group's generation backend.
        pool: the run's (local) worker pool; agent_groups: agent → model group.
    """

    name = "snapshot"

    def __init__(
        self,
        adapters: Mapping[str, str],
        pool: WorkerPool,
        agent_groups: Mapping[str, str],
        legal_moves_only: bool = False,
    ) -> None:
        self.adapters = dict(adapters)
        self.pool = pool
        self.agent_groups = dict(agent_groups)
        self.legal_moves_only = legal_moves_only  # choose among the legal moves, as the learner does

    def play(self, turns: Sequence[OpponentTurn]) -> list[str]:
        from mas_train.prompts import render_prompt

        out: list[str] = [""] * len(turns)
        by_group: dict[str, list[int]] = defaultdict(list)
        for i, t in enumerate(turns):
            by_group[self.agent_groups[t.agent]].append(i)
        for g, idx in by_group.items():
            worker: Any = self.pool.worker(g)
            sampling = [turns[i].sampling for i in idx]
            if self.legal_moves_only:
                # a frozen group (no snapshot adapter) scores with its own fixed weights, as in the learner's seat
                scorer = _scorer(worker.backend, self.adapters[g]) if g in self.adapters else worker.score
                picks = choose_moves(
                    scorer,
                    worker.tokenizer,
                    [render_prompt(worker.tokenizer, turns[i].messages) for i in idx],
                    [turns[i].env.infos[turns[i].agent]["legal_moves"] for i in idx],
                    sampling,
                )
                for i, (label, _) in zip(idx, picks, strict=True):
                    out[i] = format_move(label)
                continue
            if g not in self.adapters:  # a frozen group: its weights never change, so it plays as itself
                if worker.wants_messages:
                    gens = worker.generate_messages([turns[i].messages for i in idx], sampling)
                else:
                    gens = worker.generate(
                        [render_prompt(worker.tokenizer, turns[i].messages) for i in idx], sampling
                    )
            else:
                prompts = [render_prompt(worker.tokenizer, turns[i].messages) for i in idx]
                gens = worker.backend.generate(prompts, sampling, adapters=[self.adapters[g]] * len(idx))
            for i, o in zip(idx, gens, strict=True):
                text = (o.meta or {}).get("env_text")
                out[i] = (
                    text
                    if text is not None
                    else worker.tokenizer.decode(o.completion_ids, skip_special_tokens=True)
                )
        return out


def _scorer(
    backend: Any, adapter: str
) -> Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], list[list[float]]]:
    """``backend.score`` with ``adapter`` active, the model's adapter state put back after."""

    def score(prompts: Sequence[Sequence[int]], comps: Sequence[Sequence[int]]) -> list[list[float]]:
        with lora.preserving_state(backend.model):
            backend.model.base_model.set_adapter(adapter)
            return list(backend.score(prompts, comps))

    return score

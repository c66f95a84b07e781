"""Evaluation: k episodes per task, avg@k and pass@k per data source (as the Dr. MAS reference validates).

avg@k is the mean success over the k episodes of a task, averaged over tasks; pass@k is the fraction of tasks
solved at least once in k episodes (the plain k-sample estimate, as the reference reports it).

This is the one evaluation path: the trainer (before the first update, every ``eval_steps`` and at the end)
and ``mas-eval`` both call :func:`evaluate` with the sampling of :func:`eval_sampling` and the same seeds, so
``mas-eval --checkpoint`` on a run's last checkpoint reproduces the run's last evaluation. The sampling rule:
every agent samples with its own training settings (``max_new_tokens``, its env's stop strings), at the
evaluation ``temperature``, ``top_p`` and ``top_k`` of ``eval_sampling`` (and its ``max_new_tokens`` when that is
set). The seeds do not depend on the
training step, so evaluations at different steps see the same random numbers (a paired comparison), nor on
``tasks_per_batch`` (:func:`eval_seed_ids`), so a memory setting does not change what is measured.

A game (:mod:`mas_envs.games`) can also be evaluated against fixed scripted opponents (``opponents``, the run's
``eval_opponents``): for each opponent and each seat, the learner plays that seat on every task ``k`` times with
the opponent in the other seats (:func:`versus`), logged as ``eval/vs/<opponent>/{win,draw,loss,return}``.

An env may also have an exact evaluation (:meth:`mas_envs.core.TextAECEnv.exact_evaluation`, e.g. Kuhn poker's
exploitability): :func:`evaluate` runs it after the episodes, scoring the env's given replies with each agent's
model group (:func:`score_replies`), and logs its metrics as ``eval/<name>``; the
trainer writes its artifacts to ``<run>/evals/<name>_step-<NNNNNN>.json`` (:func:`write_artifacts`).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mas_train.backends.base import LogprobScorer, SamplingParams

if TYPE_CHECKING:
    from mas_envs.core import ExactEvaluation
    from mas_train.config import ResolvedConfig
    from mas_train.rollout import RolloutCollector
    from mas_train.samples import RolloutBatch

__all__ = [
    "EVAL_SEED_BLOCK",
    "EVAL_SEED_STEP",
    "can_score",
    "eval_sampling",
    "eval_seed_ids",
    "evaluate",
    "exact_evaluation",
    "versus",
    "score_replies",
    "write_artifacts",
]

#: The ``step`` mixed into evaluation seeds (negative: never a training step's).
EVAL_SEED_STEP = -1

#: Tasks per block of the evaluation's seed layout: a task's episodes are seeded by the task's position in the
#: evaluation set, as if the set were collected 8 tasks at a time (the default ``eval_tasks_per_batch``, so an
#: evaluation measured at 8 before the layout was fixed keeps its seeds), whatever ``tasks_per_batch`` is.
EVAL_SEED_BLOCK = 8


def eval_seed_ids(seed_step: int, start: int, n_tasks: int, k: int) -> list[tuple[int, int]]:
    """The ``(step, index)`` seed pairs (:meth:`~mas_train.rollout.RolloutCollector.collect`'s ``seed_ids``) of the
    ``k`` episodes of tasks ``start .. start + n_tasks - 1`` of an evaluation set, task-major.

    Task ``T``'s episode ``g`` gets ``(seed_step * 100_003 - b, (T - b) * k + g)`` with ``b`` the first task of
    its block of :data:`EVAL_SEED_BLOCK`: a function of ``T`` alone, so ``tasks_per_batch`` (memory, speed)
    does not change which random numbers an episode sees.

    Raises:
        ValueError: ``start`` or ``n_tasks`` negative, or ``k < 1``.
    """
    if start < 0 or n_tasks < 0 or k < 1:
        raise ValueError(
            f"eval_seed_ids needs start >= 0, n_tasks >= 0 and k >= 1, got {start}, {n_tasks}, {k}"
        )
    out: list[tuple[int, int]] = []
    for task in range(start, start + n_tasks):
        block = task - task % EVAL_SEED_BLOCK
        out.extend((seed_step * 100_003 - block, (task - block) * k + g) for g in range(k))
    return out


def eval_sampling(
    resolved: ResolvedConfig,
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
) -> dict[str, SamplingParams]:
    """Per-agent :class:`SamplingParams` for evaluation (the rule in the module docstring).

    Args:
        resolved: a :class:`~mas_train.config.ResolvedConfig`.
        temperature, top_p, max_new_tokens: override ``eval_sampling``'s values (``mas-eval`` flags).

    Returns:
        ``{agent: SamplingParams}`` (no stop strings: the collector adds the env's).
    """
    import dataclasses

    ev = resolved.config.eval_sampling
    out = {}
    for name, agent in resolved.agents.items():
        own = agent.sampling.to_params()
        out[name] = dataclasses.replace(
            own,
            temperature=ev.temperature if temperature is None else temperature,
            top_p=ev.top_p if top_p is None else top_p,
            top_k=max(ev.top_k, 0),
            max_new_tokens=max_new_tokens or ev.max_new_tokens or own.max_new_tokens,
        )
    return out


def evaluate(
    collector: RolloutCollector,
    tasks: Sequence[Mapping[str, object]],
    *,
    k: int,
    sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
    seed_step: int = EVAL_SEED_STEP,
    tasks_per_batch: int = 8,
    progress: Callable[[int, int], object] | None = None,
    on_batch: Callable[[RolloutBatch], object] | None = None,
    exact: bool = True,
    on_exact: Callable[[ExactEvaluation], object] | None = None,
    opponents: Sequence[str] = (),
) -> dict[str, float]:
    """Run ``k`` episodes of every task and score them.

    Args:
        collector: a :class:`~mas_train.rollout.RolloutCollector` (its generators hold the policy to score).
        tasks: task rows.
        k: episodes per task (the ``k`` of avg@k / pass@k).
        sampling: sampling for every agent, or per agent (:func:`eval_sampling`); default: each agent's own
            training sampling. The env's stop strings are kept.
        seed_step: mixed into the env/sampling seeds (negative values keep eval seeds apart from training).
        tasks_per_batch: tasks collected together (bounds memory: ``tasks_per_batch * k`` episodes at once).
        progress: optional callable ``progress(done_tasks, total_tasks)``.
        on_batch: optional callable given each :class:`~mas_train.rollout.RolloutBatch` (``k`` episodes per
            task, task-major, in task order), e.g. :meth:`mas_train.episodes.EvalRecorder.add`.
        exact: also run the env's exact evaluation (:func:`exact_evaluation`; envs without one cost nothing).
        on_exact: optional callable given the env's :class:`~mas_envs.core.ExactEvaluation` when there is one
            (its artifacts, e.g. Kuhn poker's policy table, to write or print).
        opponents: scripted opponents (:func:`mas_envs.games.opponents.scripted_policy` specs) a game's learner
            also plays in every seat (:func:`versus`).

    Returns:
        Flat metrics: ``eval/avg@k``, ``eval/pass@k``, ``eval/<source>/avg@k``, ``eval/<source>/pass@k``,
        ``eval/reward``, ``eval/invalid_rate``, ``eval/invalid_rate/<agent>``, ``eval/env/<name>`` (the env's
        per-episode metrics, averaged), ``eval/num_tasks``, ``eval/seconds``; with an env's exact evaluation
        also its metrics as ``eval/<name>`` (e.g. ``eval/exploitability``) and ``eval/exact_seconds``.

    Raises:
        ValueError: no tasks, ``k < 1`` or ``tasks_per_batch < 1``.
    """
    from mas_train.metrics import env_metrics, pass_at_k_and_avg_at_k

    if not tasks:
        raise ValueError("evaluate needs at least one task")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if tasks_per_batch < 1:
        raise ValueError(f"tasks_per_batch must be >= 1, got {tasks_per_batch}")
    t0 = time.perf_counter()
    uids: list[str] = []
    succ: list[bool] = []
    sources: list[str] = []
    rewards: list[float] = []
    invalid: list[bool] = []
    invalid_by_agent: dict[str, list[bool]] = {}
    episode_metrics: list[Mapping[str, float]] = []
    for start in range(0, len(tasks), tasks_per_batch):
        chunk = tasks[start : start + tasks_per_batch]
        batch = collector.collect(
            chunk,
            k,
            sampling_override=sampling,
            uid_prefix=f"eval{start}/",
            seed_ids=eval_seed_ids(seed_step, start, len(chunk), k),
        )
        for t in batch.trajectories:
            uids.append(t.task_uid)
            succ.append(bool(t.success))
            sources.append(t.data_source)
            rewards.append(t.team_reward)
            episode_metrics.append(t.metrics)
        for smp in batch.samples:
            invalid.append(smp.invalid)
            invalid_by_agent.setdefault(smp.agent, []).append(smp.invalid)
        if on_batch is not None:
            on_batch(batch)
        if progress is not None:
            progress(min(start + tasks_per_batch, len(tasks)), len(tasks))
    out = {f"eval/{key}": v for key, v in pass_at_k_and_avg_at_k(uids, succ, sources, k=k).items()}
    out["eval/reward"] = float(np.mean(rewards))
    out["eval/invalid_rate"] = float(np.mean(invalid)) if invalid else 0.0
    for agent, flags in sorted(invalid_by_agent.items()):
        out[f"eval/invalid_rate/{agent}"] = float(np.mean(flags))
    out.update(env_metrics(episode_metrics, prefix="eval/env/"))
    out["eval/num_tasks"] = float(len(tasks))
    if opponents:
        out.update(
            versus(
                collector,
                tasks,
                opponents,
                k=k,
                sampling=sampling,
                seed_step=seed_step,
                tasks_per_batch=tasks_per_batch,
            )
        )
    if exact:
        t1 = time.perf_counter()
        found = exact_evaluation(collector)
        if found is not None:
            out.update({f"eval/{name}": float(v) for name, v in found.metrics.items()})
            out["eval/exact_seconds"] = time.perf_counter() - t1
            if on_exact is not None:
                on_exact(found)
    out["eval/seconds"] = time.perf_counter() - t0
    return out


def versus(
    collector: RolloutCollector,
    tasks: Sequence[Mapping[str, object]],
    opponents: Sequence[str],
    *,
    k: int,
    sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
    seed_step: int = EVAL_SEED_STEP,
    tasks_per_batch: int = 8,
) -> dict[str, float]:
    """The learner against fixed scripted opponents in a game: for each opponent spec and each seat, ``k``
    episodes of every task with the learner in that seat and the opponent (its own seeded policy per task) in
    the others.

    Returns:
        Per opponent, over all seats and episodes (each seat plays ``len(tasks) * k`` of them):
        ``eval/vs/<spec>/win``, ``/draw``, ``/loss`` (the learner seat's result, the env's ``<seat>/win``...
        metrics) and ``/return`` (its mean return, e.g. chips per hand in Kuhn poker).

    Raises:
        ValueError: the env is not a game, or a spec that is not one of its scripted opponents.
    """
    from mas_train.league import game_of
    from mas_train.opponents import ScriptedOpponent
    from mas_train.prompts import request_seed

    env = collector.text_env()
    game = game_of(env)
    if game is None:
        raise ValueError(f"{type(env).__name__} is not a game of mas_envs.games: it has no opponents to play")
    seats = list(env.possible_agents)
    out: dict[str, float] = {}
    for spec in opponents:
        found: dict[str, list[float]] = {"win": [], "draw": [], "loss": [], "return": []}
        for me in seats:
            for start in range(0, len(tasks), tasks_per_batch):

                def against(
                    t_idx: int, spec: str = spec, me: str = me, start: int = start
                ) -> dict[str, ScriptedOpponent]:
                    foe = ScriptedOpponent(
                        spec, game, request_seed(collector.seed, "versus", spec, me, start + t_idx)
                    )
                    return {s: foe for s in seats if s != me}

                chunk = tasks[start : start + tasks_per_batch]
                batch = collector.collect(
                    chunk,
                    k,
                    sampling_override=sampling,
                    uid_prefix=f"vs/{spec}/{me}/{start}/",
                    opponents=against,
                    seed_ids=eval_seed_ids(seed_step, start, len(chunk), k),
                )
                for t in batch.trajectories:
                    for key in ("win", "draw", "loss"):
                        found[key].append(float(t.metrics.get(f"{me}/{key}", 0.0)))
                    found["return"].append(float(t.agent_rewards.get(me, 0.0)))
        out.update({f"eval/vs/{spec}/{key}": float(np.mean(v)) for key, v in found.items()})
    return out


def exact_evaluation(collector: RolloutCollector) -> ExactEvaluation | None:
    """The env's exact evaluation (:meth:`~mas_envs.core.TextAECEnv.exact_evaluation`) of the collector's
    current policies, scored by :func:`score_replies` (each agent with its own model group's weights).

    Returns:
        The env's :class:`~mas_envs.core.ExactEvaluation`, or ``None``: the env has none (then nothing is
        scored), or an agent's model group cannot score given completions (a remote endpoint or engine: a
        ``UserWarning`` says so and nothing is logged).
    """
    from mas_envs.core import TextAECEnv

    env = collector.text_env()
    if type(env).exact_evaluation is TextAECEnv.exact_evaluation:
        return None
    cannot = [a for a in env.possible_agents if a in collector.agent_groups and not can_score(collector, a)]
    if cannot:
        warnings.warn(
            f"{type(env).__name__} has an exact evaluation, but the model groups of {cannot} cannot score given "
            "completions (only the hf backend can): it is skipped",
            stacklevel=2,
        )
        return None
    return env.exact_evaluation(functools.partial(score_replies, collector))


def can_score(collector: RolloutCollector, agent: str) -> bool:
    """Whether :func:`score_replies` works for ``agent``: its model group's generator scores given completions
    (:class:`~mas_train.backends.base.LogprobScorer`; the ``hf`` backend does)."""
    gen = collector.generators[collector.agent_groups[agent]]
    return isinstance(gen, LogprobScorer) and bool(gen.can_score)


def score_replies(
    collector: RolloutCollector,
    agent: str,
    prompts: Sequence[Sequence[Mapping[str, str]]],
    completions: Sequence[str],
) -> list[float]:
    """The total log-probability (natural log, summed over tokens, temperature 1) of each completion text as
    ``agent``'s reply to the matching prompt, under ``agent``'s model group's current weights (its own adapter
    under ``shared_lora``): with the collector bound, a :data:`mas_envs.core.Scorer`.

    Prompts are rendered as the collector renders them for sampling (:func:`~mas_train.rollout.render_prompt`); a
    completion is scored as a whole reply: the group tokenizer's encoding of its text and then EOS
    (:func:`~mas_train.move_choice.reply_ids`), as a sampled reply ends and as ``legal_moves_only`` plays it.

    Raises:
        KeyError: ``agent`` has no model group.
        TypeError: its generator cannot score (:func:`can_score` is false).
        ValueError: ``len(prompts) != len(completions)``.
    """
    from mas_train.move_choice import reply_ids
    from mas_train.rollout import render_prompt

    group = collector.agent_groups[agent]
    gen = collector.generators[group]
    if not isinstance(gen, LogprobScorer) or not gen.can_score:
        raise TypeError(
            f"model group {group!r} (agent {agent!r}) cannot score given completions; only hf can"
        )
    if len(prompts) != len(completions):
        raise ValueError(f"got {len(completions)} completions for {len(prompts)} prompts")
    tok = collector.tokenizers[group]
    ids = [render_prompt(tok, m) for m in prompts]
    comps = [reply_ids(tok, c) for c in completions]
    return [float(sum(row)) for row in gen.score(ids, comps)]


def write_artifacts(
    found: ExactEvaluation, folder: Path, *, prefix: str = "", suffix: str = ""
) -> dict[str, Path]:
    """Write each artifact of an exact evaluation to ``<folder>/<prefix><name><suffix>.json`` (indented JSON).

    Returns:
        ``{name: path written}``, in the artifacts' order.
    """
    import json

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, value in found.artifacts.items():
        path = paths[name] = folder / f"{prefix}{name}{suffix}.json"
        path.write_text(json.dumps(value, indent=1) + "\n")
    return paths

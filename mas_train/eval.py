"""Evaluation: k episodes per task, avg@k and pass@k per data source (Dr. MAS ``_validate``, digest §5.3).

avg@k is the mean success over the k episodes of a task, averaged over tasks; pass@k is the fraction of tasks
solved at least once in k episodes (the plain k-sample estimate, as the reference reports it).
:func:`evaluate` runs on any :class:`~mas_train.rollout.RolloutCollector`, so it scores the live policy during
training and a saved checkpoint or any model in ``mas-eval``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mas_train.backends.base import SamplingParams

__all__ = ["evaluate"]


def evaluate(
    collector: Any,
    tasks: Sequence[Mapping[str, Any]],
    *,
    k: int,
    sampling: SamplingParams | None = None,
    seed_step: int = -1,
    tasks_per_batch: int = 8,
    progress: Any = None,
) -> dict[str, float]:
    """Run ``k`` episodes of every task and score them.

    Args:
        collector: a :class:`~mas_train.rollout.RolloutCollector` (its generators hold the policy to score).
        tasks: task rows.
        k: episodes per task (the ``k`` of avg@k / pass@k).
        sampling: sampling for every agent (default: each agent's own); the env's stop strings are kept.
        seed_step: mixed into the env/sampling seeds (negative values keep eval seeds apart from training).
        tasks_per_batch: tasks collected together (bounds memory: ``tasks_per_batch * k`` episodes at once).
        progress: optional callable ``progress(done_tasks, total_tasks)``.

    Returns:
        Flat metrics: ``eval/avg@k``, ``eval/pass@k``, ``eval/<source>/avg@k``, ``eval/<source>/pass@k``,
        ``eval/reward``, ``eval/invalid_rate``, ``eval/num_tasks``, ``eval/seconds``.

    Raises:
        ValueError: no tasks or ``k < 1``.
    """
    from mas_train.metrics import pass_at_k_and_avg_at_k

    if not tasks:
        raise ValueError("evaluate needs at least one task")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    t0 = time.perf_counter()
    uids: list[str] = []
    succ: list[bool] = []
    sources: list[str] = []
    rewards: list[float] = []
    invalid: list[bool] = []
    for start in range(0, len(tasks), tasks_per_batch):
        chunk = tasks[start : start + tasks_per_batch]
        batch = collector.collect(
            chunk, k, step=seed_step * 100_003 - start, sampling_override=sampling, uid_prefix=f"eval{start}/"
        )
        for t in batch.trajectories:
            uids.append(t.task_uid)
            succ.append(bool(t.success))
            sources.append(t.data_source)
            rewards.append(t.team_reward)
        invalid.extend(s.invalid for s in batch.samples)
        if progress is not None:
            progress(min(start + tasks_per_batch, len(tasks)), len(tasks))
    out = {f"eval/{key}": v for key, v in pass_at_k_and_avg_at_k(uids, succ, sources, k=k).items()}
    out["eval/reward"] = float(np.mean(rewards))
    out["eval/invalid_rate"] = float(np.mean(invalid)) if invalid else 0.0
    out["eval/num_tasks"] = float(len(tasks))
    out["eval/seconds"] = time.perf_counter() - t0
    return out

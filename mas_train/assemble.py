"""Assembly of a run: the one place that builds a run's parts from its resolved config.

:func:`assemble` builds, in this order, the env factory and one probe env, the task sources (training rows;
evaluation rows, read on first use), the worker pool (which loads each model group's policy and generation
backend) and the rollout collector over the pool's workers. :func:`assemble_trainer` hands those parts to a
:class:`~mas_train.trainer.MultiGroupTrainer`, which builds none of its own. ``mas-train`` (through
:func:`mas_train.run.train`, and so ``mas-compare``, which trains with it) and ``mas-eval`` both assemble here;
whatever a caller already has (start-up's probe env and task rows, a test's env) it passes in, and only the
rest is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mas_envs.core import EnvFactory
from mas_train import tasks
from mas_train.hosting.pools import LocalPool, make_pool
from mas_train.hosting.protocols import WorkerPool
from mas_train.rollout import RolloutCollector
from mas_train.startup import make_env_factory

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from mas_train.config import ResolvedConfig
    from mas_train.trainer import MultiGroupTrainer

__all__ = ["RunParts", "assemble", "assemble_trainer"]


@dataclass
class RunParts:
    """A run's parts, built by :func:`assemble` (every one started and ready).

    Attributes:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig`.
        env_factory: zero-argument constructor of the run's env.
        probe: one env made by ``env_factory`` (its task list, penalty and contract are read from it).
        train_tasks: training rows (empty for an evaluation-only assembly).
        eval_tasks: the evaluation rows, cut to ``eval_num_tasks``, read on the first call and kept.
        pool: the started worker pool (one worker per model group: policy and generation backend).
        collector: the rollout collector over the pool's workers and tokenizers.
    """

    resolved: ResolvedConfig
    env_factory: EnvFactory
    probe: AECEnv[str, str, str]
    train_tasks: list[dict[str, object]]
    eval_tasks: Callable[[], list[dict[str, object]]]
    pool: WorkerPool
    collector: RolloutCollector

    def close(self) -> None:
        """Close the collector's envs and shut the pool down."""
        try:
            self.collector.close()
        finally:
            self.pool.shutdown()


def _cached(load: Callable[[], list[dict[str, object]]]) -> Callable[[], list[dict[str, object]]]:
    rows: list[list[dict[str, object]]] = []

    def get() -> list[dict[str, object]]:
        if not rows:
            rows.append(load())
        return rows[0]

    return get


def assemble(
    resolved: ResolvedConfig,
    *,
    env_factory: EnvFactory | None = None,
    probe: AECEnv[str, str, str] | None = None,
    train_tasks: Sequence[Mapping[str, object]] | None = None,
    eval_tasks: Sequence[Mapping[str, object]] | None = None,
    pool: WorkerPool | None = None,
    train: bool = True,
) -> RunParts:
    """Build a run's parts (see the module docstring); the pool is started (models load here).

    Args:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig`.
        env_factory: default ``mas_envs.make(config.env, **env kwargs)``.
        probe: an env made by ``env_factory`` (start-up's); default: one is made here.
        train_tasks: default :func:`mas_train.tasks.train_tasks` (with ``train``; none without).
        eval_tasks: default :func:`mas_train.tasks.eval_tasks` cut to ``eval_num_tasks``, read on first use.
        pool: default :func:`mas_train.hosting.pools.make_pool` with ``train``; without it every group in
            this process, generation only (``mas-eval``).
        train: assemble for training (``True``) or for evaluation only.

    Raises:
        NoEvalTasksError: (on the first ``eval_tasks()`` call) no evaluation set is known.
        ValueError, FileNotFoundError: a task source cannot be read.
    """
    cfg = resolved.config
    env_factory = env_factory or make_env_factory(cfg)
    probe = probe if probe is not None else env_factory()
    rows = [dict(t) for t in train_tasks] if train_tasks is not None else None
    if rows is None:
        rows = tasks.train_tasks(cfg, probe) if train else []
    if eval_tasks is not None:
        given = [dict(t) for t in eval_tasks]
        eval_rows = _cached(lambda: given)
    else:
        eval_rows = _cached(lambda: tasks.eval_tasks(cfg, probe, limit=cfg.eval_num_tasks))
    pool = pool if pool is not None else (make_pool(resolved) if train else LocalPool(resolved, train=False))
    pool.start()
    try:
        groups = list(resolved.model_groups)
        collector = RolloutCollector(
            env_factory,
            generators={g: pool.worker(g) for g in groups},
            tokenizers={g: pool.tokenizer(g) for g in groups},
            agent_groups=resolved.agent_to_group,
            sampling={a: ra.sampling_params() for a, ra in resolved.agents.items()},
            max_prompt_length=cfg.max_prompt_length,
            seed=cfg.seed,
            legal_moves_only=cfg.legal_moves_only,
        )
    except BaseException:
        pool.shutdown()
        raise
    return RunParts(resolved, env_factory, probe, rows, eval_rows, pool, collector)


def assemble_trainer(
    resolved: ResolvedConfig,
    *,
    env_factory: EnvFactory | None = None,
    probe: AECEnv[str, str, str] | None = None,
    train_tasks: Sequence[Mapping[str, object]] | None = None,
    eval_tasks: Sequence[Mapping[str, object]] | None = None,
    pool: WorkerPool | None = None,
) -> MultiGroupTrainer:
    """A :class:`~mas_train.trainer.MultiGroupTrainer` on the parts :func:`assemble` builds for training (the
    arguments are :func:`assemble`'s)."""
    from mas_train.trainer import MultiGroupTrainer

    parts = assemble(
        resolved,
        env_factory=env_factory,
        probe=probe,
        train_tasks=train_tasks,
        eval_tasks=eval_tasks,
        pool=pool,
        train=True,
    )
    try:
        return MultiGroupTrainer(parts)
    except BaseException:
        parts.close()
        raise

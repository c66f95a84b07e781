"""The tasks of a run: which rows train and evaluate, and the order training visits them.

:func:`train_tasks` and :func:`eval_tasks` are the one place a run's task sources are resolved (the trainer,
``mas-eval`` and the start-up checks all call them):

* training: ``train_data`` if set, else the env's own task list (its ``default_tasks`` or ``tasks=`` kwarg);
* evaluation: ``eval_data`` if set, else the env's own evaluation set (``TextAECEnv.eval_task_source``: its
  ``default_eval_tasks``, or the ``-test`` twin of a bundled ``-train`` set, ``gsm8k-train`` → ``gsm8k-test``).

A source is anything :func:`mas_envs.data.load_tasks` reads: a bundled set name, a file, or a procedural spec.
:class:`TaskSampler` fixes the training order so that a resumed run draws exactly the batches an uninterrupted
run would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from mas_envs.core import text_env
from mas_train.config.common import ConfigError

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from mas_train.config.train import TrainConfig

__all__ = ["NoEvalTasksError", "TaskSampler", "eval_source", "eval_tasks", "train_tasks"]


class NoEvalTasksError(ConfigError):
    """Evaluation is on but neither the config nor the env names an evaluation set (a user mistake: a
    :class:`~mas_train.config.ConfigError`, printed as one line)."""


def _load(source: str, fields: Mapping[str, str] | None) -> list[dict[str, object]]:
    from mas_envs.data import load_tasks

    return list(load_tasks(source, fields=dict(fields) if fields else None))


def train_tasks(cfg: TrainConfig, env: AECEnv[str, str, str]) -> list[dict[str, object]]:
    """Training rows of ``cfg`` (a ``TrainConfig``) for ``env`` (a made env, wrapped or not).

    Raises:
        ValueError, FileNotFoundError: the source cannot be read or holds no usable row.
    """
    if cfg.train_data is not None:
        return _load(cfg.train_data, cfg.data_fields)
    return [dict(t) for t in text_env(env).tasks]


def eval_source(cfg: TrainConfig, env: AECEnv[str, str, str]) -> str | None:
    """The evaluation source of ``cfg`` for ``env``: ``eval_data``, else the env's own
    (``TextAECEnv.eval_task_source``), else ``None``."""
    if cfg.eval_data is not None:
        return cfg.eval_data
    return text_env(env).eval_task_source()


def eval_tasks(
    cfg: TrainConfig, env: AECEnv[str, str, str], *, limit: int | None = None
) -> list[dict[str, object]]:
    """Evaluation rows (the first ``limit`` when given).

    Raises:
        NoEvalTasksError: no evaluation set is known (and the env's tasks are not starting positions,
            ``TextAECEnv.eval_plays_train_tasks``); the message says to set ``eval_data`` or turn evaluation off.
        ValueError, FileNotFoundError: the source cannot be read or holds no usable row.
    """
    src = eval_source(cfg, env)
    if src is None and text_env(env).eval_plays_train_tasks:
        rows = [dict(t) for t in text_env(env).tasks]  # a game's deals: evaluation plays the training tasks
        return rows[:limit] if limit else rows
    if src is None:
        raise NoEvalTasksError(
            f"env {cfg.env!r} has no evaluation set: set eval_data (a bundled set name, a file or a "
            "procedural spec), or eval_steps: 0 to train without evaluation"
        )
    rows = _load(src, cfg.data_fields)
    if not rows:
        raise NoEvalTasksError(f"eval_data {src!r} holds no tasks")
    return rows[:limit] if limit else rows


class TaskSampler:
    """Deterministic task order: epoch ``e`` visits the tasks in ``permutation(seed, e)`` order.

    The whole state is the number of tasks consumed, so a checkpoint stores one integer and a resumed run
    draws exactly the batches an uninterrupted run would.

    Args:
        tasks: task rows (non-empty).
        seed: shuffling seed.
        shuffle: ``False`` keeps the file order.

    Raises:
        ValueError: no tasks.
    """

    def __init__(self, tasks: Sequence[Mapping[str, object]], seed: int = 0, *, shuffle: bool = True) -> None:
        if not tasks:
            raise ValueError("no training tasks: check train_data (or the env's default task list)")
        self.tasks = list(tasks)
        self.seed = seed
        self.shuffle = shuffle
        self.consumed = 0
        self._order: tuple[int, np.ndarray] | None = None

    def _perm(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            n = len(self.tasks)
            perm = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order = (epoch, perm)
        return self._order[1]

    def index_at(self, position: int) -> int:
        """The task index visited at ``position`` (0-based, counting across epochs) of the data order."""
        epoch, pos = divmod(position, len(self.tasks))
        return int(self._perm(epoch)[pos])

    def next(self, n: int) -> list[dict[str, object]]:
        """The next ``n`` tasks (crossing into the next epoch when needed)."""
        out = []
        for _ in range(n):
            epoch, pos = divmod(self.consumed, len(self.tasks))
            out.append(dict(self.tasks[int(self._perm(epoch)[pos])]))
            self.consumed += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed, "seed": self.seed, "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore the position.

        Raises:
            ValueError: the saved sampler had another seed or task count (different data).
        """
        if int(state["seed"]) != self.seed or int(state["num_tasks"]) != len(self.tasks):
            raise ValueError(
                f"the checkpoint's data order (seed {state['seed']}, {state['num_tasks']} tasks) differs from this "
                f"run's (seed {self.seed}, {len(self.tasks)} tasks); resume with the same seed and train_data"
            )
        self.consumed = int(state["consumed"])

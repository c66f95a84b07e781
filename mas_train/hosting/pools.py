"""Where model-group workers live.

A pool starts one :class:`~mas_train.hosting.worker.ModelGroupWorker` per model group and hands out
:class:`~mas_train.hosting.protocols.WorkerHandle` objects whose methods return plain data. :class:`LocalPool`
(the default, ``pool: local``) keeps every worker in this process; :class:`~mas_train.hosting.ray_pool.RayPool`
(``pool: ray``) places each worker in an actor with the CPUs/GPUs its group asks for. Both follow
:class:`~mas_train.hosting.protocols.WorkerPool`, the only interface the trainer uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mas_train.hosting.protocols import WorkerPool
from mas_train.hosting.worker import ModelGroupWorker

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from mas_train.config import ResolvedConfig

__all__ = ["LocalPool", "make_pool"]


class LocalPool:
    """All model groups in this process (CPU runs, one-GPU runs, tests).

    With ``model_sharing: shared_lora`` the base group's worker (the first group) loads the base model and
    every other group adds its LoRA adapter to that same ``PeftModel``: one copy of the base weights.

    Args:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig`.
        train: forwarded to each worker (``False``: generation only, as ``mas-eval`` needs).
    """

    def __init__(self, resolved: ResolvedConfig, *, train: bool | None = None) -> None:
        self.resolved = resolved
        self.train = train
        self._workers: dict[str, ModelGroupWorker] = {}

    @property
    def groups(self) -> list[str]:
        return list(self.resolved.model_groups)

    def start(self) -> LocalPool:
        """Load every group's model, trainer and backend. Returns ``self``."""
        for g in self.groups:
            if g not in self._workers:
                # model_sharing shared_lora: one PeftModel (the base group's) carries every group's adapter
                base = self.resolved.model_groups[g].base_group
                shared = self._workers[base].policy.shared_base if base not in (None, g) else None
                self._workers[g] = ModelGroupWorker(self.resolved, g, train=self.train, shared_model=shared)
        return self

    def worker(self, group: str) -> ModelGroupWorker:
        """The worker of ``group``.

        Raises:
            KeyError: unknown group, or :meth:`start` was not called.
        """
        if group not in self._workers:
            raise KeyError(
                f"no worker for model group {group!r}; groups: {self.groups}"
                + ("" if self._workers else " (call start() first)")
            )
        return self._workers[group]

    def tokenizer(self, group: str) -> PreTrainedTokenizerBase:
        return self.worker(group).tokenizer

    def shutdown(self) -> None:
        for w in self._workers.values():
            w.close()
        self._workers.clear()


def make_pool(resolved: ResolvedConfig) -> WorkerPool:
    """The pool ``resolved.config.pool`` names: ``local`` (:class:`LocalPool`) or ``ray``
    (:class:`~mas_train.hosting.ray_pool.RayPool`; Ray itself is imported only when it starts).

    Raises:
        ValueError: an unknown pool.
    """
    kind = resolved.config.pool
    if kind == "local":
        return LocalPool(resolved)
    if kind == "ray":
        from mas_train.hosting.ray_pool import RayPool

        return RayPool(resolved)
    raise ValueError(f"unknown pool {kind!r}; use 'local' or 'ray'")

"""Where model-group workers live.

A pool starts one :class:`~mas_train.worker.ModelGroupWorker` per model group and hands out handles whose
methods return plain data. :class:`LocalPool` (the default, ``pool: local``) keeps every worker in this
process; a Ray pool (``pool: ray``) places each worker in an actor with the CPUs/GPUs its group asks for. The
trainer only uses the interface below, so the pool can change without touching it:

* ``start()``: create the workers (loads models; call once).
* ``groups``: model group names, in config order.
* ``worker(group)``: the handle (a :class:`~mas_train.worker.ModelGroupWorker` or a stand-in for one); ``handle.generate(...)``, ``handle.update(...)``, ``handle.sync_weights()``,
  ``handle.save(folder)``, ``handle.load(folder)`` return results synchronously; ``handle.num_parameters`` and
  ``handle.weight_version`` are plain ints (the trainer reads them, e.g. to turn per-agent grad norms on).
* ``tokenizer(group)``: the group's tokenizer, in the driver process (the collector renders prompts with it).
* ``shutdown()``: release every worker. Idempotent.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LocalPool", "make_pool"]


class LocalPool:
    """All model groups in this process (CPU runs, one-GPU runs, tests).

    With ``model_sharing: shared_lora`` the base group's worker (the first group) loads the base model and
    every other group adds its LoRA adapter to that same ``PeftModel``: one copy of the base weights.

    Args:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig`.
        train: forwarded to each worker (``False``: generation only, as ``mas-eval`` needs).
    """

    def __init__(self, resolved: Any, *, train: bool | None = None) -> None:
        self.resolved = resolved
        self.train = train
        self._workers: dict[str, Any] = {}

    @property
    def groups(self) -> list[str]:
        return list(self.resolved.model_groups)

    def start(self) -> LocalPool:
        """Load every group's model, trainer and backend. Returns ``self``."""
        from mas_train.worker import ModelGroupWorker

        for g in self.groups:
            if g not in self._workers:
                # model_sharing shared_lora: one PeftModel (the base group's) carries every group's adapter
                base = getattr(self.resolved.model_groups[g], "base_group", None)
                shared = self._workers[base].peft_model if base not in (None, g) else None
                self._workers[g] = ModelGroupWorker(self.resolved, g, train=self.train, shared_model=shared)
        return self

    def worker(self, group: str) -> Any:
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

    def tokenizer(self, group: str) -> Any:
        return self.worker(group).tokenizer

    def shutdown(self) -> None:
        for w in self._workers.values():
            w.close()
        self._workers.clear()


def make_pool(resolved: Any) -> Any:
    """The pool ``resolved.config.pool`` names: ``local`` (:class:`LocalPool`) or ``ray``
    (:class:`~mas_train.ray_pool.RayPool`; Ray itself is imported only when it starts).

    Raises:
        ValueError: an unknown pool.
    """
    kind = resolved.config.pool
    if kind == "local":
        return LocalPool(resolved)
    if kind == "ray":
        from mas_train.ray_pool import RayPool

        return RayPool(resolved)
    raise ValueError(f"unknown pool {kind!r}; use 'local' or 'ray'")

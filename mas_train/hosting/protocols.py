"""What the training loop sees of a model group and of the pool that hosts the groups.

:class:`WorkerHandle` is the contract of :class:`~mas_train.hosting.worker.ModelGroupWorker` (in-process) and of
:class:`~mas_train.hosting.ray_worker.RayWorkerHandle` (the driver's stand-in for a worker in a Ray actor); it
extends the collector's :class:`~mas_train.backends.base.Generator` (generation and its optional capabilities) with the
update, the weight sync and checkpoints. :class:`WorkerPool` is the contract of
:class:`~mas_train.hosting.pools.LocalPool` and :class:`~mas_train.hosting.ray_pool.RayPool`. The type checker
holds both implementations to these protocols (``tests/test_layout.py`` runs it in CI).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypedDict, runtime_checkable

from mas_train.backends.base import Generator
from mas_train.samples import Sample

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["RankInfo", "Ranks", "WorkerHandle", "WorkerPool"]


class RankInfo(TypedDict, total=False):
    """Where one rank of a sharded group runs (``Ranks.info()``, rank 0 first): ``rank``, ``pid``, ``node``;
    under Ray also ``ppid``, ``actor_id``, ``name``, ``bundle`` (its placement-group bundle, as Ray reports it)
    and ``cuda_visible_devices``."""

    rank: int
    pid: int
    ppid: int
    node: str
    actor_id: str | None
    name: str
    bundle: object
    cuda_visible_devices: str | None


@runtime_checkable
class WorkerHandle(Generator, Protocol):
    """One model group as the trainer drives it. Every method returns plain data, synchronously.

    Attributes:
        group: the model group's name; agents: the agents it acts for.
        tokenizer: the group's tokenizer (the collector renders prompts with it in the driver).
        model_path: the folder or hub id of its weights.
        num_parameters: trainable parameters (0 when it does not train).
        trains: whether :meth:`update` may be called.
    """

    group: str
    agents: tuple[str, ...]
    tokenizer: PreTrainedTokenizerBase
    model_path: str
    num_parameters: int
    trains: bool

    @property
    def usage(self) -> dict[str, float]:
        """The backend's request and token counters (remote endpoints); empty when it keeps none."""
        ...

    def update(
        self, samples: Sequence[Sample], advantages: Sequence[float], *, agent_grad_norms: bool = False
    ) -> dict[str, float]:
        """One GRPO update on the group's samples (one advantage each); returns plain-float metrics."""
        ...

    def sync_weights(self) -> int:
        """Push the policy's weights to the backend; returns the new ``weight_version``."""
        ...

    def save(self, folder: str) -> None:
        """Write the group's checkpoint folder."""
        ...

    def load(self, folder: str) -> None:
        """Restore a checkpoint folder (weights, optimizer, step) and sync the backend."""
        ...

    def load_weights(self, folder: str) -> None:
        """Load a checkpoint folder's weights only (``mas-eval``) and sync the backend."""
        ...

    def close(self) -> None:
        """Release the backend and whatever hosts the policy."""
        ...


class Ranks(Protocol):
    """The N rank processes of one sharded model group (:class:`~mas_train.hosting.sharded.ShardedRanks`, local
    processes; :class:`~mas_train.hosting.sharded_ray.RayRanks`, Ray actors), as its
    :class:`~mas_train.hosting.sharded.ShardedPolicy` drives them. Every method blocks until each rank answered."""

    num_ranks: int

    def start(self) -> Ranks: ...

    def info(self) -> list[RankInfo]: ...

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]: ...

    def sizes(self) -> list[dict[str, int]]: ...

    def full_state_dict(self) -> dict[str, torch.Tensor]: ...

    def save(self, folder: str) -> int: ...

    def load(self, folder: str, *, optimizer: bool, global_step: int = 0) -> None: ...

    def close(self, *, force: bool = False) -> None: ...


class WorkerPool(Protocol):
    """Where the model groups' workers live: ``start()`` loads them (once), ``worker(group)`` hands out a
    :class:`WorkerHandle`, ``tokenizer(group)`` gives the group's tokenizer in the driver, ``shutdown()``
    releases everything (idempotent)."""

    @property
    def groups(self) -> list[str]:
        """Model group names, in config order."""
        ...

    def start(self) -> WorkerPool: ...

    def worker(self, group: str) -> WorkerHandle: ...

    def tokenizer(self, group: str) -> PreTrainedTokenizerBase: ...

    def shutdown(self) -> None: ...

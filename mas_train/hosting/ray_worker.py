"""One model group's worker in a Ray actor (``pool: ray``), both sides of it.

:class:`ModelGroupActor` is the actor body: a :class:`~mas_train.hosting.worker.ModelGroupWorker` built inside
the actor, and generic call/get. :class:`RayWorkerHandle` is the driver's stand-in for it, each method a
blocking remote call bounded by the pool's ``call_timeout_s`` (:func:`bounded_get`). :func:`parameter_fingerprint`
lets the driver compare a group's weights without moving them. Placement and the actors' start-up are
:class:`~mas_train.hosting.ray_pool.RayPool`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

if TYPE_CHECKING:
    import torch
    from ray.actor import ActorHandle
    from transformers import PreTrainedTokenizerBase

    from mas_train.backends.base import GenerationOutput, SamplingParams
    from mas_train.config import ResolvedConfig
    from mas_train.samples import Sample

__all__ = ["ModelGroupActor", "PoolTimeouts", "RayWorkerHandle", "bounded_get", "parameter_fingerprint"]


#: :func:`parameter_fingerprint`'s result: ``sha256`` (str), ``sum`` and ``abs_sum`` (float), ``numel`` (int).
Fingerprint = dict[str, float | int | str]


class WorkerInfo(TypedDict):
    """What a worker actor reports once started (:meth:`ModelGroupActor.info`); its handle keeps it."""

    pid: int
    node: str
    tokenizer: PreTrainedTokenizerBase
    num_parameters: int
    model_path: str
    agents: tuple[str, ...]
    wants_messages: bool
    can_score: bool
    trains: bool
    cuda_visible_devices: str | None


def parameter_fingerprint(model: torch.nn.Module) -> Fingerprint:
    """A fingerprint of a model's weights: ``sha256`` of every parameter's bytes (in ``named_parameters``
    order; equal iff bit-identical), ``sum`` and ``abs_sum`` in float64 (for tolerance comparisons) and the
    parameter count ``numel``."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    total = abs_total = 0.0
    numel = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = p.detach().to("cpu").contiguous()
            digest.update(name.encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            t64 = t.double()
            total += float(t64.sum())
            abs_total += float(t64.abs().sum())
            numel += t.numel()
    return {"sha256": digest.hexdigest(), "sum": total, "abs_sum": abs_total, "numel": numel}


def bounded_get(ref: Any, what: str, timeout: float) -> Any:
    """``ray.get(ref)`` within ``timeout`` seconds; ``what`` names the call in errors (``"<group>.<method>"``).

    Raises:
        TimeoutError: no answer within ``timeout`` seconds.
        RuntimeError: the actor died (e.g. out of memory); the Ray error is chained.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        return ray.get(ref, timeout=timeout)
    except GetTimeoutError as e:
        raise TimeoutError(
            f"Ray worker call {what} did not finish within {timeout:.0f}s (raise MAS_RAY_CALL_TIMEOUT / "
            "MAS_RAY_START_TIMEOUT if the model is large)"
        ) from e
    except RayActorError as e:
        raise RuntimeError(f"the Ray actor of {what.split('.')[0]} died during {what}: {e}") from e


class ModelGroupActor:
    """The Ray actor body: a :class:`~mas_train.hosting.worker.ModelGroupWorker` plus generic call/get."""

    def __init__(
        self,
        resolved: ResolvedConfig,
        group: str,
        cwd: str,
        num_threads: int,
        ranks: dict[str, Any] | None = None,
    ) -> None:
        import functools

        import torch

        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative run folders resolve as in the driver (same node or shared filesystem)
        torch.set_num_threads(num_threads)
        from mas_train.hosting.worker import ModelGroupWorker

        make_ranks = None
        if ranks is not None:  # a sharded group: its ranks are actors in their own bundles (RayRanks)
            from mas_train.hosting.sharded_ray import RayRanks

            make_ranks = functools.partial(RayRanks, **ranks)
        self.worker = ModelGroupWorker(resolved, group, make_ranks=make_ranks)

    def info(self) -> WorkerInfo:
        w = self.worker
        return {
            "pid": os.getpid(),
            "node": os.uname().nodename,
            "tokenizer": w.tokenizer,
            "num_parameters": w.num_parameters,
            "model_path": w.model_path,
            "agents": tuple(w.agents),
            "wants_messages": w.wants_messages,
            "can_score": w.can_score,
            "trains": w.trains,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def fingerprint(self) -> Fingerprint:
        return parameter_fingerprint(self.worker.model)

    def get(self, attr: str) -> Any:
        return getattr(self.worker, attr)


class PoolTimeouts(Protocol):
    """What a :class:`RayWorkerHandle` reads from its pool (:class:`~mas_train.hosting.ray_pool.RayPool`): the
    seconds one remote call may take, read at every call."""

    call_timeout_s: float


class RayWorkerHandle:
    """Driver-side stand-in for one group's :class:`~mas_train.hosting.worker.ModelGroupWorker` in a Ray actor.

    A :class:`~mas_train.hosting.protocols.WorkerHandle` like the worker itself (the type checker holds both
    to it): each method a blocking remote call bounded by ``call_timeout_s``. Paths given to ``save``/``load`` are made absolute in
    the driver first.

    Raises (from every call):
        TimeoutError: no answer within ``call_timeout_s`` (names the group and the method).
        RuntimeError: the actor died (e.g. out of memory); the Ray error is chained.
    """

    def __init__(self, pool: PoolTimeouts, group: str, actor: ActorHandle, info: WorkerInfo) -> None:
        self._pool = pool
        self.group = group
        self.actor = actor
        self.tokenizer = info["tokenizer"]
        self.num_parameters = int(info["num_parameters"])
        self.model_path = info["model_path"]
        self.agents = tuple(info["agents"])
        self.pid = int(info["pid"])
        self.node = info["node"]
        self.wants_messages = bool(info["wants_messages"])
        self.can_score = bool(info["can_score"])
        self.trains = bool(info["trains"])
        # Each group's worker is an actor of its own with its own model: rows of two groups never share a call.
        self.mixed_batch_key: int | None = None

    def _get(self, ref: Any, what: str) -> Any:
        return bounded_get(ref, what, self._pool.call_timeout_s)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._get(self.actor.call.remote(method, *args, **kwargs), f"{self.group}.{method}")

    @property
    def weight_version(self) -> int:
        return int(self._get(self.actor.get.remote("weight_version"), f"{self.group}.weight_version"))

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[GenerationOutput]:
        outs: list[GenerationOutput] = self._call("generate", prompt_ids, sampling)
        return outs

    def generate_messages(
        self,
        messages: Sequence[Sequence[Mapping[str, str]]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        outs: list[GenerationOutput] = self._call("generate_messages", messages, sampling)
        return outs

    def generate_mixed(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
        workers: Sequence[object],
    ) -> list[GenerationOutput]:
        """Never possible across actors (:attr:`mixed_batch_key` is ``None``).

        Raises:
            ValueError: always; call :meth:`generate` per group.
        """
        raise ValueError(
            f"model group {self.group!r} lives in its own Ray actor; generate each group's rows with generate()"
        )

    def score(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """The worker's ``score`` (:meth:`~mas_train.hosting.worker.ModelGroupWorker.score`)."""
        outs: list[list[float]] = self._call("score", prompt_ids, completion_ids)
        return outs

    @property
    def usage(self) -> dict[str, float]:
        return dict(self._get(self.actor.get.remote("usage"), f"{self.group}.usage"))

    def update(
        self, samples: Sequence[Sample], advantages: Sequence[float], *, agent_grad_norms: bool = False
    ) -> dict[str, float]:
        metrics: dict[str, float] = self._call(
            "update", samples, advantages, agent_grad_norms=agent_grad_norms
        )
        return metrics

    def sync_weights(self) -> int:
        return int(self._call("sync_weights"))

    def save(self, folder: str) -> None:
        self._call("save", str(Path(folder).resolve()))

    def load(self, folder: str) -> None:
        self._call("load", str(Path(folder).resolve()))

    def load_weights(self, folder: str) -> None:
        self._call("load_weights", str(Path(folder).resolve()))

    def fingerprint(self) -> Fingerprint:
        """:func:`parameter_fingerprint` of this group's policy, computed in the actor (no weights travel)."""
        fp: Fingerprint = self._get(self.actor.fingerprint.remote(), f"{self.group}.fingerprint")
        return fp

    def close(self) -> None:
        self._call("close")

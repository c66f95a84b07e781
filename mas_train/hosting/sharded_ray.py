"""``pool: ray`` ranks of a sharded model group: :class:`RayRanks` runs the N ranks of
:mod:`mas_train.hosting.sharded` as N Ray actors, rank r pinned to the group's r-th rank bundle of the run's placement
group (:func:`~mas_train.hosting.ray_pool.bundle_layout`), with the interface of
:class:`~mas_train.hosting.sharded.ShardedRanks` (the local processes of ``pool: local``). Each actor's body is the same
:class:`~mas_train.hosting.sharded_rank.Rank`; the ranks meet at ``tcp://<rank 0's node IP>:<a port free there>``. A rank
actor that is gone (``ActorDiedError``) or raised fails the call with :class:`~mas_train.hosting.sharded.RankFailure`
naming the group and the rank, and every rank actor is then killed (``ray.kill``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from mas_train.hosting.protocols import RankInfo
from mas_train.hosting.sharded_rank import DEFAULT_TIMEOUT_S, Rank, RankFailure
from mas_train.net import free_port

if TYPE_CHECKING:
    from mas_train.config import ResolvedConfig
    from mas_train.samples import Sample

__all__ = ["RayRanks"]

logger = logging.getLogger(__name__)


def _bundle_index() -> int | None:
    """The placement-group bundle this Ray actor runs in, read from the resources Ray assigned it (named
    ``CPU_group_<bundle>_<placement group id>``: Ray has no public call naming the bundle); ``None`` outside
    an indexed bundle."""
    import re

    import ray

    try:
        ids = ray.get_runtime_context().worker.core_worker.resource_ids()
    except Exception:  # noqa: BLE001 - a diagnostic only: an internal API that may change
        return None
    for key in ids:
        m = re.fullmatch(r"(.+)_group_(\d+)_([0-9a-zA-Z]+)", key)
        if m and m.group(1) != "bundle":
            return int(m.group(2))
    return None


class _RankActor:
    """The Ray actor body of one rank: a :class:`Rank`, built by :meth:`setup` once rank 0's address is known
    (:meth:`address` on rank 0's actor), then driven by :meth:`call` with :class:`Rank`'s method names."""

    def __init__(self, cwd: str, num_threads: int) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths resolve as in the worker (same node or shared filesystem)
        torch.set_num_threads(num_threads)
        self.rank: Rank | None = None

    def info(self) -> RankInfo:
        import ray

        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "node": ray.util.get_node_ip_address(),
            "actor_id": ray.get_runtime_context().get_actor_id(),
            "bundle": _bundle_index(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def address(self) -> str:
        """The process group's ``init_method``: this node's IP and a port free on it (asked of rank 0)."""
        import ray

        ip = ray.util.get_node_ip_address()
        host = f"[{ip}]" if ":" in ip else ip
        return f"tcp://{host}:{free_port(ip)}"

    def setup(
        self,
        resolved: ResolvedConfig,
        group: str,
        rank: int,
        world: int,
        init_method: str,
        timeout_s: float,
        gpu: int | None,
    ) -> None:
        self.rank = Rank(resolved, group, rank, world, init_method, timeout_s, gpu=gpu)

    def call(self, cmd: str, *args: object) -> object:
        return getattr(self.rank, cmd)(*args)

    def close(self) -> None:
        if self.rank is not None:
            self.rank.close()


class RayRanks:
    """The N ranks of one sharded model group as N Ray actors (``pool: ray``), rank r pinned to bundle
    ``bundle_indices[r]`` of the run's placement group, so a group's ranks can span GPUs and nodes. The same
    interface as :class:`ShardedRanks` (``start``, ``call``, ``update``, ``sizes``, ``full_state_dict``,
    ``save``, ``load``, ``close``, ``pids``, ``num_ranks``); each actor runs a :class:`Rank`.

    The process group (NCCL when the ranks have GPUs, gloo on CPU) meets at ``tcp://<rank 0's node IP>:<a port
    free there>``, both asked of rank 0's actor before any rank joins.

    Args:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig` (sent to each rank; must pickle).
        group: the model group; ``resolved.model_groups[group].num_ranks`` rank actors are started.
        placement_group: the run's Ray placement group (:class:`~mas_train.hosting.ray_pool.RayPool`'s).
        bundle_indices: the group's rank bundles in it, rank 0 first (one per rank,
            :func:`~mas_train.hosting.ray_pool.bundle_layout`).
        resources: each rank actor's reservation, ``{"CPU": cpus, "GPU": gpus}`` (a rank bundle's); with a GPU
            the rank trains on it (Ray makes it the actor's ``cuda:0``).
        env_vars: the rank actors' environment variables (the pool passes the worker's: offline hub, cache,
            ``OMP_NUM_THREADS``).
        timeout_s: deadline of start-up (scheduling, model load, sharding) and of every collective, seconds.
        call_timeout_s: deadline of one call (an update, a save) once started, seconds.

    Every method blocks until each rank has answered and raises :class:`RankFailure` naming the group and the
    rank that died (its actor is gone: ``ActorDiedError``, e.g. ``ray.kill`` or out of memory), raised, or did
    not answer in time; every rank actor is then killed (``ray.kill``) and the object is closed. The actors are
    owned by the worker's actor, so Ray also kills them if that actor dies.
    """

    def __init__(
        self,
        resolved: ResolvedConfig,
        group: str,
        *,
        placement_group: Any,
        bundle_indices: list[int],
        resources: dict[str, float] | None = None,
        env_vars: dict[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        call_timeout_s: float = 3600.0,
    ) -> None:
        g = resolved.model_groups[group]
        if g.sharding != "fsdp2":
            raise ValueError(f"model group {group!r}: sharding {g.sharding!r} is not implemented; use fsdp2")
        self.num_ranks = int(g.num_ranks)
        if len(bundle_indices) != self.num_ranks:
            raise ValueError(
                f"model group {group!r}: {len(bundle_indices)} rank bundles for num_ranks = {self.num_ranks}"
            )
        self.resolved = resolved
        self.group = group
        self.placement_group = placement_group
        self.bundle_indices = [int(i) for i in bundle_indices]
        self.resources = dict(resources or {"CPU": 1.0})
        self.env_vars = dict(env_vars or {})
        self.timeout_s = float(timeout_s)
        self.call_timeout_s = float(call_timeout_s)
        self._actors: list[Any] = []
        self._names: list[str] = []
        self._start_refs: list[Any] = []
        self._info: list[RankInfo] = []
        self._ready = False

    @property
    def pids(self) -> list[int]:
        """The rank actors' process ids, rank 0 first (waits for start-up)."""
        return [i["pid"] for i in self.info()]

    def info(self) -> list[RankInfo]:
        """Per rank, rank 0 first: ``rank``, ``pid``, ``ppid``, ``node`` (IP), ``actor_id``, ``name`` (the
        named actor's), ``bundle`` (the placement-group bundle it runs in, as Ray reports it) and
        ``cuda_visible_devices``. Waits for start-up."""
        self._start_up()
        return [RankInfo(**i) for i in self._info]

    def start(self) -> RayRanks:
        """Start the rank actors, ask rank 0 for the rendezvous address, and have every rank load and shard the
        model in the background (the first call waits, at most ``timeout_s``).

        Raises:
            RankFailure: rank 0's actor did not start (or its node gave no address) within ``timeout_s``.
        """
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cls = ray.remote(_RankActor)
        cpus = float(self.resources.get("CPU", 0.0))
        gpus = float(self.resources.get("GPU", 0.0))
        tag = f"{os.getpid()}-{id(self)}"
        self._names = [f"mas-rl-{self.group}-rank{r}-{tag}" for r in range(self.num_ranks)]
        try:
            for r, bundle in enumerate(self.bundle_indices):
                self._actors.append(
                    cls.options(
                        num_cpus=cpus,
                        num_gpus=gpus,
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            placement_group=self.placement_group, placement_group_bundle_index=bundle
                        ),
                        runtime_env={"env_vars": self.env_vars},
                        name=self._names[r],
                    ).remote(os.getcwd(), max(1, int(cpus)))
                )
        except BaseException:  # e.g. a bundle index the placement group lacks: kill those already started
            self.close(force=True)
            raise
        init = self._wait([self._actors[0].address.remote()], "start-up (rendezvous address)", self.timeout_s)
        gpu = 0 if gpus > 0 else None  # Ray renumbers an actor's GPU from 0 (CUDA_VISIBLE_DEVICES)
        self._start_refs = [a.info.remote() for a in self._actors] + [
            a.setup.remote(self.resolved, self.group, r, self.num_ranks, init[0], self.timeout_s, gpu)
            for r, a in enumerate(self._actors)
        ]
        return self

    def _start_up(self) -> None:
        if not self._actors:
            raise RuntimeError(f"model group {self.group!r}: its ranks are closed")
        if self._ready:
            return
        n = self.num_ranks
        # the i-th ref belongs to rank i % n (infos first, then the set-ups)
        out = self._wait(self._start_refs, "start-up", self.timeout_s, rank_of=lambda i: i % n)
        self._info = []
        for r, info in enumerate(out[:n]):
            entry: RankInfo = {"rank": r, "name": self._names[r]}
            entry.update(cast(RankInfo, info))  # _RankActor.info
            self._info.append(entry)
        self._start_refs = []
        self._ready = True
        logger.info(
            "model group %r: rank actors %s",
            self.group,
            [(i["rank"], i["pid"], i["node"], i["bundle"]) for i in self._info],
        )

    def _fail(self, rank: int, what: str, detail: str = "") -> None:
        if detail:
            logger.error("model group %r rank %d:\n%s", self.group, rank, detail)
        self.close(force=True)
        raise RankFailure(
            f"model group {self.group!r}: rank {rank} of {self.num_ranks} {what}; its other ranks were stopped",
            group=self.group,
            rank=rank,
        )

    def _wait(
        self, refs: list[Any], cmd: str, timeout_s: float, rank_of: Callable[[int], int] | None = None
    ) -> list[Any]:
        """Every ref's result, in order; the first rank that died, raised or ran past ``timeout_s`` fails."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        rank_of = rank_of or (lambda i: i)
        out: list[Any] = [None] * len(refs)
        pending = {ref: i for i, ref in enumerate(refs)}
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                late = min(rank_of(i) for i in pending.values())
                self._fail(late, f"did not answer {cmd} within {timeout_s:.0f} s")
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(left, 1.0))
            for ref in ready:
                i = pending.pop(ref)
                try:
                    out[i] = ray.get(ref)
                except RayActorError as e:  # ActorDiedError: killed, out of memory, its node gone
                    self._fail(rank_of(i), f"died during {cmd} ({type(e).__name__})")
                except RayTaskError as e:
                    # a peer's death makes the survivors' collectives fail: name the dead one
                    dead = self._dead(pending, rank_of)
                    if dead is not None:
                        self._fail(dead, f"died during {cmd}")
                    cause = e.cause if e.cause is not None else e
                    self._fail(rank_of(i), f"failed during {cmd}: {type(cause).__name__}: {cause}", str(e))
        return out

    def _dead(
        self, pending: dict[Any, int], rank_of: Callable[[int], int], wait_s: float = 5.0
    ) -> int | None:
        """A rank among ``pending`` whose actor is gone, waiting up to ``wait_s`` for their answers."""
        import ray
        from ray.exceptions import RayActorError

        if not pending:
            return None
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=wait_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                return rank_of(pending[ref])
            except Exception:  # noqa: BLE001 - a survivor's own error: not the one that died
                pass
        return None

    def call(self, cmd: str, *args: object) -> list[Any]:
        """Run ``cmd`` on every rank (a method of :class:`Rank`: ``update``, ``state_dict``, ``save``,
        ``load``, ``sizes``) and return each rank's result, rank 0 first.

        Raises:
            RankFailure: a rank died, raised, did not start within ``timeout_s`` or did not answer within
                ``call_timeout_s``.
            RuntimeError: the ranks were closed.
        """
        import ray

        self._start_up()
        shared = [ray.put(a) for a in args]  # stored once, read by every rank
        refs = [a.call.remote(cmd, *shared) for a in self._actors]
        return self._wait(refs, cmd, self.call_timeout_s)

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        """See :meth:`ShardedRanks.update`."""
        metrics: dict[str, float] = self.call("update", list(samples), [float(a) for a in advantages])[0]
        return metrics

    def sizes(self) -> list[dict[str, int]]:
        """See :meth:`ShardedRanks.sizes`."""
        return self.call("sizes")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """See :meth:`ShardedRanks.full_state_dict` (rank 0's gathered copy travels through Ray's object
        store)."""
        sd: dict[str, torch.Tensor] = self.call("state_dict")[0]
        return sd

    def save(self, folder: str) -> int:
        """See :meth:`ShardedRanks.save` (``folder`` must be on rank 0's node: the worker's when they share a
        node, else a shared filesystem)."""
        return int(self.call("save", str(folder))[0])

    def load(self, folder: str, *, optimizer: bool, global_step: int = 0) -> None:
        """See :meth:`ShardedRanks.load` (``folder`` must be readable on every rank's node)."""
        self.call("load", str(folder), bool(optimizer), int(global_step))

    def close(self, *, force: bool = False) -> None:
        """Destroy the process group (politely, at most 10 s, unless ``force`` or not started), then
        ``ray.kill`` every rank actor. Idempotent."""
        if not self._actors:
            return
        import ray

        if not force and self._ready:
            refs = [a.close.remote() for a in self._actors]
            try:
                ray.wait(refs, num_returns=len(refs), timeout=10.0)
            except Exception as e:  # noqa: BLE001 - the actors are killed next whatever they answer
                logger.warning("model group %r: closing its ranks: %s", self.group, e)
        for a in self._actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception as e:  # noqa: BLE001
                logger.warning("model group %r: killing a rank actor: %s", self.group, e)
        self._actors, self._start_refs = [], []

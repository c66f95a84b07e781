"""``pool: ray`` — every model group's worker in its own Ray actor, placed in one placement group.

Each model group asks for ``num_cpus`` / ``num_gpus`` (fractions allowed, e.g. two groups at ``num_gpus: 0.5``
share one GPU); the pool turns those into one bundle per group (and one per rank of a sharded group), reserves
them all at once with a placement group (strategy ``PACK`` by default: as few nodes as possible, spilling over
when one is not enough), and starts a :class:`~mas_train.hosting.worker.ModelGroupWorker` per group in an actor pinned
to its bundle. The actor holds the group's policy, its TRL trainer and its generation backend, so weights never
leave the actor: the driver sends token ids and samples, and gets completions, metrics and versions back. The
actor body and the driver's handle to it are :mod:`mas_train.hosting.ray_worker`'s; this module places them.

A sharded group (``num_ranks: N > 1``, :mod:`mas_train.hosting.sharded`) holds N + 1 bundles: its worker's, then one
per rank (:func:`bundle_layout`). Its worker's actor starts the N ranks as N actors of their own
(:class:`~mas_train.hosting.sharded_ray.RayRanks`), rank r pinned to the group's r-th rank bundle, so a group's ranks can
span GPUs and nodes; ``num_gpus`` is then the group's total, one GPU per rank and the rest for the worker's
generation (:func:`placement_bundles`).

Every wait has a timeout: a placement group that cannot be placed fails after ``ready_timeout_s`` with the
resources it is missing (Ray itself would wait forever), a worker that does not start fails after
``start_timeout_s`` and every call after ``call_timeout_s``. Actors and the placement group are removed by
:meth:`RayPool.shutdown`, which also runs at interpreter exit (so after Ctrl-C, which ends the driver with
``KeyboardInterrupt``); actors are never detached, so Ray also reaps them if the driver dies.

Defaults can be set without code through ``MAS_RAY_STRATEGY``, ``MAS_RAY_READY_TIMEOUT``,
``MAS_RAY_START_TIMEOUT`` and ``MAS_RAY_CALL_TIMEOUT`` (seconds), and ``RAY_ADDRESS`` to join a running
cluster (``ray start --head`` on one node, ``ray start --address ...`` on the others).
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from typing import TYPE_CHECKING, Any

from mas_train.hosting.ray_worker import ModelGroupActor, RayWorkerHandle, bounded_get, parameter_fingerprint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from mas_train.config import ResolvedConfig

logger = logging.getLogger(__name__)

__all__ = ["RayPool", "RayWorkerHandle", "bundle_layout", "parameter_fingerprint", "placement_bundles"]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# Passed to the actors so a worker on this node behaves as the driver does (offline hub, shared cache).
_PASSTHROUGH_ENV = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "HF_HUB_CACHE",
    "MAS_RL_CACHE",
    "XDG_CACHE_HOME",
    "TOKENIZERS_PARALLELISM",
)
_RAY_HINT = "pool: ray needs Ray: pip install 'mas-rl[ray]' (ray[default]==2.60.0)"


def _group_resources(name: str, g: Any) -> tuple[dict[str, float], dict[str, float] | None]:
    """A group's worker bundle and, for a sharded group (``num_ranks > 1``), the bundle of each of its ranks.

    Unsharded: the worker's bundle is ``{"CPU": num_cpus, "GPU": num_gpus}``. Sharded: each rank's bundle is
    ``{"CPU": num_cpus, "GPU": 1}`` (``GPU`` only when ``num_gpus > 0``: a CPU group's ranks train on CPU) and
    the worker's is ``{"CPU": num_cpus, "GPU": num_gpus - num_ranks}``: ``num_gpus`` is the group's total, one
    GPU per rank, the rest for the worker's generation (its ``hf`` model copy or its engine). Zero entries are
    dropped, as Ray requires.

    Raises:
        ValueError: a group reserves neither CPUs nor GPUs (Ray cannot place an empty bundle).
    """

    def bundle(cpus: float, gpus: float) -> dict[str, float]:
        return {k: float(v) for k, v in (("CPU", cpus), ("GPU", gpus)) if v and v > 0}

    ranks = int(getattr(g, "num_ranks", 1) or 1)
    if ranks > 1:
        worker = bundle(g.num_cpus, g.num_gpus - ranks if g.num_gpus > 0 else 0.0)
        rank = bundle(g.num_cpus, 1.0 if g.num_gpus > 0 else 0.0)
    else:
        worker, rank = bundle(g.num_cpus, g.num_gpus), None
    if not worker or (rank is not None and not rank):
        raise ValueError(
            f"model_groups.{name}: num_cpus and num_gpus are both 0; a Ray actor needs some resource "
            "(set num_cpus: 1, or num_gpus: 0.5 to share a GPU)"
        )
    return worker, rank


def bundle_layout(resolved: ResolvedConfig) -> dict[str, dict[str, Any]]:
    """Which bundles of the placement group (indices into :func:`placement_bundles`) each model group holds:
    ``{group: {"worker": i, "ranks": [j, ...]}}``, groups in config order, a group's worker bundle first, then
    one bundle per rank of a sharded group (``ranks`` is empty for ``num_ranks: 1``).

    Example: groups ``solver`` (2 ranks) and ``verifier`` (1 rank) give ``{"solver": {"worker": 0, "ranks":
    [1, 2]}, "verifier": {"worker": 3, "ranks": []}}``.
    """
    layout: dict[str, dict[str, Any]] = {}
    i = 0
    for name, g in resolved.model_groups.items():
        n = int(getattr(g, "num_ranks", 1) or 1)
        ranks = list(range(i + 1, i + 1 + n)) if n > 1 else []
        layout[name] = {"worker": i, "ranks": ranks}
        i += 1 + len(ranks)
    return layout


def placement_bundles(resolved: ResolvedConfig) -> list[dict[str, float]]:
    """The placement group's bundles, in :func:`bundle_layout` order: per model group its worker's bundle, then
    for a sharded group (``num_ranks: N > 1``) one bundle per rank, each rank's actor pinned to its own bundle
    (so a group's ranks can sit on several GPUs and nodes). Resources (CPU count, GPU count; see
    :func:`_group_resources`): an unsharded group's bundle is ``{"CPU": num_cpus, "GPU": num_gpus}``; a sharded
    group's ranks get ``{"CPU": num_cpus, "GPU": 1}`` each (no ``GPU`` for a CPU group) and its worker
    ``{"CPU": num_cpus, "GPU": num_gpus - N}`` (what its generation needs). Zero entries are dropped.

    Raises:
        ValueError: a group reserves neither CPUs nor GPUs (Ray cannot place an empty bundle).
    """
    bundles: list[dict[str, float]] = []
    for name, g in resolved.model_groups.items():
        worker, rank = _group_resources(name, g)
        bundles.append(worker)
        if rank is not None:
            bundles.extend(dict(rank) for _ in range(int(g.num_ranks)))
    return bundles


def _missing_resources(needed: dict[str, float], have: dict[str, float]) -> dict[str, float]:
    return {k: round(v - have.get(k, 0.0), 6) for k, v in needed.items() if v > have.get(k, 0.0) + 1e-9}


class RayPool:
    """Model-group workers in Ray actors inside one placement group (``pool: ray``).

    Args:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig`; each group's ``num_cpus``/``num_gpus``
            is its bundle and its actor's reservation.
        strategy: placement strategy, one of ``PACK`` (default), ``SPREAD``, ``STRICT_PACK``, ``STRICT_SPREAD``.
        ready_timeout_s: seconds to wait for the placement group (default 120, ``MAS_RAY_READY_TIMEOUT``).
        start_timeout_s: seconds for every worker to load its model (default 1800, ``MAS_RAY_START_TIMEOUT``).
        call_timeout_s: seconds for one remote call (default 3600, ``MAS_RAY_CALL_TIMEOUT``).
        address: Ray cluster to join (default ``RAY_ADDRESS``, else a local cluster is started); ignored when
            Ray is already initialised in this process (tests do that).
        init_kwargs: further ``ray.init`` arguments when this pool starts Ray (e.g. ``num_cpus``).

    Raises (from :meth:`start`):
        ImportError: Ray is not installed (the message has the pip line).
        TimeoutError: the placement group or a worker was not ready in time; the message names the missing
            resources. Everything already started is released first.
    """

    def __init__(
        self,
        resolved: ResolvedConfig,
        *,
        strategy: str | None = None,
        ready_timeout_s: float | None = None,
        start_timeout_s: float | None = None,
        call_timeout_s: float | None = None,
        address: str | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.resolved = resolved
        self.strategy = (strategy or os.environ.get("MAS_RAY_STRATEGY") or "PACK").upper()
        if self.strategy not in STRATEGIES:
            raise ValueError(f"placement strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        self.ready_timeout_s = float(ready_timeout_s or os.environ.get("MAS_RAY_READY_TIMEOUT") or 120)
        self.start_timeout_s = float(start_timeout_s or os.environ.get("MAS_RAY_START_TIMEOUT") or 1800)
        self.call_timeout_s = float(call_timeout_s or os.environ.get("MAS_RAY_CALL_TIMEOUT") or 3600)
        self.address = address
        self.init_kwargs = dict(init_kwargs or {})
        self.bundles = placement_bundles(resolved)
        self.layout = bundle_layout(resolved)
        self._handles: dict[str, RayWorkerHandle] = {}
        self._actors: list[Any] = []
        self.placement_group: Any = None
        self._owns_ray = False
        self._atexit = False

    @property
    def groups(self) -> list[str]:
        return list(self.resolved.model_groups)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> RayPool:
        """Reserve the bundles, start one actor per group and wait until every model is loaded."""
        if self._handles:
            return self
        try:
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as e:
            raise ImportError(_RAY_HINT) from e

        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS")
            ray.init(address=address, include_dashboard=False, log_to_driver=True, **self.init_kwargs)
            self._owns_ray = True
        if not self._atexit:
            # a weak reference: the exit hook must not keep a finished pool (and its actors) alive
            ref = weakref.ref(self)
            atexit.register(_shutdown_if_alive, ref)
            self._atexit = True
        try:
            self._place(ray, placement_group)
            self._start_actors(ray, PlacementGroupSchedulingStrategy)
        except BaseException:
            self.shutdown()
            raise
        return self

    def _place(self, ray: Any, placement_group: Any) -> None:
        name = f"mas-rl-{self.resolved.run_name}-{os.getpid()}"
        self.placement_group = placement_group(self.bundles, strategy=self.strategy, name=name)
        ready, _ = ray.wait([self.placement_group.ready()], timeout=self.ready_timeout_s)
        if ready:
            return
        needed: dict[str, float] = {}
        for b in self.bundles:
            for k, v in b.items():
                needed[k] = needed.get(k, 0.0) + v
        total, available = ray.cluster_resources(), ray.available_resources()
        missing = _missing_resources(needed, total)
        # a sharded group shows its worker's bundle, then its ranks'
        shown = {
            g: self.bundles[ix["worker"]]
            if not ix["ranks"]
            else [self.bundles[i] for i in (ix["worker"], *ix["ranks"])]
            for g, ix in self.layout.items()
        }
        if missing:
            why = f"the cluster lacks {missing} (cluster total: { {k: total.get(k, 0.0) for k in needed} })"
        else:
            why = (
                f"the cluster has the resources in total but not free or not in this shape (strategy "
                f"{self.strategy}, per-node limits); free now: { {k: available.get(k, 0.0) for k in needed} }"
            )
        raise TimeoutError(
            f"Ray placement group for model groups {shown} (strategy {self.strategy}) was not placed within "
            f"{self.ready_timeout_s:.0f}s: {why}. Lower model_groups.<g>.num_gpus / num_cpus (fractions share a "
            "GPU), add nodes, or raise MAS_RAY_READY_TIMEOUT if the cluster is still scaling up."
        )

    def _start_actors(self, ray: Any, strategy_cls: Any) -> None:
        env_vars = {k: os.environ[k] for k in _PASSTHROUGH_ENV if k in os.environ}
        env_vars.setdefault("TOKENIZERS_PARALLELISM", "false")
        actor_cls = ray.remote(ModelGroupActor)
        refs = {}
        for name, g in self.resolved.model_groups.items():
            if g.num_gpus > 0 and getattr(g.backend_options, "gpu_ids", None):
                logger.warning(
                    "model group %r sets backend_options.gpu_ids under pool: ray; Ray assigns this actor's GPU(s) "
                    "and renumbers them from 0 (CUDA_VISIBLE_DEVICES), so gpu_ids index the visible devices",
                    name,
                )
            threads = max(1, int(g.num_cpus))
            env = {**env_vars, "OMP_NUM_THREADS": str(threads)}
            where = self.layout[name]
            mine = self.bundles[where["worker"]]
            ranks = None
            if where["ranks"]:
                # the worker starts its ranks as actors of their own, each pinned to one of the group's bundles
                ranks = {
                    "placement_group": self.placement_group,
                    "bundle_indices": list(where["ranks"]),
                    "resources": self.bundles[where["ranks"][0]],
                    "env_vars": env,
                    # a rank's failure must reach the driver before the driver's own deadline does
                    "call_timeout_s": max(1.0, self.call_timeout_s - min(60.0, self.call_timeout_s / 10)),
                }
            actor = actor_cls.options(
                num_cpus=mine.get("CPU", 0.0),
                num_gpus=mine.get("GPU", 0.0),
                scheduling_strategy=strategy_cls(
                    placement_group=self.placement_group, placement_group_bundle_index=where["worker"]
                ),
                runtime_env={"env_vars": env},
                name=f"mas-rl-{name}-{os.getpid()}-{id(self)}",
            ).remote(self.resolved, name, os.getcwd(), threads, ranks)
            self._actors.append(actor)
            refs[name] = (actor, actor.info.remote())
        for name, (actor, ref) in refs.items():
            info = self._get(ref, f"{name} start-up (loading its model)", timeout=self.start_timeout_s)
            self._handles[name] = RayWorkerHandle(self, name, actor, info)
            logger.info("model group %r: actor pid %s on %s", name, info["pid"], info["node"])

    def _get(self, ref: Any, what: str, *, timeout: float | None = None) -> Any:
        return bounded_get(ref, what, self.call_timeout_s if timeout is None else timeout)

    # -- pool interface ----------------------------------------------------------------------------------

    def worker(self, group: str) -> RayWorkerHandle:
        """The handle of ``group``.

        Raises:
            KeyError: unknown group, or :meth:`start` was not called.
        """
        if group not in self._handles:
            raise KeyError(
                f"no worker for model group {group!r}; groups: {self.groups}"
                + ("" if self._handles else " (call start() first)")
            )
        return self._handles[group]

    def tokenizer(self, group: str) -> PreTrainedTokenizerBase:
        return self.worker(group).tokenizer

    def shutdown(self) -> None:
        """Close every backend (best effort, bounded), kill the actors, remove the placement group, and stop
        Ray if this pool started it. Idempotent."""
        try:
            import ray
        except ImportError:
            return
        if not ray.is_initialized():
            self._handles.clear()
            self._actors.clear()
            self.placement_group = None
            return
        if self._handles:
            refs = [h.actor.call.remote("close") for h in self._handles.values()]
            try:
                ray.wait(refs, num_returns=len(refs), timeout=30)
            except Exception as e:  # noqa: BLE001 - cleanup must go on whatever a dying actor says
                logger.warning("closing Ray workers: %s", e)
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # noqa: BLE001
                logger.warning("killing a Ray worker: %s", e)
        self._handles.clear()
        self._actors.clear()
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.placement_group)
            except Exception as e:  # noqa: BLE001
                logger.warning("removing the placement group: %s", e)
            self.placement_group = None
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> RayPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _shutdown_if_alive(ref: weakref.ref[RayPool]) -> None:
    """The interpreter-exit hook of a pool: shut it down unless it was already collected."""
    pool = ref()
    if pool is not None:
        pool.shutdown()

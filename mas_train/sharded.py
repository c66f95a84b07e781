"""Sharded model groups: one group's GRPO update on N processes, its parameters, gradients and optimizer state
sharded by PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

A group with ``num_ranks: N > 1`` keeps its worker (:class:`~mas_train.worker.ModelGroupWorker`: tokenizer,
generation backend, checkpoint folder) where the pool puts it, and :class:`ShardedRanks` starts N rank processes
(``torch.multiprocessing`` spawn) that each load the group's model, wrap every decoder layer and then the whole
model with ``fully_shard`` over one process group (gloo on CPU, NCCL on GPUs), and build the group's
:class:`~mas_train.update.GroupGRPOTrainer` on the sharded model, so TRL's optimizer holds only each rank's shard
of the AdamW moments. Under ``pool: local`` the ranks are children of the worker's process (the driver);
under ``pool: ray`` :class:`RayRanks` starts them as N Ray actors, rank r pinned to the group's r-th rank bundle
of the run's placement group (:func:`~mas_train.ray_pool.bundle_layout`: one bundle per rank, one GPU each on
a GPU run), so a group's ranks can span GPUs and nodes; they meet at ``tcp://<rank 0's node IP>:<free port>``.

Per step the worker sends every rank all of the group's samples; each rank runs its share of the one-rank
micro-batch plan (:func:`rank_share`), FSDP reduce-scatters the gradients, and each rank steps its shard. The weight sync then gathers the full weights onto rank 0
(``get_model_state_dict(full_state_dict=True, cpu_offload=True)``: one full copy in rank 0's CPU memory, none on
the other ranks) and hands them to the worker, which pushes them to its backend.

Checkpoints stay the plain per-group folder of an unsharded group: ``model/`` is a Hugging Face folder (loads
with ``from_pretrained``, no FSDP), and ``optimizer.pt`` is the full (gathered) optimizer state in
``torch.optim``'s own format, so a checkpoint resumes with any ``num_ranks``, 1 included: each rank loads the full
state and FSDP keeps its shard (``set_model_state_dict`` / ``set_optimizer_state_dict`` with
``full_state_dict=True``).

Failures: a rank that dies or raises fails the worker's call with :class:`RankFailure`, naming the group and the
rank; the other ranks are then terminated (no process is left waiting in a collective), and every collective has
the ``timeout_s`` deadline. A rank whose parent process is gone exits by itself (a rank actor is owned by the
worker's actor: Ray kills it with its owner). A rank actor that is gone (``ActorDiedError``) or raised fails
the call the same way, and every rank actor is then killed (``ray.kill``).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RankFailure",
    "RayRanks",
    "ShardedRanks",
    "optimizer_state_by_index",
    "rank_share",
    "shard_model",
]

logger = logging.getLogger(__name__)

#: Deadline (seconds) of every collective of a sharded group, and of a rank's start-up.
DEFAULT_TIMEOUT_S = 600.0


class RankFailure(RuntimeError):
    """A rank of a sharded model group died or raised; ``group`` and ``rank`` name it."""

    def __init__(self, message: str, *, group: str, rank: int) -> None:
        super().__init__(message)
        self.group = group
        self.rank = rank

    def __reduce__(self):
        # pickles (Ray sends a worker actor's exceptions to the driver): group and rank are keyword-only
        return (functools.partial(type(self), group=self.group, rank=self.rank), self.args)


def shard_model(model, mesh) -> None:
    """Apply FSDP2 to a Hugging Face causal LM in place: ``fully_shard`` on every module whose class is in
    ``model._no_split_modules`` (the decoder layers, the unit transformers/accelerate wrap too), then on the
    model itself (embeddings, final norm, LM head). Parameters become ``DTensor`` shards over ``mesh``'s ranks.

    Raises:
        ValueError: the model names no ``_no_split_modules`` (nothing to wrap layer by layer).
    """
    from torch.distributed.fsdp import fully_shard

    names = set(getattr(model, "_no_split_modules", None) or ())
    if not names:
        raise ValueError(f"{type(model).__name__} has no _no_split_modules; cannot pick FSDP units")
    for module in list(model.modules()):
        if type(module).__name__ in names:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def rank_share(mbs: list, *, rank: int, world: int) -> tuple[list, list[float]]:
    """Rank ``rank``'s micro-batches of a one-rank micro-batch plan of ``n`` items for ``world`` ranks, and their loss weights: items
    ``rank, rank + world, ...`` (weight 1), then the rank's first item again with weight 0 until it has
    ``ceil(n / world)`` items, so every rank runs the same number of forwards (FSDP's all-gathers are
    collectives). A rank with no item of its own re-runs item 0 with weight 0.

    Example: 3 items, 2 ranks: rank 0 gets ``[m0, m2]`` weights ``[1, 1]``, rank 1 ``[m1, m1]`` ``[1, 0]``.

    Raises:
        ValueError: ``mbs`` is empty, or ``rank`` is not in ``[0, world)``.
    """
    if not mbs or not 0 <= rank < world:
        raise ValueError(f"rank_share needs a non-empty plan and 0 <= rank < world, got {rank}/{world}")
    mine = list(mbs[rank::world])
    weights = [1.0] * len(mine)
    per = -(-len(mbs) // world)
    filler = mine[0] if mine else mbs[0]
    while len(mine) < per:
        mine.append(filler)
        weights.append(0.0)
    return mine, weights


def _param_order(model, optimizer) -> list[str]:
    """Parameter names in the order ``optimizer.state_dict()`` numbers them (param group by param group)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def optimizer_state_by_index(state: dict, order: list[str]) -> dict:
    """A name-keyed optimizer state (``get_optimizer_state_dict(full_state_dict=True)``) in ``torch.optim``'s
    index-keyed format (``order[i]`` is parameter i), the format an unsharded group's ``optimizer.pt`` has."""
    index = {n: i for i, n in enumerate(order)}
    return {
        "state": {index[n]: v for n, v in state["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]],
    }


def _optimizer_state_by_name(state: dict, order: list[str]) -> dict:
    """The inverse of :func:`optimizer_state_by_index`."""
    return {
        "state": {order[int(i)]: v for i, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [order[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }


class _Rank:
    """One rank of a sharded group, inside its own process: the process group, the sharded model, the trainer."""

    def __init__(
        self,
        resolved,
        group: str,
        rank: int,
        world: int,
        init_method: str,
        timeout_s: float,
        gpu: int | None = None,
    ):
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from transformers.utils import logging as hf_logging

        from mas_train.group_trainer import _device, _torch_dtype, build_group_trainer
        from mas_train.models import load_model_and_tokenizer, resolve_model_path

        g = resolved.model_groups[group]
        device = _device(resolved.config.device)
        if device.startswith("cuda"):
            if gpu is None:  # a local process: the group's rank_gpu_ids (Ray gives an actor its one GPU as 0)
                gpu = g.rank_gpu_ids[rank] if g.rank_gpu_ids else rank
            torch.cuda.set_device(gpu)
            device = f"cuda:{gpu}"
        self.rank = rank
        dist.init_process_group(
            "nccl" if device.startswith("cuda") else "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (world,))
        hf_logging.disable_progress_bar()  # N ranks' "Loading weights" bars would interleave with the run's
        model, tok = load_model_and_tokenizer(
            resolve_model_path(g.model), dtype=_torch_dtype(g.dtype, device), device=device
        )
        shard_model(model, mesh)  # before the trainer, so its optimizer holds the shards
        # transformers warns that a process group exists without a DDP launch: intended, FSDP owns the group and
        # accelerate stays single-process (TRL's metric gathers must not become collectives)
        logging.getLogger("transformers.training_args").addFilter(
            lambda record: "parallel_mode != ParallelMode.DISTRIBUTED" not in record.getMessage()
        )
        self.model = model
        self.trainer = build_group_trainer(resolved, group, model, tok, device)
        self.trainer.shard_world = world
        self.trainer.shard_plan = functools.partial(rank_share, rank=rank, world=world)

    def update(self, samples, advantages) -> dict[str, float]:
        import torch.distributed as dist

        out = self.trainer.update(samples, advantages, agent_grad_norms=False)
        # each rank's loss covers its micro-batches: their sum is the one-rank loss
        t = torch.tensor([out["loss"]], dtype=torch.float64, device=self.trainer.accelerator.device)
        dist.all_reduce(t)
        out["loss"] = float(t.item())
        return out

    def sizes(self) -> dict[str, int]:
        """Elements this rank holds: its parameter shards, and its optimizer state tensors."""
        local = sum(
            p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in self.model.parameters()
        )
        opt = 0
        for st in self.trainer.optimizer.state.values():
            for v in st.values():
                if torch.is_tensor(v) and v.dim() > 0:
                    opt += v.to_local().numel() if hasattr(v, "to_local") else v.numel()
        return {"params": int(local), "optimizer": int(opt)}

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return sd if self.rank == 0 else None

    def save(self, folder: str) -> int:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        t = self.trainer
        osd = get_optimizer_state_dict(
            self.model, t.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if self.rank == 0:
            folder = Path(folder)
            order = _param_order(self.model, t.optimizer)
            torch.save(optimizer_state_by_index(osd, order), folder / "optimizer.pt")
            torch.save(t.lr_scheduler.state_dict(), folder / "scheduler.pt")
        return int(t.state.global_step)

    def load(self, folder: str, optimizer: bool, global_step: int) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )
        from transformers import AutoModelForCausalLM

        folder = Path(folder)
        t = self.trainer
        saved = AutoModelForCausalLM.from_pretrained(folder / "model", dtype=self.model.dtype)
        full = saved.state_dict()
        if "lm_head.weight" not in full or getattr(saved.config, "tie_word_embeddings", False):
            full["lm_head.weight"] = full["model.embed_tokens.weight"]
        keys = set(self.model.state_dict())
        set_model_state_dict(
            self.model,
            {k: v for k, v in full.items() if k in keys},
            options=StateDictOptions(full_state_dict=True),
        )
        del saved, full
        if optimizer:
            plain = torch.load(folder / "optimizer.pt", weights_only=False)
            osd = _optimizer_state_by_name(plain, _param_order(self.model, t.optimizer))
            set_optimizer_state_dict(
                self.model, t.optimizer, optim_state_dict=osd, options=StateDictOptions(full_state_dict=True)
            )
            t.lr_scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
            t.state.global_step = int(global_step)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _exit_with_parent(parent: int) -> None:
    # the worker's process was killed (SIGKILL runs no clean-up): do not outlive it
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(3)


def _rank_main(resolved, group, rank, world, init_method, timeout_s, conn, parent) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    r = None
    try:
        r = _Rank(resolved, group, rank, world, init_method, timeout_s)
        conn.send(("ok", None))
        while True:
            cmd, args = conn.recv()
            if cmd == "stop":
                conn.send(("ok", None))
                break
            conn.send(("ok", getattr(r, cmd)(*args)))
    except (EOFError, KeyboardInterrupt):  # the worker went away or is stopping us
        pass
    except BaseException as err:  # noqa: BLE001 - any failure goes back to the worker, then we exit
        try:
            conn.send(("error", f"{type(err).__name__}: {err}", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if r is not None:
            try:
                r.close()
            except Exception:  # noqa: BLE001 - a dead peer can make the teardown itself fail
                pass


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ShardedRanks:
    """The N rank processes of one sharded model group, driven from the group's worker.

    Args:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig` (sent to each rank; must pickle).
        group: the model group; ``resolved.model_groups[group].num_ranks`` ranks are started.
        timeout_s: deadline of every collective and of start-up, seconds.

    Every method blocks until each rank has answered and raises :class:`RankFailure` (naming the group and the
    first rank that died or raised) if one did not; after a failure every rank is stopped and the object is
    closed.
    """

    def __init__(self, resolved, group: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        g = resolved.model_groups[group]
        if g.sharding != "fsdp2":
            raise ValueError(f"model group {group!r}: sharding {g.sharding!r} is not implemented; use fsdp2")
        self.resolved = resolved
        self.group = group
        self.num_ranks = int(g.num_ranks)
        self.timeout_s = float(timeout_s)
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._ready = False

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids, rank 0 first."""
        return [p.pid for p in self._procs]

    def info(self) -> list[dict[str, Any]]:
        """Per rank, rank 0 first: ``rank``, ``pid``, ``node`` (host name); ``actor_id`` and ``bundle`` are
        ``None`` (local processes; see :meth:`RayRanks.info`)."""
        node = socket.gethostname()
        return [
            {"rank": r, "pid": p.pid, "node": node, "actor_id": None, "bundle": None}
            for r, p in enumerate(self._procs)
        ]

    def start(self) -> ShardedRanks:
        """Spawn the ranks (they load the model and shard it in the background; the first call waits)."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{_free_port()}"
        for rank in range(self.num_ranks):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(
                target=_rank_main,
                args=(
                    self.resolved,
                    self.group,
                    rank,
                    self.num_ranks,
                    init,
                    self.timeout_s,
                    theirs,
                    os.getpid(),
                ),
                name=f"mas-train-{self.group}-rank{rank}",
                daemon=True,
            )
            p.start()
            theirs.close()
            self._procs.append(p)
            self._conns.append(mine)
        return self

    def _fail(self, rank: int, what: str, detail: str = "") -> None:
        if detail:
            logger.error("model group %r rank %d traceback:\n%s", self.group, rank, detail)
        self.close(force=True)
        raise RankFailure(
            f"model group {self.group!r}: rank {rank} of {self.num_ranks} {what}; its other ranks were stopped",
            group=self.group,
            rank=rank,
        )

    def _dead(self) -> int | None:
        for r, p in enumerate(self._procs):
            if not p.is_alive():
                return r
        return None

    def _replies(self, cmd: str, deadline: float | None) -> list[Any]:
        out: list[Any] = [None] * self.num_ranks
        pending = set(range(self.num_ranks))
        while pending:
            for r in sorted(pending):
                conn = self._conns[r]
                if conn.poll(0.2):
                    try:
                        msg = conn.recv()
                    except EOFError:  # the rank closed its end: it is exiting
                        self._procs[r].join(5.0)
                        self._fail(r, f"died (exit code {self._procs[r].exitcode}) during {cmd}")
                    if msg[0] == "error":
                        # a peer's death makes the survivors' collectives fail: name the dead one
                        time.sleep(1.0)
                        dead = self._dead()
                        if dead is not None and dead != r:
                            self._fail(dead, f"died (exit code {self._procs[dead].exitcode}) during {cmd}")
                        self._fail(r, f"failed during {cmd}: {msg[1]}", msg[2])
                    out[r] = msg[1]
                    pending.discard(r)
                elif not self._procs[r].is_alive():
                    self._fail(r, f"died (exit code {self._procs[r].exitcode}) during {cmd}")
            if deadline is not None and time.monotonic() > deadline:
                self._fail(min(pending), f"did not answer {cmd} within {self.timeout_s:.0f} s")
        return out

    def call(self, cmd: str, *args) -> list[Any]:
        """Run ``cmd`` on every rank (a method of the rank: ``update``, ``state_dict``, ``save``, ``load``) and
        return each rank's result, rank 0 first.

        Raises:
            RankFailure: a rank died, raised or did not start in ``timeout_s``.
            RuntimeError: the ranks were closed.
        """
        if not self._procs:
            raise RuntimeError(f"model group {self.group!r}: its ranks are closed")
        if not self._ready:
            self._replies("start-up", time.monotonic() + self.timeout_s)
            self._ready = True
        for r, conn in enumerate(self._conns):
            try:
                conn.send((cmd, args))
            except (BrokenPipeError, OSError):
                self._fail(r, f"died (exit code {self._procs[r].exitcode}) before {cmd}")
        return self._replies(cmd, None)

    def update(self, samples, advantages) -> dict[str, float]:
        """One sharded GRPO update; rank 0's metrics (``loss`` summed over every rank's micro-batches; TRL's
        per-token metrics over rank 0's micro-batches)."""
        return self.call("update", list(samples), [float(a) for a in advantages])[0]

    def sizes(self) -> list[dict[str, int]]:
        """Per rank, the elements of its parameter shards (``params``) and optimizer state (``optimizer``)."""
        return self.call("sizes")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights (state-dict names, CPU tensors), gathered from the shards onto rank 0."""
        return self.call("state_dict")[0]

    def save(self, folder: str) -> int:
        """Rank 0 writes ``optimizer.pt`` (full state, ``torch.optim`` format) and ``scheduler.pt`` under
        ``folder``; returns the trainer's ``global_step``."""
        return int(self.call("save", str(folder))[0])

    def load(self, folder: str, *, optimizer: bool, global_step: int = 0) -> None:
        """Every rank loads ``folder/model`` (and with ``optimizer``, ``optimizer.pt``, ``scheduler.pt`` and
        ``global_step``) and keeps its shard; any ``num_ranks`` of the saving run."""
        self.call("load", str(folder), bool(optimizer), int(global_step))

    def close(self, *, force: bool = False) -> None:
        """Stop the ranks (politely, then SIGTERM, then SIGKILL) and reap them. Idempotent."""
        force = force or not self._ready
        if not force:
            for conn in self._conns:
                try:
                    conn.send(("stop", ()))
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + (2.0 if force else 10.0)
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(5.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


# ----------------------------------------------------------------------------------------------- pool: ray


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
    """The Ray actor body of one rank: a :class:`_Rank`, built by :meth:`setup` once rank 0's address is known
    (:meth:`address` on rank 0's actor), then driven by :meth:`call` with :class:`_Rank`'s method names."""

    def __init__(self, cwd: str, num_threads: int) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths resolve as in the worker (same node or shared filesystem)
        torch.set_num_threads(num_threads)
        self.rank: _Rank | None = None

    def info(self) -> dict[str, Any]:
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
        return f"tcp://{host}:{_free_port(ip)}"

    def setup(self, resolved, group: str, rank: int, world: int, init_method: str, timeout_s: float, gpu):
        self.rank = _Rank(resolved, group, rank, world, init_method, timeout_s, gpu=gpu)

    def call(self, cmd: str, *args):
        return getattr(self.rank, cmd)(*args)

    def close(self) -> None:
        if self.rank is not None:
            self.rank.close()


class RayRanks:
    """The N ranks of one sharded model group as N Ray actors (``pool: ray``), rank r pinned to bundle
    ``bundle_indices[r]`` of the run's placement group, so a group's ranks can span GPUs and nodes. The same
    interface as :class:`ShardedRanks` (``start``, ``call``, ``update``, ``sizes``, ``full_state_dict``,
    ``save``, ``load``, ``close``, ``pids``, ``num_ranks``); each actor runs a :class:`_Rank`.

    The process group (NCCL when the ranks have GPUs, gloo on CPU) meets at ``tcp://<rank 0's node IP>:<a port
    free there>``, both asked of rank 0's actor before any rank joins.

    Args:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig` (sent to each rank; must pickle).
        group: the model group; ``resolved.model_groups[group].num_ranks`` rank actors are started.
        placement_group: the run's Ray placement group (:class:`~mas_train.ray_pool.RayPool`'s).
        bundle_indices: the group's rank bundles in it, rank 0 first (one per rank,
            :func:`~mas_train.ray_pool.bundle_layout`).
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
        resolved,
        group: str,
        *,
        placement_group,
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
        self._info: list[dict[str, Any]] = []
        self._ready = False

    @property
    def pids(self) -> list[int]:
        """The rank actors' process ids, rank 0 first (waits for start-up)."""
        return [i["pid"] for i in self.info()]

    def info(self) -> list[dict[str, Any]]:
        """Per rank, rank 0 first: ``rank``, ``pid``, ``ppid``, ``node`` (IP), ``actor_id``, ``name`` (the
        named actor's), ``bundle`` (the placement-group bundle it runs in, as Ray reports it) and
        ``cuda_visible_devices``. Waits for start-up."""
        self._start_up()
        return [dict(i) for i in self._info]

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
        self._info = [{"rank": r, "name": self._names[r], **info} for r, info in enumerate(out[:n])]
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

    def _wait(self, refs: list, cmd: str, timeout_s: float, rank_of=None) -> list[Any]:
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

    def _dead(self, pending: dict, rank_of, wait_s: float = 5.0) -> int | None:
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

    def call(self, cmd: str, *args) -> list[Any]:
        """Run ``cmd`` on every rank (a method of :class:`_Rank`: ``update``, ``state_dict``, ``save``,
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

    def update(self, samples, advantages) -> dict[str, float]:
        """See :meth:`ShardedRanks.update`."""
        return self.call("update", list(samples), [float(a) for a in advantages])[0]

    def sizes(self) -> list[dict[str, int]]:
        """See :meth:`ShardedRanks.sizes`."""
        return self.call("sizes")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """See :meth:`ShardedRanks.full_state_dict` (rank 0's gathered copy travels through Ray's object
        store)."""
        return self.call("state_dict")[0]

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

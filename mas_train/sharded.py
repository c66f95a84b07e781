"""Sharded model groups: one group's GRPO update on N processes, its parameters, gradients and optimizer state
sharded by PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

A group with ``num_ranks: N > 1`` keeps its worker (:class:`~mas_train.worker.ModelGroupWorker`: tokenizer,
generation backend, checkpoint folder) where the pool puts it, and :class:`ShardedRanks` starts N rank processes
(``torch.multiprocessing`` spawn) that each load the group's model, wrap every decoder layer and then the whole
model with ``fully_shard`` over one process group (gloo on CPU, NCCL on GPUs), and build the group's
:class:`~mas_train.update.GroupGRPOTrainer` on the sharded model, so TRL's optimizer holds only each rank's shard
of the AdamW moments. Under ``pool: local`` the ranks are children of the worker's process (the driver);
under ``pool: ray`` :class:`~mas_train.sharded_ray.RayRanks` starts them as N Ray actors, rank r pinned to the group's r-th rank bundle
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

from mas_train.checkpoint import load_state

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RankFailure",
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
            plain = load_state(folder / "optimizer.pt")
            osd = _optimizer_state_by_name(plain, _param_order(self.model, t.optimizer))
            set_optimizer_state_dict(
                self.model, t.optimizer, optim_state_dict=osd, options=StateDictOptions(full_state_dict=True)
            )
            t.lr_scheduler.load_state_dict(load_state(folder / "scheduler.pt"))
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
        ``None`` (local processes; see :meth:`~mas_train.sharded_ray.RayRanks.info`)."""
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

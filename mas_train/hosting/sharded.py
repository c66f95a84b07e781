"""Sharded model groups: one group's GRPO update on N processes, its parameters, gradients and optimizer state
sharded by PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

A group with ``num_ranks: N > 1`` keeps its worker (:class:`~mas_train.hosting.worker.ModelGroupWorker`: tokenizer,
generation backend, checkpoint folder) where the pool puts it, and :class:`ShardedRanks` starts N rank processes
(``torch.multiprocessing`` spawn) that each load the group's model, wrap every decoder layer and then the whole
model with ``fully_shard`` over one process group (gloo on CPU, NCCL on GPUs), and build the group's
:class:`~mas_train.grpo.update.GroupGRPOTrainer` on the sharded model, so TRL's optimizer holds only each rank's shard
of the AdamW moments. Under ``pool: local`` the ranks are children of the worker's process (the driver);
under ``pool: ray`` :class:`~mas_train.hosting.sharded_ray.RayRanks` starts them as N Ray actors, rank r pinned to the group's r-th rank bundle
of the run's placement group (:func:`~mas_train.hosting.ray_pool.bundle_layout`: one bundle per rank, one GPU each on
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

import logging
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from mas_train.hosting.policy import GroupState, Tensors, check_weights_kind, load_full_weights, require_files
from mas_train.hosting.sharded_rank import DEFAULT_TIMEOUT_S, RankFailure, rank_main
from mas_train.models import hf_progress_bars_off
from mas_train.net import free_port

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

    from mas_train.config import ResolvedConfig
    from mas_train.hosting.protocols import RankInfo, Ranks
    from mas_train.samples import Sample

__all__ = ["DEFAULT_TIMEOUT_S", "RankFailure", "ShardedPolicy", "ShardedRanks"]

logger = logging.getLogger(__name__)


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

    def __init__(self, resolved: ResolvedConfig, group: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
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

    def info(self) -> list[RankInfo]:
        """Per rank, rank 0 first: ``rank``, ``pid``, ``node`` (host name); ``actor_id`` and ``bundle`` are
        ``None`` (local processes; see :meth:`~mas_train.hosting.sharded_ray.RayRanks.info`)."""
        node = socket.gethostname()
        return [
            {"rank": r, "pid": p.pid, "node": node, "actor_id": None, "bundle": None}
            for r, p in enumerate(self._procs)
        ]

    def start(self) -> ShardedRanks:
        """Spawn the ranks (they load the model and shard it in the background; the first call waits)."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{free_port()}"
        for rank in range(self.num_ranks):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(
                target=rank_main,
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

    def call(self, cmd: str, *args: object) -> list[Any]:
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

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        """One sharded GRPO update; rank 0's metrics (``loss`` summed over every rank's micro-batches; TRL's
        per-token metrics over rank 0's micro-batches)."""
        metrics: dict[str, float] = self.call("update", list(samples), [float(a) for a in advantages])[0]
        return metrics

    def sizes(self) -> list[dict[str, int]]:
        """Per rank, the elements of its parameter shards (``params``) and optimizer state (``optimizer``)."""
        return self.call("sizes")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights (state-dict names, CPU tensors), gathered from the shards onto rank 0."""
        sd: dict[str, torch.Tensor] = self.call("state_dict")[0]
        return sd

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


class ShardedPolicy:
    """``num_ranks > 1``: the ranks (:class:`~mas_train.hosting.sharded.ShardedRanks`, or
    :class:`~mas_train.hosting.sharded_ray.RayRanks` under ``pool: ray``) hold the trained, FSDP2-sharded model
    and its optimizer shards; this process keeps a full copy that follows every sync (the backend's source and
    what :meth:`save` writes). Per-agent gradient norms are not measured sharded."""

    trains = True
    adapter: str | None = None
    shared_base: PeftModel | None = None

    def __init__(
        self,
        group: str,
        model_path: str,
        ranks: Ranks,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
    ) -> None:
        self.group, self.model_path, self.tokenizer = group, model_path, tokenizer
        self.ranks = ranks
        model.eval().requires_grad_(False)
        self.generation_model = model
        self.num_parameters = sum(p.numel() for p in model.parameters())

    def activate(self, *, training: bool) -> None:
        pass

    def update(
        self, samples: Sequence[Sample], advantages: Sequence[float], *, agent_grad_norms: bool
    ) -> dict[str, float]:
        return self.ranks.update(samples, advantages)

    def parameters_for_sync(self) -> Tensors | None:
        """The full weights gathered from the ranks, copied into this process's full copy too."""
        sd = self.ranks.full_state_dict()
        self.generation_model.load_state_dict(sd, strict=False)
        return sd

    def save(self, folder: Path) -> GroupState:
        out = folder / "model"
        out.mkdir(exist_ok=True)
        self.parameters_for_sync()
        with hf_progress_bars_off():
            self.generation_model.save_pretrained(out)
            self.tokenizer.save_pretrained(out)
        return {"global_step": self.ranks.save(str(folder)), "num_ranks": self.ranks.num_ranks}

    def load(self, folder: Path, state: GroupState, *, optimizer: bool) -> Tensors | None:
        check_weights_kind(state, self.group, lora_policy=False)
        if optimizer:
            require_files(folder, self.group, "model", "optimizer.pt", "scheduler.pt")
        load_full_weights(self.generation_model, folder, self.group, self.model_path)
        # each rank keeps its shard (with the optimizer state when asked)
        step = int(state.get("global_step", 0)) if optimizer else 0
        self.ranks.load(str(folder), optimizer=optimizer, global_step=step)
        return cast(Tensors, self.generation_model.state_dict())

    def close(self) -> None:
        self.ranks.close()

"""The inside of a sharded model group's rank process (or Ray actor): FSDP2 over the group's model, the group's
GRPO update on this rank's share of the micro-batches, and the optimizer state conversions that keep a sharded
group's ``optimizer.pt`` in ``torch.optim``'s own format (see :mod:`mas_train.hosting.sharded`)."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from mas_train.checkpoint import load_state

if TYPE_CHECKING:
    from mas_train.config import ResolvedConfig
    from mas_train.samples import Sample

_T = TypeVar("_T")

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Rank",
    "RankFailure",
    "optimizer_state_by_index",
    "rank_main",
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

    def __reduce__(self) -> tuple[Callable[..., RankFailure], tuple[Any, ...]]:
        # pickles (Ray sends a worker actor's exceptions to the driver): group and rank are keyword-only
        return (functools.partial(type(self), group=self.group, rank=self.rank), self.args)


def shard_model(model: torch.nn.Module, mesh: Any) -> None:
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


def rank_share(mbs: Sequence[_T], *, rank: int, world: int) -> tuple[list[_T], list[float]]:
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


def _param_order(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the order ``optimizer.state_dict()`` numbers them (param group by param group)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def optimizer_state_by_index(state: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """A name-keyed optimizer state (``get_optimizer_state_dict(full_state_dict=True)``) in ``torch.optim``'s
    index-keyed format (``order[i]`` is parameter i), the format an unsharded group's ``optimizer.pt`` has."""
    index = {n: i for i, n in enumerate(order)}
    return {
        "state": {index[n]: v for n, v in state["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]],
    }


def _optimizer_state_by_name(state: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """The inverse of :func:`optimizer_state_by_index`."""
    return {
        "state": {order[int(i)]: v for i, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [order[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }


class Rank:
    """One rank of a sharded group, inside its own process: the process group, the sharded model, the trainer."""

    def __init__(
        self,
        resolved: ResolvedConfig,
        group: str,
        rank: int,
        world: int,
        init_method: str,
        timeout_s: float,
        gpu: int | None = None,
    ) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from transformers.utils import logging as hf_logging

        from mas_train.grpo.build import build_group_trainer
        from mas_train.grpo.update import ShardPlan
        from mas_train.models import (
            load_model_and_tokenizer,
            resolve_device,
            resolve_dtype,
            resolve_model_path,
        )

        g = resolved.model_groups[group]
        device = resolve_device(resolved.config.device)
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
            resolve_model_path(g.model),
            dtype=resolve_dtype(g.dtype, device, lora=g.lora is not None),
            device=device,
        )
        shard_model(model, mesh)  # before the trainer, so its optimizer holds the shards
        # transformers warns that a process group exists without a DDP launch: intended, FSDP owns the group and
        # accelerate stays single-process (TRL's metric gathers must not become collectives)
        logging.getLogger("transformers.training_args").addFilter(
            lambda record: "parallel_mode != ParallelMode.DISTRIBUTED" not in record.getMessage()
        )
        self.model = model
        plan = ShardPlan(world=world, share=functools.partial(rank_share, rank=rank, world=world))
        self.trainer = build_group_trainer(resolved, group, model, tok, device, shard=plan)

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
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
            out = Path(folder)
            order = _param_order(self.model, t.optimizer)
            torch.save(optimizer_state_by_index(osd, order), out / "optimizer.pt")
            torch.save(t.lr_scheduler.state_dict(), out / "scheduler.pt")
        return int(t.state.global_step)

    def load(self, folder: str, optimizer: bool, global_step: int) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )
        from transformers import AutoModelForCausalLM

        src = Path(folder)
        t = self.trainer
        saved = AutoModelForCausalLM.from_pretrained(src / "model", dtype=self.model.dtype)
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
            plain = cast(
                "dict[str, Any]", load_state(src / "optimizer.pt")
            )  # torch.optim's state_dict format
            osd = _optimizer_state_by_name(plain, _param_order(self.model, t.optimizer))
            set_optimizer_state_dict(
                self.model, t.optimizer, optim_state_dict=osd, options=StateDictOptions(full_state_dict=True)
            )
            t.lr_scheduler.load_state_dict(load_state(src / "scheduler.pt"))
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


def rank_main(
    resolved: ResolvedConfig,
    group: str,
    rank: int,
    world: int,
    init_method: str,
    timeout_s: float,
    conn: Connection,
    parent: int,
) -> None:
    """A rank process's main loop: build the :class:`Rank`, then run the commands ``conn`` brings (a method
    name and its arguments) until ``stop``, answering ``("ok", result)`` or ``("error", message, traceback)``;
    exits when ``parent`` (the worker's pid) is gone."""
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    r = None
    try:
        r = Rank(resolved, group, rank, world, init_method, timeout_s)
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

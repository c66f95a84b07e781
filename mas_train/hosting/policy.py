"""How a model group is hosted: one :class:`GroupPolicy` class per hosting mode.

A policy owns a group's weights, its optimizer state and its checkpoint files; the worker
(:class:`~mas_train.hosting.worker.ModelGroupWorker`) composes one policy with one generation backend and
switches on nothing. :func:`~mas_train.hosting.worker.make_policy` picks the class once, from the group's settings:

============================  ==========================================================================
class                         hosting mode
============================  ==========================================================================
:class:`RemotePolicy`         an endpoint generates (``openai``, a served engine): a tokenizer, no weights
:class:`FrozenPolicy`         a local model that is never trained here (``trainable: false``, ``mas-eval``)
:class:`FullPolicy`           all weights trained by the group's own GRPO update and AdamW
:class:`LoraPolicy`           a trained PEFT LoRA adapter on a base model other groups' adapters may share
:class:`FrozenLoraPolicy`     a LoRA adapter that only generates (a frozen agent under shared_lora, mas-eval)
:class:`~.sharded.ShardedPolicy` the update on ``num_ranks`` FSDP2 ranks; this process keeps a full copy
============================  ==========================================================================

Every class passes the same contract suite (:mod:`mas_train.hosting.testing`). Checkpoint layout of a group
folder (the worker writes ``state.json``; the policy the rest): ``model/`` (Hugging Face format) or
``adapter/`` (PEFT format), ``optimizer.pt``, ``scheduler.pt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, cast, runtime_checkable

import torch

from mas_train import lora
from mas_train.checkpoint import load_state
from mas_train.grpo.trl_adapter import fused_forward, restore_fused_forward
from mas_train.grpo.update import GroupGRPOTrainer
from mas_train.models import hf_progress_bars_off
from mas_train.samples import Sample

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

    from mas_train.config import LoraConfig

__all__ = [
    "GroupState",
    "FrozenLoraPolicy",
    "FrozenPolicy",
    "FullPolicy",
    "GroupPolicy",
    "LoraPolicy",
    "RemotePolicy",
    "Tensors",
    "check_weights_kind",
    "load_full_weights",
    "require_files",
]

Tensors = dict[str, torch.Tensor]


class GroupState(TypedDict, total=False):
    """A model group's ``state.json`` in its checkpoint folder: the worker's entries (``updates``, ``group``,
    ``agents``, ``model``, ``trainable``, ``lora``) and its policy's (``global_step`` of a TRL trainer,
    ``num_ranks`` of a sharded group)."""

    updates: int
    group: str
    agents: list[str]
    model: str
    trainable: bool
    lora: bool
    global_step: int
    num_ranks: int


@runtime_checkable
class GroupPolicy(Protocol):
    """One model group's trainable state, whatever hosts it.

    Attributes:
        group: the model group's name.
        model_path: the local folder or hub id the weights came from.
        tokenizer: the group's tokenizer (left padding, pad token set).
        trains: whether :meth:`update` may be called.
        num_parameters: trainable parameters (0 for a policy that does not train; the adapter's for LoRA).
        generation_model: the module a local backend samples with; ``None`` for a remote endpoint.
        adapter: the LoRA adapter's name, or ``None``.
        shared_base: the ``peft.PeftModel`` this policy's adapter lives on (other groups' adapters may share
            it: one mixed-adapter batch serves them all), or ``None``.
    """

    group: str
    model_path: str
    tokenizer: PreTrainedTokenizerBase
    trains: bool
    num_parameters: int
    generation_model: torch.nn.Module | None
    adapter: str | None
    shared_base: PeftModel | None

    def activate(self, *, training: bool) -> None:
        """Put this group's weights in place on a model other groups share (before generating or training)."""
        ...

    def update(
        self, samples: Sequence[Sample], advantages: Sequence[float], *, agent_grad_norms: bool
    ) -> dict[str, float]:
        """One GRPO update on the group's samples; see :meth:`GroupGRPOTrainer.update`.

        Raises:
            RuntimeError: the policy does not train.
        """
        ...

    def parameters_for_sync(self) -> Tensors | None:
        """The tensors a weight sync pushes to the backend (state-dict or PEFT names); ``None``: nothing."""
        ...

    def save(self, folder: Path) -> GroupState:
        """Write the policy's files under ``folder``; returns extra ``state.json`` entries."""
        ...

    def load(self, folder: Path, state: GroupState, *, optimizer: bool) -> Tensors | None:
        """Load what :meth:`save` wrote (``state``: the folder's ``state.json``), with the optimizer state when
        ``optimizer``; returns the tensors to push to the backend, ``None`` when nothing was loaded.

        Raises:
            FileNotFoundError: a file is missing. RuntimeError: the weights do not fit this group's model.
        """
        ...

    def close(self) -> None:
        """Release what the policy started (a sharded group's ranks)."""
        ...


def require_files(folder: Path, group: str, *names: str) -> None:
    for name in names:
        if not (folder / name).exists():
            raise FileNotFoundError(f"checkpoint of group {group!r} lacks {folder / name}")


def check_weights_kind(state: GroupState, group: str, *, lora_policy: bool) -> None:
    if bool(state.get("lora", False)) != lora_policy:
        saved, mine = ("a LoRA adapter", "full") if state.get("lora") else ("full weights", "LoRA")
        raise RuntimeError(
            f"checkpoint of group {group!r} holds {saved} but the group is configured for {mine} "
            "training; use the run's model_sharing / lora settings"
        )


def load_full_weights(module: torch.nn.Module, folder: Path, group: str, model_path: str) -> None:
    """Load ``folder/model`` (a Hugging Face folder) into ``module`` in place.

    Raises:
        FileNotFoundError: no ``model/``. RuntimeError: the weights do not fit (another model).
    """
    from transformers import AutoModelForCausalLM

    require_files(folder, group, "model")
    with hf_progress_bars_off():
        saved = AutoModelForCausalLM.from_pretrained(folder / "model", dtype=next(module.parameters()).dtype)
    try:
        missing, unexpected = module.load_state_dict(saved.state_dict(), strict=False)
    except RuntimeError as err:  # shape mismatch: another model's weights
        raise RuntimeError(
            f"checkpoint of group {group!r} does not fit its model {model_path!r}: {str(err).splitlines()[0]}"
        ) from None
    # Tied weights (lm_head = embed_tokens) are not stored twice; anything else missing is an error.
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"checkpoint of group {group!r} does not fit: missing {missing}, extra {unexpected}"
        )


def save_trainer_state(trainer: GroupGRPOTrainer, folder: Path) -> GroupState:
    torch.save(trainer.optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(trainer.lr_scheduler.state_dict(), folder / "scheduler.pt")
    return {"global_step": trainer.state.global_step}


def _loadsave_trainer_state(trainer: GroupGRPOTrainer, folder: Path, state: GroupState) -> None:
    trainer.optimizer.load_state_dict(load_state(folder / "optimizer.pt"))
    trainer.lr_scheduler.load_state_dict(load_state(folder / "scheduler.pt"))
    trainer.state.global_step = int(state["global_step"])


def trainable_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


class _GeneratesOnly:
    """What every policy that never trains shares: no update (calling it is a bug, named in the error), no
    weights to push to a backend, nothing of its own to save."""

    group: str
    why_no_update = "is frozen (trainable: false)"

    def update(
        self, samples: Sequence[Sample], advantages: Sequence[float], *, agent_grad_norms: bool
    ) -> dict[str, float]:
        raise RuntimeError(f"model group {self.group!r} {self.why_no_update}; it has no update")

    def parameters_for_sync(self) -> Tensors | None:
        return None

    def save(self, folder: Path) -> GroupState:
        return {}


class RemotePolicy(_GeneratesOnly):
    """An endpoint generates (``backend_kind(...).can_train`` is false): the group keeps only its tokenizer
    (prompt ids and lengths); no weights, nothing to update, save or load."""

    trains = False
    num_parameters = 0
    why_no_update = "is served by an endpoint"
    generation_model: torch.nn.Module | None = None
    adapter: str | None = None
    shared_base: PeftModel | None = None

    def __init__(self, group: str, model_path: str, tokenizer: PreTrainedTokenizerBase) -> None:
        self.group, self.model_path, self.tokenizer = group, model_path, tokenizer

    def activate(self, *, training: bool) -> None:
        pass

    def load(self, folder: Path, state: GroupState, *, optimizer: bool) -> Tensors | None:
        return None

    def close(self) -> None:
        pass


class FrozenPolicy(_GeneratesOnly):
    """A local model that is never trained in this process: a ``trainable: false`` group (it acts and is logged;
    its weights are its ``model`` setting's, so it saves nothing), or any group under ``mas-eval``, which loads a
    checkpoint's full weights when the checkpoint holds them."""

    trains = False
    num_parameters = 0
    adapter: str | None = None
    shared_base: PeftModel | None = None

    def __init__(
        self, group: str, model_path: str, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        model.eval().requires_grad_(False)
        self.group, self.model_path, self.tokenizer = group, model_path, tokenizer
        self.generation_model = model

    def activate(self, *, training: bool) -> None:
        pass

    def load(self, folder: Path, state: GroupState, *, optimizer: bool) -> Tensors | None:
        if not state.get("trainable", True):
            return None  # saved frozen: the weights are the model setting's
        check_weights_kind(state, self.group, lora_policy=False)
        load_full_weights(self.generation_model, folder, self.group, self.model_path)
        return cast(Tensors, self.generation_model.state_dict())

    def close(self) -> None:
        pass


class FullPolicy:
    """All weights trained: the group's :class:`~mas_train.grpo.update.GroupGRPOTrainer` (TRL's AdamW and
    scheduler) on its own copy of the model; checkpoints hold ``model/``, ``optimizer.pt``, ``scheduler.pt``."""

    trains = True
    adapter: str | None = None
    shared_base: PeftModel | None = None

    def __init__(
        self, group: str, model_path: str, trainer: GroupGRPOTrainer, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.group, self.model_path, self.tokenizer = group, model_path, tokenizer
        self.trainer = trainer
        self.generation_model = trainer.model
        self.num_parameters = trainable_count(trainer.model)

    @property
    def module(self) -> torch.nn.Module:
        """The policy without accelerate's wrappers (what is saved and synced)."""
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def activate(self, *, training: bool) -> None:
        pass

    def update(
        self, samples: Sequence[Sample], advantages: Sequence[float], *, agent_grad_norms: bool
    ) -> dict[str, float]:
        return self.trainer.update(samples, advantages, agent_grad_norms=agent_grad_norms)

    def parameters_for_sync(self) -> Tensors | None:
        return cast(Tensors, self.module.state_dict())

    def save(self, folder: Path) -> GroupState:
        out = folder / "model"
        out.mkdir(exist_ok=True)
        with hf_progress_bars_off():
            self.module.save_pretrained(out)
            self.tokenizer.save_pretrained(out)
        return save_trainer_state(self.trainer, folder)

    def load(self, folder: Path, state: GroupState, *, optimizer: bool) -> Tensors | None:
        check_weights_kind(state, self.group, lora_policy=False)
        if optimizer:
            require_files(folder, self.group, "model", "optimizer.pt", "scheduler.pt")
        load_full_weights(self.module, folder, self.group, self.model_path)
        if optimizer:
            _loadsave_trainer_state(self.trainer, folder, state)
        return cast(Tensors, self.module.state_dict())

    def close(self) -> None:
        pass


class LoraPolicy:
    """A trained PEFT LoRA adapter named after the group on a ``peft.PeftModel`` that other groups' adapters may
    share (``model_sharing: shared_lora``: one copy of the base weights). Only the adapter's parameters have
    ``requires_grad`` and sit in the optimizer; a weight sync pushes only the adapter's tensors; checkpoints
    hold the adapter in PEFT's format (``adapter/``; ``PeftModel.from_pretrained(base, folder / "adapter")``).
    An adapter that only generates is a :class:`FrozenLoraPolicy`.
    """

    trains = True

    def __init__(
        self,
        group: str,
        model_path: str,
        peft_model: PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        lora_cfg: LoraConfig,
        trainer: GroupGRPOTrainer,
    ) -> None:
        self.group, self.model_path, self.tokenizer = group, model_path, tokenizer
        self.adapter: str | None = group
        self.shared_base: PeftModel | None = peft_model
        self.lora = lora_cfg
        self.trainer = trainer
        self.generation_model = trainer.model
        self.num_parameters = trainable_count(self.generation_model)
        # TRL patched the base model's forward with its fused LM head at this group's temperature; groups sharing
        # one base each put their own patch back before they train (activate).
        self._fused_forward = fused_forward(peft_model)

    def activate(self, *, training: bool) -> None:
        lora.activate(self.shared_base, self.group, trainable=True)
        if training:
            restore_fused_forward(self.shared_base, self._fused_forward)
            # TRL's disable_dropout (of every group built after this one, too) zeroes LoRA dropout
            lora.restore_dropout(self.shared_base, self.group, self.lora.dropout)

    def update(
        self, samples: Sequence[Sample], advantages: Sequence[float], *, agent_grad_norms: bool
    ) -> dict[str, float]:
        return self.trainer.update(samples, advantages, agent_grad_norms=agent_grad_norms)

    def parameters_for_sync(self) -> Tensors | None:
        return lora.adapter_state(self.shared_base, self.group)

    def save(self, folder: Path) -> GroupState:
        out = folder / "adapter"
        out.mkdir(exist_ok=True)
        with hf_progress_bars_off():
            lora.save(self.shared_base, self.group, out)
            self.tokenizer.save_pretrained(out)
        return save_trainer_state(self.trainer, folder)

    def load(self, folder: Path, state: GroupState, *, optimizer: bool) -> Tensors | None:
        if not state.get("trainable", True):
            return None
        check_weights_kind(state, self.group, lora_policy=True)
        require_files(folder, self.group, "adapter", *(("optimizer.pt", "scheduler.pt") if optimizer else ()))
        lora.load(self.shared_base, self.group, folder / "adapter")
        if optimizer:
            _loadsave_trainer_state(self.trainer, folder, state)
        return lora.adapter_state(self.shared_base, self.group)

    def close(self) -> None:
        pass


class FrozenLoraPolicy(_GeneratesOnly):
    """A LoRA adapter that only generates: a frozen agent under ``shared_lora`` (its adapter stays as
    initialised, saves nothing), or any LoRA group under ``mas-eval``, which loads a checkpoint's adapter."""

    trains = False
    num_parameters = 0

    def __init__(
        self, group: str, model_path: str, peft_model: PeftModel, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.group, self.model_path, self.tokenizer = group, model_path, tokenizer
        self.adapter: str | None = group
        self.shared_base: PeftModel | None = peft_model
        peft_model.eval()
        self.generation_model = peft_model

    def activate(self, *, training: bool) -> None:
        lora.activate(self.shared_base, self.group, trainable=False)

    def load(self, folder: Path, state: GroupState, *, optimizer: bool) -> Tensors | None:
        if not state.get("trainable", True):
            return None  # saved frozen: its adapter is the initial one
        check_weights_kind(state, self.group, lora_policy=True)
        require_files(folder, self.group, "adapter")
        lora.load(self.shared_base, self.group, folder / "adapter")
        return lora.adapter_state(self.shared_base, self.group)

    def close(self) -> None:
        pass

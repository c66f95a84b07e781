"""LoRA adapters of model groups, on PEFT (``peft`` on PyPI): wrapping, switching, saving and loading.

A model group with a ``lora`` section trains a LoRA adapter (Hu et al. 2021: ``W + (alpha / r) · B A`` on each
target module, ``B`` initialised to zero so the adapter starts as the base model) named after the group. With
``model_sharing: shared_lora`` every group of the run sits on **one** ``peft.PeftModel``: the first group's
worker loads the base and creates the PeftModel with its adapter (:func:`wrap`), every other group adds its own
adapter to that object (:func:`add`). Before a group generates or updates, :func:`activate` makes its adapter the
only one in the forward pass and the only one with ``requires_grad`` (PEFT's ``set_adapter``), so a group's
optimizer, built while its adapter is active, holds only that adapter's parameters and its update can never
move another adapter or the base weights.

Checkpoint format (:func:`save`): PEFT's own, ``adapter_config.json`` + ``adapter_model.safetensors`` written by
``PeftModel.save_pretrained``, so ``PeftModel.from_pretrained(base, folder)`` loads it anywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import peft
    import torch
    from transformers import PreTrainedModel

    from mas_train.config import LoraConfig

__all__ = [
    "activate",
    "adapter_names",
    "adapter_state",
    "add",
    "is_adapter_param",
    "load",
    "peft_config",
    "restore_dropout",
    "save",
    "wrap",
]


def peft_config(lora: LoraConfig) -> peft.LoraConfig:
    """``peft.LoraConfig`` (task ``CAUSAL_LM``) of a :class:`mas_train.config.LoraConfig` (r, alpha, dropout,
    target_modules)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=int(lora.r),
        lora_alpha=int(lora.alpha),
        lora_dropout=float(lora.dropout),
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def _check_targets(model: torch.nn.Module, lora: LoraConfig) -> None:
    # PEFT's own error for a name that matches nothing lists every module of the model; say what to do instead.
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in lora.target_modules if t not in names]
    if missing:
        raise ValueError(
            f"lora.target_modules {missing} match no module of the model; linear modules it has include "
            f"{sorted(n for n in names if n.endswith('_proj'))[:12]}"
        )


def wrap(model: PreTrainedModel, lora: LoraConfig, name: str) -> peft.PeftModel:
    """Wrap a ``transformers`` causal LM into a ``peft.PeftModel`` with one adapter called ``name``; the base
    weights are frozen (``requires_grad`` False), the adapter is active and trainable.

    Raises:
        ValueError: a target module the model does not have.
    """
    from peft import get_peft_model

    _check_targets(model, lora)
    return get_peft_model(model, peft_config(lora), adapter_name=name)


def add(peft_model: peft.PeftModel, lora: LoraConfig, name: str) -> None:
    """Add a fresh adapter ``name`` to a ``PeftModel`` (another agent's adapter on the same base).

    Raises:
        ValueError: an adapter of that name exists already, or a target module the model does not have.
    """
    if name in peft_model.peft_config:
        raise ValueError(f"the shared base model already has an adapter named {name!r}")
    _check_targets(peft_model.get_base_model(), lora)
    peft_model.add_adapter(name, peft_config(lora))


def adapter_names(peft_model: peft.PeftModel) -> list[str]:
    """The adapters of a ``PeftModel``, in the order they were added."""
    return list(peft_model.peft_config)


def is_adapter_param(param_name: str, name: str) -> bool:
    """Whether a PeftModel parameter name (``...q_proj.lora_A.<name>.weight``) belongs to adapter ``name``."""
    return re.search(rf"\.lora_[A-Za-z_]+\.{re.escape(name)}\.", param_name) is not None


def activate(peft_model: peft.PeftModel, name: str, *, trainable: bool = True) -> None:
    """Make adapter ``name`` the one the forward pass uses (PEFT's ``set_adapter``). Its parameters get
    ``requires_grad = trainable``; every other adapter's get False; the base stays frozen."""
    peft_model.set_adapter(name, inference_mode=not trainable)


@contextlib.contextmanager
def preserving_state(peft_model: peft.PeftModel) -> Iterator[None]:
    """Put back, on exit, the active adapters and every parameter's ``requires_grad`` of ``peft_model``: PEFT's
    ``add_adapter`` and ``set_adapter`` change both, and a frozen league snapshot (:mod:`mas_train.league`) is added
    to, or scored with, the model a group is training."""
    active = list(peft_model.active_adapters)
    grads = {n: p.requires_grad for n, p in peft_model.named_parameters()}
    try:
        yield
    finally:
        peft_model.base_model.set_adapter(active if len(active) > 1 else active[0])
        for n, p in peft_model.named_parameters():
            p.requires_grad_(grads.get(n, False))


def restore_dropout(peft_model: peft.PeftModel, name: str, p: float) -> None:
    """Set adapter ``name``'s LoRA dropout back to ``p``: TRL's ``disable_dropout`` (which the update needs for
    the base model's own dropout, so the logprobs it trains on are the sampled ones) also zeroes LoRA's."""
    import torch

    for module in peft_model.modules():
        drop = getattr(module, "lora_dropout", None)
        if (
            isinstance(drop, torch.nn.ModuleDict)
            and name in drop
            and isinstance(drop[name], torch.nn.Dropout)
        ):
            drop[name].p = float(p)


def adapter_state(peft_model: peft.PeftModel, name: str) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the PeftModel's own ``state_dict`` names (what a backend copy needs)."""
    return {n: p for n, p in peft_model.named_parameters() if is_adapter_param(n, name)}


def save(peft_model: peft.PeftModel, name: str, folder: str | Path) -> None:
    """Write adapter ``name`` in PEFT's format into ``folder`` (``adapter_config.json``,
    ``adapter_model.safetensors``) with ``PeftModel.save_pretrained``."""
    folder = Path(folder)
    staging = folder.parent / f".{folder.name}.peft"
    if staging.exists():
        shutil.rmtree(staging)
    peft_model.save_pretrained(str(staging), selected_adapters=[name], safe_serialization=True)
    # PEFT writes a non-"default" adapter into a sub-folder named after it.
    written = staging if name == "default" else staging / name
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(written, folder)
    shutil.rmtree(staging, ignore_errors=True)


def load(peft_model: peft.PeftModel, name: str, folder: str | Path) -> None:
    """Load a PEFT adapter folder's weights into adapter ``name`` (PEFT's ``load_peft_weights`` and
    ``set_peft_model_state_dict``).

    Raises:
        FileNotFoundError: ``folder`` has no ``adapter_config.json``.
        RuntimeError: its rank, target modules or tensors do not fit the adapter.
    """
    from peft import PeftConfig
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a PEFT adapter folder (no adapter_config.json)")
    saved = PeftConfig.from_pretrained(str(folder))
    mine = peft_model.peft_config[name]
    if int(saved.r) != int(mine.r) or set(saved.target_modules) != set(mine.target_modules):
        raise RuntimeError(
            f"adapter {folder} (r={saved.r}, targets {sorted(saved.target_modules)}) does not fit adapter "
            f"{name!r} (r={mine.r}, targets {sorted(mine.target_modules)}); use the run's lora settings"
        )
    weights = load_peft_weights(str(folder), device=str(next(peft_model.parameters()).device))
    result = set_peft_model_state_dict(peft_model, weights, adapter_name=name)
    missing = [k for k in result.missing_keys if is_adapter_param(k, name)]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"adapter {folder} does not fit adapter {name!r}: missing {missing[:3]}, "
            f"extra {list(result.unexpected_keys)[:3]}"
        )

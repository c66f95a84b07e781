"""Which dtype a model group trains and samples in: the one rule behind ``dtype: auto``.

``dtype: auto`` picks, per model group and device:

* **GPU**: bf16 weights and bf16 autocast (TRL's ``bf16=True``).
* **CPU with native bf16** (the ``amx_bf16`` or ``avx512_bf16`` CPU flag, and a oneDNN build with a bf16 path,
  ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``): a LoRA group loads its frozen base weights in bf16 (PEFT
  keeps the adapters in fp32, ``autocast_adapter_dtype=True``; so are their AdamW moments), no autocast; a
  full fine-tuning group keeps fp32 master weights and fp32 AdamW and runs its forward and backward under
  ``torch.autocast("cpu", dtype=torch.bfloat16)`` (TRL's ``bf16=True``, which accelerate turns into CPU autocast).
* **CPU without native bf16** (e.g. AVX2 only): fp32 everywhere. bf16 would run, emulated, several times slower.

An explicit ``dtype`` (``float32``, ``bfloat16``, ``float16``) is the weights' dtype as given; ``bfloat16`` also
turns on bf16 autocast, as it always has. ``--dtype float32`` therefore forces fp32 everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mas_train.config import ResolvedModelGroup

__all__ = [
    "NATIVE_BF16_FLAGS",
    "Precision",
    "cpu_native_bf16",
    "native_bf16_from_flags",
    "resolve_precision",
    "tis_rule",
]

#: CPU flags (``/proc/cpuinfo``) of units that compute bf16 products natively: Intel AMX, AVX-512 BF16 (Intel
#: Cooper Lake and later, AMD Zen 4 and later)
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class Precision:
    """What a model group computes in.

    Attributes:
        weights: the dtype its weights are loaded in (``"float32"``, ``"bfloat16"``, ``"float16"``).
        autocast: whether its training forward and backward run under bf16 autocast (TRL's ``bf16=True``).
        reason: one phrase for the start-up banner, e.g. ``"fp32: CPU has no native bf16 (AVX2)"``.
    """

    weights: str
    autocast: bool
    reason: str

    @property
    def computes_fp32(self) -> bool:
        """Whether every product of the training forward is fp32 (fp32 weights, no autocast)."""
        return self.weights == "float32" and not self.autocast


def native_bf16_from_flags(flags: Iterable[str], onednn_bf16: bool) -> tuple[bool, str]:
    """Whether a CPU with these ``/proc/cpuinfo`` flags computes bf16 natively here, and why (one phrase).

    Args:
        flags: the CPU's flags (``"avx2"``, ``"amx_bf16"``, ...).
        onednn_bf16: what ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` reports: torch's bf16 GEMMs go through
            oneDNN, so a flag without it is not a usable native path.

    Returns:
        ``(native, reason)``, e.g. ``(True, "CPU has amx_bf16")`` or ``(False, "CPU has no native bf16 (AVX2)")``.
    """
    have = set(flags)
    found = [f for f in NATIVE_BF16_FLAGS if f in have]
    if found and onednn_bf16:
        return True, f"CPU has {', '.join(found)}"
    if found:
        return False, f"CPU has {', '.join(found)} but this torch build's oneDNN has no bf16 path"
    if "avx512f" in have:
        isa = "AVX-512 without BF16"
    elif "avx2" in have:
        isa = "AVX2"
    elif have:
        isa = "no AVX2"
    else:
        isa = "CPU flags not readable"
    return False, f"CPU has no native bf16 ({isa})"


@functools.lru_cache(maxsize=1)
def cpu_native_bf16() -> tuple[bool, str]:
    """Whether this machine's CPU computes bf16 natively (see :func:`native_bf16_from_flags`): reads the flags of
    ``/proc/cpuinfo`` (none where it does not exist, e.g. macOS: then ``False``) and asks torch's oneDNN.

    Returns:
        ``(native, reason)``; cached for the process.
    """
    import torch

    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    mkldnn = getattr(torch.ops, "mkldnn", None)
    probe = getattr(mkldnn, "_is_mkldnn_bf16_supported", None)
    onednn = bool(torch.backends.mkldnn.is_available() and probe is not None and probe())
    return native_bf16_from_flags(flags, onednn)


def resolve_precision(
    dtype: str, device: str, *, lora: bool, native: tuple[bool, str] | None = None
) -> Precision:
    """The :class:`Precision` a model group's ``dtype`` setting gives on ``device`` (module docstring).

    Args:
        dtype: ``"auto"``, ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: the torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        lora: whether the group trains a LoRA adapter (its base weights are frozen).
        native: ``(native, reason)`` of the CPU; ``None``: :func:`cpu_native_bf16` (read only for CPU + auto).
    """
    if dtype != "auto":
        return Precision(dtype, dtype == "bfloat16", f"{dtype}: as set (dtype: {dtype})")
    if device.startswith("cuda"):
        return Precision("bfloat16", True, "bf16 weights and autocast: GPU")
    ok, why = cpu_native_bf16() if native is None else native
    if not ok:
        return Precision("float32", False, f"fp32: {why}")
    if lora:
        return Precision("bfloat16", False, f"bf16 base weights, fp32 LoRA adapters and AdamW: {why}")
    return Precision("float32", True, f"fp32 master weights and AdamW, bf16 autocast: {why}")


def tis_rule(group: ResolvedModelGroup, precision: Precision) -> tuple[bool, str]:
    """Whether model group ``group``'s update applies the importance-sampling correction, and why.

    The correction (TRL's ``vllm_importance_sampling_*``, :mod:`mas_train.grpo.importance`) corrects for a sampler
    whose logprobs are not the trainer's. It is applied where the two differ and nowhere else:

    * another engine samples (every backend but ``hf``: vLLM, SGLang, a server): always;
    * the ``hf`` backend samples with the trainer's own weights and kernels family; its logprobs equal the
      trainer's to fp32 rounding (~1e-6) when both compute in fp32, so the correction is off there, and on when
      either side computes in bf16 or fp16 (a bf16 private copy, a bf16 base, bf16 autocast: ~1e-2 apart).

    ``grpo.vllm_importance_sampling_correction`` set explicitly wins either way.

    Args:
        group: a resolved model group (``backend``, ``backend_options``, ``grpo_config_kwargs()``).
        precision: the group's :func:`resolve_precision`.
    """
    given = group.grpo_config_kwargs().get("vllm_importance_sampling_correction")
    if given is not None:
        return bool(given), "as set (grpo.vllm_importance_sampling_correction)"
    if group.backend != "hf":
        return True, f"the {group.backend} backend samples with its own kernels"
    from mas_train.backends.options import HFOptions

    opts = group.backend_options
    sampling = (opts.dtype if isinstance(opts, HFOptions) else None) or precision.weights
    if sampling == "float32" and precision.computes_fp32:
        return False, "fp32 HF sampler and fp32 trainer"
    trainer = "bf16 autocast" if precision.autocast else precision.weights
    return True, f"HF sampler in {sampling}, trainer in {trainer}"

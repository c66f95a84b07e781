"""CPU decode kernels of :class:`~mas_train.backends.hf.HFBackend`: oneDNN-packed linear layers, one-kernel
RMSNorms and a preallocated KV cache.

**Packed linears.** A decode step multiplies a handful of rows (the live batch, 1-16) by every weight matrix of
the model, so on CPU it is bound by how fast the GEMM streams the weights from memory. PyTorch's default fp32
path (MKL ``sgemm`` with a transposed weight) re-packs the whole weight on every call and reads SmolLM2-135M's
linears at 7-9 GB/s (1-2 threads) where a plain read runs at 26-31 GB/s. oneDNN's matmul on a weight reordered
once into its blocked layout (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, the kernels
``torch.compile``'s CPU backend emits for frozen linears) reads them at 11-19 GB/s: measured on this 2-core box,
every linear of SmolLM2 at batch 8 took 48 vs 76 ms (1 thread) and 28 vs 63 ms (2 threads), and prefill-sized
products (280-1120 rows) 1.1x faster. The results differ from ``F.linear`` by float rounding only (a different
summation order: max |delta| 5e-5-1.3e-4 on SmolLM2-sized products), far inside the backend contract's 1e-3
logprob tolerance, and the sampling logprobs stay those of the logits each token was drawn from.

:class:`PackedLinears` keeps one packed copy per ``nn.Linear`` of at least :data:`MIN_PACKED_NUMEL` weights
(LoRA's rank-r factors stay as they are: too small to pay). A frozen weight (``requires_grad=False``: a LoRA
base, a backend's private copy) is repacked when its storage or its in-place version counter changed (a weight
sync's ``copy_``) or when the PEFT adapters merged into it, their factors or its PEFT wrapper changed (PEFT
merges through ``.data``, which bumps no version counter; other writes through ``.data`` go unseen). A
trainable weight, or one without a version counter (an inference tensor), is repacked on every
:meth:`PackedLinears.active`, because fused optimizers (torch's ``AdamW(fused=True)``, TRL's default
``adamw_torch_fused``) write parameters without bumping their version counter, so a step on a shared module
would otherwise go unseen (about 0.2 s per ``generate`` call for SmolLM2-135M). The linears run through the
packed copies only inside :meth:`PackedLinears.active`: a training forward on a shared module never sees them
(the packed op has no autograd). Memory: one more copy of the packed weights (0.54 GB for SmolLM2-135M in
fp32), shared by every backend over the same layers.

**One-kernel RMSNorms.** Llama's RMSNorm (copied by Qwen2/3, Mistral, SmolLM3) is 8 small ops per call, 61
calls per SmolLM2 decode step; ``F.rms_norm`` computes the same thing in one kernel, bit for bit on CPU in fp32
(tested), and :func:`fused_rms_norms` routes those classes' fp32 forwards through it while sampling (batch 8,
2 threads: 148.8 vs 140.8 tok/s).

**Preallocated KV cache.** ``DynamicLayer`` grows its keys and values with ``torch.cat`` every step: a copy of
the whole cache per layer and token. :class:`PreallocatedLayer` writes each step into a buffer with room for the
rest of the completion and returns views of its filled part: the same tensors, bit for bit, without the copies.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "MIN_PACKED_NUMEL",
    "RMS_NORMS",
    "PackedLinears",
    "PreallocatedLayer",
    "fused_rms_norms",
    "onednn_available",
    "onednn_bf16_available",
    "preallocated_cache",
]

# unit's first layer -> (the unit's layer ids, their weights' stamps, packed weight, bias): see PackedLinears.refresh
PACKS: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()

#: ``nn.Linear`` layers with fewer weights than this are not packed (LoRA's r x d factors: packing does not pay).
MIN_PACKED_NUMEL = 65536


def onednn_available() -> bool:
    """Whether this torch build has oneDNN (mkldnn) and its packed-linear ops."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return bool(
        torch.backends.mkldnn.is_available()
        and mkldnn is not None
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


def onednn_bf16_available() -> bool:
    """Whether oneDNN's bf16 linear runs on this CPU (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``: it needs
    avx512bw/vl/dq, avx_ne_convert or AMX). Without it oneDNN refuses to pack a bf16 weight, so bf16 layers are
    left to ``F.linear`` (torch's own bf16 GEMM, emulated on such a CPU)."""
    probe = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    return bool(onednn_available() and probe is not None and probe())


#: why :class:`PackedLinears` leaves bf16 layers unpacked on a CPU without oneDNN's bf16 path
BF16_UNPACKED = "oneDNN has no bf16 linear on this CPU (it needs avx512bw/vl/dq, avx_ne_convert or AMX)"


def _stamp(w: torch.Tensor) -> tuple | None:
    """What identifies a frozen weight's values: a new tensor, new storage or an in-place write (a weight sync's
    ``copy_``) change it. ``None`` for a trainable weight (fused optimizers write it without a version bump) and
    for an inference tensor (a model built under ``torch.inference_mode``: no version counter, so an in-place
    write would go unseen): their values are never assumed unchanged."""
    if w.requires_grad or w.is_inference():
        return None
    return (id(w), w.data_ptr(), w._version, tuple(w.shape), w.dtype)


class PackedLinears:
    """oneDNN-packed copies of a CPU model's large ``nn.Linear`` weights, used inside :meth:`active`.

    Sibling projections that read the same input (an attention block's ``q_proj``/``k_proj``/``v_proj``, an
    MLP's ``gate_proj``/``up_proj``; matched by name, PEFT's ``.base_layer`` included) are packed as one matrix,
    so a decode step runs 4 products per layer instead of 7: the first sibling called computes all of them and
    the others return their slice when they are called with the same input tensor (same object, unmodified);
    called with any other input a sibling computes the fused product for it, so the result is always that of
    its own weights. Measured on SmolLM2 at batch 8, 2 threads: 23.5 vs 27.0 ms for every linear of a step.

    Args:
        model: the module to generate with (fp32 or bf16, on CPU). Its ``nn.Linear`` layers with at least
            :data:`MIN_PACKED_NUMEL` weights are packed (PEFT LoRA layers: their base layers); bf16 ones only
            where :func:`onednn_bf16_available` (else they run through ``F.linear``; :attr:`skipped` says why).

    Attributes:
        skipped: ``None``, or why some large layers stay unpacked (:data:`BF16_UNPACKED`).

    Raises:
        RuntimeError: this torch build has no oneDNN packed-linear ops (see :func:`onednn_available`).
    """

    #: name suffixes of projections that share their input, fused when all of a group are packable
    SIBLINGS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))

    def __init__(self, model: torch.nn.Module) -> None:
        if not onednn_available():
            raise RuntimeError("this torch build has no oneDNN (torch.ops.mkldnn._linear_pointwise)")
        self.model = model
        self._dtypes = (torch.float32, torch.bfloat16) if onednn_bf16_available() else (torch.float32,)
        bf16 = any(type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16 for m in model.modules())
        self.skipped = BF16_UNPACKED if bf16 and torch.bfloat16 not in self._dtypes else None

    def _packable(self, m: torch.nn.Module) -> bool:
        return (
            type(m) is torch.nn.Linear
            and "forward" not in m.__dict__  # a hooked forward (accelerate) is left alone
            and m.weight.device.type == "cpu"
            and m.weight.dtype in self._dtypes
            and m.weight.numel() >= MIN_PACKED_NUMEL
        )

    def units(self) -> list[tuple[torch.nn.Linear, ...]]:
        """The packed units: tuples of sibling layers fused into one matrix, or single layers (found anew on each
        call: adapters may have been added since)."""
        named = {n: m for n, m in self.model.named_modules() if self._packable(m)}
        taken: set[str] = set()
        units: list[tuple[torch.nn.Linear, ...]] = []
        for name in named:
            for group in self.SIBLINGS:
                for suffix in ("", ".base_layer"):
                    head = f".{group[0]}{suffix}"
                    if not name.endswith(head) and name != head[1:]:
                        continue
                    stem = name[: len(name) - len(head) + 1]
                    names = [f"{stem}{g}{suffix}" for g in group]
                    ms = [named.get(n) for n in names]
                    if all(m is not None for m in ms) and _fusable(ms):
                        units.append(tuple(ms))
                        taken.update(names)
        units += [(m,) for n, m in named.items() if n not in taken]
        return units

    def refresh(self, units: list[tuple[torch.nn.Linear, ...]] | None = None) -> int:
        """Repack every unit whose weights may have changed since it was packed (a trainable weight always, a
        frozen one when its stamp changed); returns how many were (re)packed.

        The packed copies live in a registry weakly keyed by the unit's first layer, shared by every
        :class:`PackedLinears` over the same layers (the agents' backends of one shared base model hold one
        packed copy, not one each) and freed with the layers."""
        units = self.units() if units is None else units
        _unmerge_disabled(self.model)
        peft = _peft_states(self.model)
        n = 0
        with torch.no_grad():
            for unit in units:
                ids = tuple(id(m) for m in unit)
                stamp = tuple(_stamp(t) for m in unit for t in (m.weight, m.bias) if t is not None)
                for m in unit:
                    stamp += peft.get(id(m), ())
                held = PACKS.get(unit[0])
                if held is None or held[0] != ids or held[1] != stamp or None in stamp:
                    w = unit[0].weight.detach() if len(unit) == 1 else torch.cat([m.weight for m in unit])
                    bias = None
                    if unit[0].bias is not None:
                        bias = unit[0].bias.detach() if len(unit) == 1 else torch.cat([m.bias for m in unit])
                    PACKS[unit[0]] = (ids, stamp, torch.ops.mkldnn._reorder_linear_weight(w, None), bias)
                    del w
                    n += 1
        return n

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the packed layers' ``forward`` through their (refreshed) packed weights; restored on exit.

        Raises:
            RuntimeError: entered with grad enabled while a packed layer has a trainable weight or bias (the
                packed op has no autograd: its outputs would silently carry no gradient); enter it under
                ``torch.no_grad()`` or ``torch.inference_mode()``.
        """
        units = self.units()
        if torch.is_grad_enabled() and any(p.requires_grad for u in units for m in u for p in m.parameters()):
            raise RuntimeError(
                "PackedLinears.active() runs its layers without autograd, but grad is enabled and some of "
                "them are trainable; enter it under torch.no_grad() or torch.inference_mode()"
            )
        self.refresh(units)
        slots: list[dict[str, Any]] = []
        for unit in units:
            _, _, packed, bias = PACKS[unit[0]]
            if len(unit) == 1:
                unit[0].forward = functools.partial(packed_linear, packed=packed, bias=bias)
                continue
            slot: dict[str, Any] = {}
            slots.append(slot)
            bounds = [0]
            for m in unit:
                bounds.append(bounds[-1] + m.out_features)
            for i, m in enumerate(unit):
                # an instance attribute shadows the class's forward
                m.forward = functools.partial(
                    fused_slice, slot=slot, packed=packed, bias=bias, lo=bounds[i], hi=bounds[i + 1]
                )
        try:
            yield
        finally:
            for unit in units:
                for m in unit:
                    m.__dict__.pop("forward", None)
            for slot in slots:
                slot.clear()  # do not keep the last input and product alive between calls


def _unmerge_disabled(model: torch.nn.Module) -> None:
    """Unmerge the merged adapters of PEFT layers whose adapters are disabled (``with disable_adapter():`` on a
    merged model), as their own forward does on its first call: packed before that, the copy would keep the
    merged weights the forward no longer uses."""
    for m in model.modules():
        if getattr(m, "merged", False) and getattr(m, "disable_adapters", False) and hasattr(m, "unmerge"):
            m.unmerge()


def _peft_states(model: torch.nn.Module) -> dict[int, tuple]:
    """id of each PEFT-wrapped base layer -> stamp entries: the wrapper's id, the merged adapters' names, then
    the stamps of their LoRA factors (flat, so a trainable factor's ``None`` makes the unit repack every call).

    PEFT merges and unmerges with ``base_layer.weight.data += delta`` (also in ``merge_and_unload``): ``.data``
    has its own version counter, so the base weight's stamp never changes. What a merged weight holds is the
    unmerged base plus the merged factors' product, so the names and the factors' stamps stand in for it; the
    wrapper's id tells a layer unwrapped by ``merge_and_unload`` (merged, no wrapper left) from the unmerged one."""
    out: dict[int, tuple] = {}
    for m in model.modules():
        base = getattr(m, "base_layer", None)
        names = getattr(m, "merged_adapters", None)
        if not isinstance(base, torch.nn.Module) or names is None:
            continue
        factors: list[tuple | None] = []
        for a in names:
            for table in ("lora_A", "lora_B", "lora_magnitude_vector"):
                sub = getattr(m, table, {})
                layer = sub[a] if a in sub else None
                for t in layer.parameters() if layer is not None else ():
                    factors.append(_stamp(t))
        out[id(base)] = (id(m), tuple(names), *factors)
    return out


def _fusable(ms: list[torch.nn.Linear]) -> bool:
    first = ms[0]
    return all(
        m.in_features == first.in_features
        and m.weight.dtype == first.weight.dtype
        and (m.bias is None) == (first.bias is None)
        for m in ms
    )


def packed_linear(x: torch.Tensor, *, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def fused_slice(
    x: torch.Tensor,
    *,
    slot: dict[str, Any],
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    lo: int,
    hi: int,
) -> torch.Tensor:
    # The siblings of a unit are called one after another on the same input: compute their product once and
    # give each sibling its slice once (a second call of the same sibling, or a new or modified input,
    # recomputes, so an in-place edit of one slice, e.g. PEFT's mixed-batch `+=`, never leaks into another call).
    version = None if x.is_inference() else x._version  # inference tensors keep no version counter
    if slot.get("x") is not x or slot.get("version") != version or lo in slot["served"]:
        slot["x"], slot["version"], slot["served"] = x, version, set()
        slot["y"] = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    slot["served"].add(lo)
    return slot["y"][..., lo:hi]


#: RMSNorm classes whose forward is ``weight * (x * rsqrt(mean(x^2, -1) + variance_epsilon))`` in fp32 (Llama's,
#: copied by these architectures): exactly what ``F.rms_norm`` computes
RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "SmolLM3RMSNorm"})


@contextlib.contextmanager
def fused_rms_norms(model: torch.nn.Module) -> Iterator[None]:
    """Route the fp32 CPU forwards of ``model``'s :data:`RMS_NORMS` modules through ``F.rms_norm`` (one kernel,
    the same values); restored on exit. Other dtypes and devices call the module's own forward."""
    norms = [
        m
        for m in model.modules()
        if type(m).__name__ in RMS_NORMS
        and "forward" not in m.__dict__
        and isinstance(getattr(m, "weight", None), torch.Tensor)
        and isinstance(getattr(m, "variance_epsilon", None), float)
    ]
    for m in norms:
        m.forward = functools.partial(
            rms_norm, weight=m.weight, eps=m.variance_epsilon, original=type(m).forward.__get__(m)
        )
    try:
        yield
    finally:
        for m in norms:
            m.__dict__.pop("forward", None)


def rms_norm(
    x: torch.Tensor, *, weight: torch.Tensor, eps: float, original: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu":
        return original(x)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values live in a buffer with ``reserve`` free positions after each growth:
    ``update`` writes in place and returns views ``(B, H, filled, D)`` of the buffer (the tensors ``torch.cat``
    would have built, without copying the cache every step)."""

    def __init__(self, reserve: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reserve = int(reserve)
        self._filled = 0
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def _views(self, kbuf: torch.Tensor, vbuf: torch.Tensor) -> None:
        self.keys = kbuf[..., : self._filled, :]
        self.values = vbuf[..., : self._filled, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, s = self._filled, key_states.shape[-2]
        kbuf, vbuf = self._kbuf, self._vbuf
        if kbuf is None or vbuf is None or n + s > kbuf.shape[-2]:
            cap = n + s + max(self.reserve, s)
            new_k = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
            new_v = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
            if n and kbuf is not None and vbuf is not None:
                new_k[..., :n, :] = kbuf[..., :n, :]
                new_v[..., :n, :] = vbuf[..., :n, :]
            kbuf, vbuf = self._kbuf, self._vbuf = new_k, new_v
        kbuf[..., n : n + s, :] = key_states
        vbuf[..., n : n + s, :] = value_states
        self._filled = n + s
        self._views(kbuf, vbuf)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._filled

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._filled and self._kbuf is not None and self._vbuf is not None:
            self._kbuf, self._vbuf = self._kbuf[indices], self._vbuf[indices]
            self._views(self._kbuf, self._vbuf)

    def reset(self) -> None:
        self._filled, self._kbuf, self._vbuf = 0, None, None
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a preallocated decode cache is not cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a preallocated decode cache is not repeated")


def preallocated_cache(config: PretrainedConfig, reserve: int) -> DynamicCache | None:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are preallocated with ``reserve`` free
    positions (the tokens still to decode), or ``None`` when the model's cache has other layer types (sliding
    windows, linear attention): the caller then lets the model build its own cache."""
    cache = DynamicCache(config=config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [PreallocatedLayer(reserve) for _ in cache.layers]
    return cache

"""CPU decode kernels of :class:`~mas_train.backends.hf.HFBackend`: oneDNN-packed linear layers and a
preallocated KV cache.

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
(LoRA's rank-r factors stay as they are: too small to pay), repacks a weight whenever it changed (its storage or
its in-place version counter, so an optimizer step or a weight sync on a shared module is never missed), and
routes the linears through the packed copies only inside :meth:`PackedLinears.active`: a training forward on a
shared module never sees them (the packed op has no autograd). Memory: one more copy of the packed weights
(0.54 GB for SmolLM2-135M in fp32).

**Preallocated KV cache.** ``DynamicLayer`` grows its keys and values with ``torch.cat`` every step: a copy of
the whole cache per layer and token. :class:`PreallocatedLayer` writes each step into a buffer with room for the
rest of the completion and returns views of its filled part: the same tensors, bit for bit, without the copies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

__all__ = ["MIN_PACKED_NUMEL", "PackedLinears", "PreallocatedLayer", "onednn_available", "preallocated_cache"]

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


def _stamp(w: torch.Tensor) -> tuple:
    # a new tensor, new storage or an in-place write (optimizer step, update_weights' copy_) all change this
    return (id(w), w.data_ptr(), w._version, tuple(w.shape), w.dtype)


class PackedLinears:
    """oneDNN-packed copies of a CPU model's large ``nn.Linear`` weights, used inside :meth:`active`.

    Args:
        model: the module to generate with (fp32 or bf16, on CPU). Its ``nn.Linear`` layers with at least
            :data:`MIN_PACKED_NUMEL` weights are packed (PEFT LoRA layers: their base layers).

    Raises:
        RuntimeError: this torch build has no oneDNN packed-linear ops (see :func:`onednn_available`).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        if not onednn_available():
            raise RuntimeError("this torch build has no oneDNN (torch.ops.mkldnn._linear_pointwise)")
        self.model = model
        self._packed: dict[int, tuple[tuple, torch.Tensor]] = {}

    def linears(self) -> list[torch.nn.Linear]:
        """The layers that are packed: the model's ``nn.Linear`` modules on CPU, fp32 or bf16, with at least
        :data:`MIN_PACKED_NUMEL` weights (found anew on each call: adapters may have been added since)."""
        return [
            m
            for m in self.model.modules()
            if type(m) is torch.nn.Linear
            and "forward" not in m.__dict__  # a hooked forward (accelerate) is left alone
            and m.weight.device.type == "cpu"
            and m.weight.dtype in (torch.float32, torch.bfloat16)
            and m.weight.numel() >= MIN_PACKED_NUMEL
        ]

    def refresh(self, linears: list[torch.nn.Linear] | None = None) -> int:
        """Repack every weight that changed since it was packed (and forget layers that are gone); returns how
        many were (re)packed."""
        linears = self.linears() if linears is None else linears
        live = {id(m) for m in linears}
        for key in [k for k in self._packed if k not in live]:
            del self._packed[key]
        n = 0
        with torch.no_grad():
            for m in linears:
                stamp = _stamp(m.weight)
                held = self._packed.get(id(m))
                if held is None or held[0] != stamp:
                    self._packed[id(m)] = (
                        stamp,
                        torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), None),
                    )
                    n += 1
        return n

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the packed layers' ``forward`` through their (refreshed) packed weights; restored on exit."""
        linears = self.linears()
        self.refresh(linears)
        pw = torch.ops.mkldnn._linear_pointwise
        for m in linears:
            packed = self._packed[id(m)][1]
            bias = m.bias

            def forward(x: torch.Tensor, packed: torch.Tensor = packed, bias: Any = bias) -> torch.Tensor:
                return pw(x, packed, bias, "none", [], "")

            m.forward = forward  # an instance attribute shadows the class's forward
        try:
            yield
        finally:
            for m in linears:
                m.__dict__.pop("forward", None)


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

    def _views(self) -> None:
        self.keys = self._kbuf[..., : self._filled, :]
        self.values = self._vbuf[..., : self._filled, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, s = self._filled, key_states.shape[-2]
        if self._kbuf is None or n + s > self._kbuf.shape[-2]:
            cap = n + s + max(self.reserve, s)
            kbuf = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
            vbuf = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
            if n:
                kbuf[..., :n, :] = self._kbuf[..., :n, :]
                vbuf[..., :n, :] = self._vbuf[..., :n, :]
            self._kbuf, self._vbuf = kbuf, vbuf
        self._kbuf[..., n : n + s, :] = key_states
        self._vbuf[..., n : n + s, :] = value_states
        self._filled = n + s
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._filled

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._filled:
            self._kbuf, self._vbuf = self._kbuf[indices], self._vbuf[indices]
            self._views()

    def reset(self) -> None:
        self._filled, self._kbuf, self._vbuf = 0, None, None
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a preallocated decode cache is not cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a preallocated decode cache is not repeated")


def preallocated_cache(config: Any, reserve: int) -> Any | None:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are preallocated with ``reserve`` free
    positions (the tokens still to decode), or ``None`` when the model's cache has other layer types (sliding
    windows, linear attention): the caller then lets the model build its own cache."""
    cache = DynamicCache(config=config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [PreallocatedLayer(reserve) for _ in cache.layers]
    return cache

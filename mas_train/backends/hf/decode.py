"""The fused decode step of :class:`~mas_train.backends.hf.HFBackend`: one token of a Llama-family CPU model in
about 20 tensor ops per layer, LoRA adapters included.

A decode step of a small model on CPU streams the weights once (the GEMMs, see :mod:`.hf_kernels`) and then
pays for every other op by its count, not its size: SmolLM2-135M's 30 layers run ~45 small ops each through
``transformers``' modules (rotary halves and concatenations, per-module calls, mask building, PEFT's per-adapter
sub-batches). :class:`FusedDecoder` computes the same step straight from the layers' weights:

    h = rms_norm(x) -> one product for q|k|v (+ the rows' LoRA deltas, 2 more) -> [q_norm/k_norm] -> rotary on q|k
    together (``x*cos + roll(x, D/2)*sin'``, sin' = sin with its first half negated: ``rotate_half`` without
    a concatenation) -> the KV cache write -> SDPA on the key/value heads (GQA packed: queries (B, KV, G, D))
    -> o_proj -> residual -> rms_norm -> one product for gate|up -> act(gate) * up -> down_proj -> residual

Every weight is the module's own (through its packed copy where :class:`~.hf_kernels.PackedLinears` packed it,
else ``F.linear``), so the logits equal the model's forward up to float rounding (a different summation order:
max |delta| ~5e-5 on SmolLM2, tested against the model's forward with left padding, finished rows dropped, Qwen3's
q/k norms and two LoRA adapters mixed in one batch). Measured on SmolLM2-135M at batch 8, 2 threads
(``benchmarks/generate.py``, 8 runs): 0.99-1.18x the tok/s of the same backend stepping through the model's
forward; the default training run's first step 29.2-30.5 vs 31.6-32.2 s.

**LoRA.** PEFT's mixed-adapter forward runs each adapter's rows as a sub-batch (an index, two products, a
scale, an indexed add per adapter and layer). Here the A factors of every sibling and adapter in the batch are
stacked once per batch, so each unit's LoRA delta is three ops whatever the number of adapters:
``z = h @ A_all.T``; ``z *= S`` (S: (B, R) = the adapter's ``scaling`` on the row's own adapter's columns, 0
elsewhere); ``y += z @ B_all.T`` (B_all block-diagonal over the siblings). Vanilla LoRA only: a DoRA or other
variant, or a LoRA bias, leaves the batch to the model's forward.

Which models: ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``MistralForCausalLM`` (also
inside a ``peft.PeftModel``) whose layers are all full attention, in fp32 or in bf16 (LoRA factors in fp32 or
bf16, as PEFT keeps them; the step computes in the weights' dtype as the forward does and returns fp32 logits),
on CPU, with the preallocated cache of
:func:`~.hf_kernels.preallocated_cache`; :meth:`FusedDecoder.build` returns ``None`` for anything else, and the
backend then steps through the model's forward.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from mas_train.backends.hf.kernels import (
    PACKS,
    RMS_NORMS,
    PreallocatedLayer,
    fused_slice,
    packed_linear,
    rms_norm,
)

__all__ = ["ARCHITECTURES", "FusedDecoder", "supports_fused_decode"]

#: model classes whose decoder layers :class:`FusedDecoder` computes (pre-norm Llama blocks; Qwen3 adds q/k norms)
ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"})


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The ``*ForCausalLM`` inside a ``peft.PeftModel`` (``base_model.model``), or ``model`` itself."""
    inner = getattr(getattr(model, "base_model", None), "model", None)
    return inner if isinstance(inner, torch.nn.Module) and hasattr(model, "peft_config") else model


def supports_fused_decode(model: torch.nn.Module) -> str | None:
    """``None`` when :class:`FusedDecoder` can step ``model``, else why not (one phrase, for an error line)."""
    lm = _causal_lm(model)
    name = type(lm).__name__
    if name not in ARCHITECTURES:
        return f"{name} is not one of {sorted(ARCHITECTURES)}"
    cfg = lm.config
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()) or (
        name == "MistralForCausalLM" and getattr(cfg, "sliding_window", None) is not None
    ):
        return "it has sliding-window or other non-full-attention layers"
    prefix = name.removesuffix("ForCausalLM")
    core = lm.model
    parts = [(core, "Model"), (core.rotary_emb, "RotaryEmbedding")] + [
        (m, kind) for lay in core.layers for m, kind in ((lay, "DecoderLayer"), (lay.self_attn, "Attention"))
    ]
    parts += [(lay.mlp, "MLP") for lay in core.layers]
    odd = sorted({type(m).__name__ for m, kind in parts if type(m).__name__ != prefix + kind})
    if odd:  # a subclass or replacement computes its own forward, which the step would not run
        return f"it has modules of other classes ({', '.join(odd)})"
    norms = [core.norm] + [
        n for lay in core.layers for n in (lay.input_layernorm, lay.post_attention_layernorm)
    ]
    norms += [
        n for lay in core.layers for n in (getattr(lay.self_attn, a, None) for a in ("q_norm", "k_norm")) if n
    ]
    odd = sorted({type(n).__name__ for n in norms if type(n).__name__ not in RMS_NORMS})
    if odd:
        return f"it has norms of other classes ({', '.join(odd)})"
    if type(core.embed_tokens) is not torch.nn.Embedding:  # e.g. a LoRA adapter on embed_tokens
        return f"its input embedding is a {type(core.embed_tokens).__name__}, not an nn.Embedding"
    if getattr(cfg, "_attn_implementation", None) not in ("eager", "sdpa"):
        return f"its attention implementation {getattr(cfg, '_attn_implementation', None)!r} is not eager or sdpa"
    return _dtype_verdict(model)


def _dtype_verdict(model: torch.nn.Module) -> str | None:
    """``None`` when the step computes in the model's dtypes as its forward does: every weight fp32, or every
    weight bf16 but for LoRA factors in fp32 or bf16 (PEFT casts a row's input to its factors' dtype and the sum
    back to the base's: the step does the same). Anything else (fp16, a bf16 adapter on an fp32 base) casts
    between dtypes where the step could not."""
    base = {p.dtype for n, p in model.named_parameters() if p.is_floating_point() and ".lora_" not in n}
    lora = {p.dtype for n, p in model.named_parameters() if p.is_floating_point() and ".lora_" in n}
    if base == {torch.float32} and lora <= {torch.float32}:
        return None
    if base == {torch.bfloat16} and lora <= {torch.float32, torch.bfloat16}:
        return None
    return "its weights are neither all fp32 nor all bf16 (LoRA factors fp32 or bf16)"


def _ours(f: Any) -> bool:
    """Whether an instance ``forward`` computes what the class's does: one :mod:`.hf_kernels` installed, or
    TRL's fused-LM-head patch of the causal LM's forward (``GRPOTrainer`` installs it on the trained model; it
    calls the original forward unless ``fused_lm_head=True``, which sampling never passes)."""
    if isinstance(f, functools.partial) and f.func in (packed_linear, fused_slice, rms_norm):
        return True
    code = getattr(getattr(f, "__func__", f), "__code__", None)
    return (
        code is not None
        and code.co_name == "_fused_forward"
        and "/trl/" in code.co_filename.replace("\\", "/")
    )


def _hooked(model: torch.nn.Module) -> bool:
    """Whether a forward hook or a replaced ``forward`` (accelerate's, a user's) would change what the model's
    forward computes: the step calls no module, so it would skip them. ``enable_input_require_grads``' hook
    (a trainer with gradient checkpointing) only flags its output for autograd and is allowed."""
    glob = torch.nn.modules.module
    if glob._global_forward_hooks or glob._global_forward_pre_hooks:
        return True
    for m in model.modules():
        if m._forward_pre_hooks or ("forward" in m.__dict__ and not _ours(m.__dict__["forward"])):
            return True
        if any(not _harmless_hook(h) for h in m._forward_hooks.values()):
            return True
    return False


def _harmless_hook(h: Any) -> bool:
    return getattr(h, "__qualname__", "").endswith(
        "enable_input_require_grads.<locals>.make_inputs_require_grads"
    )


def _is_lora_linear(m: torch.nn.Module) -> bool:
    """A PEFT LoRA ``Linear`` over a plain ``nn.Linear`` (other PEFT tuners change the product in other ways)."""
    return (
        type(m).__name__ == "Linear"
        and type(m).__module__.startswith("peft.tuners.lora")
        and type(getattr(m, "base_layer", None)) is torch.nn.Linear
    )


class _Linear:
    """One product over a unit of sibling projections (their packed copy; unpacked, one ``F.linear`` per sibling
    and their outputs concatenated, so no batch copies the weights) plus the batch rows' LoRA deltas; ``bounds``
    are the siblings' column ranges in the output."""

    def __init__(self, mods: list[torch.nn.Module], packed: bool) -> None:
        bases = [getattr(m, "base_layer", m) for m in mods]
        held = PACKS.get(bases[0]) if packed else None  # another backend's packs may be stale
        if held is not None and held[0] == tuple(id(b) for b in bases):
            self.packed, self.bias = held[2], held[3]
        else:
            self.packed, self.bias = None, None
        self.parts = [(b.weight, b.bias) for b in bases]
        self.mods = mods
        self.bounds = [0]
        for b in bases:
            self.bounds.append(self.bounds[-1] + b.out_features)
        self.lora: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def set_adapters(self, adapters: list[str] | None, n: int) -> bool:
        """Stack the LoRA factors the batch's ``n`` rows use, as PEFT's forward would (``adapters[i]``: row i's
        adapter, PEFT's mixed batch; ``None``: every row runs with each layer's active adapters); ``False``
        when one is not vanilla LoRA (the batch then needs the model's own forward)."""
        a_parts, b_parts, cols, scales = [], [], [], []
        for j, m in enumerate(self.mods):
            if m is getattr(m, "base_layer", m) or m.merged or m.disable_adapters:
                continue  # a plain layer; merged adapters live in the base weights; disabled adapters do not run
            rows = [(a,) for a in adapters] if adapters is not None else [tuple(m.active_adapters)] * n
            for a in sorted({a for r in rows for a in r}):
                if a not in m.lora_A:
                    continue
                if a in getattr(m, "lora_variant", {}) or m.lora_B[a].bias is not None:
                    return False
                lo, hi = self.bounds[j], self.bounds[j + 1]
                a_parts.append(m.lora_A[a].weight)
                b_parts.append((lo, hi, m.lora_B[a].weight, rows))
                cols.append((a, m.lora_A[a].weight.shape[0]))
                scales.append(float(m.scaling[a]))
        if not a_parts:
            self.lora = None
            return True
        a_all = torch.cat(a_parts)  # (R, in)
        b_all = a_all.new_zeros((self.bounds[-1], a_all.shape[0]))  # (out, R), block-diagonal over siblings
        s = a_all.new_zeros((n, a_all.shape[0]))
        c = 0
        for (lo, hi, w, rows), (a, r), scale in zip(b_parts, cols, scales, strict=True):
            b_all[lo:hi, c : c + r] = w
            s[:, c : c + r] = torch.tensor([scale if a in row else 0.0 for row in rows])[:, None]
            c += r
        self.lora = (a_all, b_all.T.contiguous(), s)
        return True

    def select(self, sel: torch.Tensor) -> None:
        if self.lora is not None:
            a_all, b_t, s = self.lora
            self.lora = (a_all, b_t, s[sel])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        elif len(self.parts) == 1:
            y = F.linear(x, *self.parts[0])
        else:
            y = torch.cat([F.linear(x, w, b) for w, b in self.parts], -1)
        if self.lora is not None:
            a_all, b_t, s = self.lora
            if a_all.dtype == x.dtype:
                y = torch.addmm(y, torch.mm(x, a_all.T).mul_(s), b_t)
            else:  # fp32 factors on a bf16 base: PEFT's delta in fp32, the sum rounded back to bf16
                z = torch.mm(x.to(a_all.dtype), a_all.T).mul_(s)
                y = torch.addmm(y.to(a_all.dtype), z, b_t).to(x.dtype)
        return y


class _Layer(NamedTuple):
    n1: tuple[torch.Tensor, float]  # input_layernorm (weight, eps)
    qkv: _Linear
    qk_norm: tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]] | None  # Qwen3's q_norm, k_norm
    scale: float  # attention scaling
    kv: PreallocatedLayer
    o: _Linear
    n2: tuple[torch.Tensor, float]  # post_attention_layernorm
    gate_up: _Linear
    act: Any  # the MLP's activation module
    down: _Linear


class FusedDecoder:
    """One decode step of a Llama-family model from its weights (see the module docstring).

    Build it with :meth:`build` inside :meth:`~.hf_kernels.PackedLinears.active` (so the packed copies are
    fresh) after the prefill filled ``cache``; call it once per decode step; call :meth:`select` when finished
    rows leave the batch (after ``cache.batch_select_indices``).
    """

    def __init__(self, lm: torch.nn.Module, cache: DynamicCache, packed: bool) -> None:
        core = lm.model
        self.embed = core.embed_tokens.weight
        self.rotary = core.rotary_emb
        self.norm = (core.norm.weight, core.norm.variance_epsilon)
        self.head = _Linear([lm.lm_head], packed)
        self.layers: list[_Layer] = []
        for layer, kv in zip(core.layers, cache.layers, strict=True):
            att, mlp = layer.self_attn, layer.mlp
            qk_norm = None
            if hasattr(att, "q_norm"):  # Qwen3: RMSNorm over each head's dims before the rotary
                qk_norm = (
                    (att.q_norm.weight, att.q_norm.variance_epsilon),
                    (att.k_norm.weight, att.k_norm.variance_epsilon),
                )
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            self.layers.append(
                _Layer(
                    n1=(n1.weight, n1.variance_epsilon),
                    qkv=_Linear([att.q_proj, att.k_proj, att.v_proj], packed),
                    qk_norm=qk_norm,
                    scale=float(att.scaling),
                    kv=kv,
                    o=_Linear([att.o_proj], packed),
                    n2=(n2.weight, n2.variance_epsilon),
                    gate_up=_Linear([mlp.gate_proj, mlp.up_proj], packed),
                    act=mlp.act_fn,
                    down=_Linear([mlp.down_proj], packed),
                )
            )
        self.head_dim = int(core.layers[0].self_attn.head_dim)
        self.heads = int(lm.config.num_attention_heads)
        self.kv_heads = int(lm.config.num_key_value_heads)

    def _units(self) -> list[_Linear]:
        return [self.head] + [u for lay in self.layers for u in (lay.qkv, lay.o, lay.gate_up, lay.down)]

    @classmethod
    def build(
        cls, model: torch.nn.Module, cache: DynamicCache, adapters: list[str] | None, packed: bool
    ) -> FusedDecoder | None:
        """The step for ``model`` over ``cache``, or ``None`` when it cannot compute it exactly (see
        :func:`supports_fused_decode`; a module with forward hooks or a replaced ``forward``; a cache that is
        not all :class:`~.hf_kernels.PreallocatedLayer`; a module of an unexpected type; an adapter that is not
        vanilla LoRA).

        Args:
            model: the model (or ``peft.PeftModel``) the backend samples with, in eval mode.
            cache: the prefilled ``DynamicCache``.
            adapters: per batch row, the LoRA adapter it runs with (PEFT's ``adapter_names``); ``None``: the
                model as it is (a ``PeftModel``'s active adapters).
            packed: whether the layers' packed copies are fresh (built inside the backend's
                :meth:`~.hf_kernels.PackedLinears.active`): use them; ``False``: ``F.linear`` on the weights.
        """
        if supports_fused_decode(model) is not None or _hooked(model):
            return None
        if not getattr(cache, "layers", None) or any(type(c) is not PreallocatedLayer for c in cache.layers):
            return None
        step = cls(_causal_lm(model), cache, packed)
        n = len(adapters) if adapters is not None else int(cache.layers[0].keys.shape[0])
        for u in step._units():
            if not all(type(m) is torch.nn.Linear or _is_lora_linear(m) for m in u.mods):
                return None
            if not u.set_adapters(adapters, n):
                return None
        return step

    def select(self, sel: torch.Tensor) -> None:
        """Keep batch rows ``sel`` (their LoRA row scales), as ``cache.batch_select_indices(sel)`` did."""
        for u in self._units():
            u.select(sel)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits of the next token.

        Args:
            ids: (B, 1) int64, the token each row feeds.
            mask: (B, T) int64, 1 where a cache column (and the new token's, the last) is the row's own.
            pos: (B, 1) int64, each row's position of the new token.

        Returns:
            (B, V) float32 logits; the cache holds the new token's keys and values.
        """
        b, d, heads, kvh = ids.shape[0], self.head_dim, self.heads, self.kv_heads
        nq, half, groups = heads + kvh, d // 2, heads // kvh
        x = F.embedding(ids[:, 0], self.embed)  # (B, hidden)
        cos, sin = self.rotary(x, pos)  # (B, 1, D), the rope type's attention scaling included
        sin = torch.cat([-sin[..., :half], sin[..., half:]], -1)  # roll(x, D/2) * sin == rotate_half(x) * sin
        attn_mask = None if bool(mask.all()) else mask[:, None, None, :].bool()
        width = x.shape[-1]
        for lay in self.layers:
            qkv = lay.qkv(F.rms_norm(x, (width,), *lay.n1))
            qk = qkv[:, : nq * d].view(b, nq, d)
            if lay.qk_norm is not None:
                qn, kn = lay.qk_norm
                qk = torch.cat(
                    [F.rms_norm(qk[:, :heads], (d,), *qn), F.rms_norm(qk[:, heads:], (d,), *kn)], 1
                )
            qk = torch.addcmul(qk * cos, torch.roll(qk, half, -1), sin)
            keys, values = lay.kv.update(qk[:, heads:, None], qkv[:, nq * d :].view(b, kvh, 1, d))
            q = qk[:, :heads].reshape(b, kvh, groups, d)  # GQA: each key/value head's query heads as its rows
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask, scale=lay.scale)
            x = x + lay.o(a.reshape(b, heads * d))
            gu = lay.gate_up(F.rms_norm(x, (width,), *lay.n2))
            cut = lay.gate_up.bounds[1]
            x = x + lay.down(lay.act(gu[:, :cut]) * gu[:, cut:])
        return self.head(F.rms_norm(x, (width,), *self.norm)).float()  # sampling runs on fp32 logits

"""Shared-prefix forward for the GRPO update: the prompt prefix all of one agent's samples share (its system turn
and few-shot examples) is run once per update instead of once per sample, with the exact same gradient.

An agent's prompts in one step usually start with the same tokens: the chat template's system turn, the role
instructions, the worked examples of the small-model prompt style (244 of the verifier's ~265 tokens in the
laptop default). A plain update runs the whole prompt of every sample forward and backward. Here:

1. :class:`SharedPrefix` runs the prefix once (batch 1) with autograd on and keeps its key/value states as
   detached leaf tensors.
2. Each micro-batch runs only its samples' remaining tokens, attending to those leaves broadcast over the batch
   (:func:`prefix_logps`), with explicit position ids so every token keeps the position it has in the full prompt.
   Backward accumulates the gradient of the loss with respect to the prefix's keys and values in the leaves.
3. :meth:`SharedPrefix.backward` sends that accumulated gradient once through the prefix forward into the weights.

By the chain rule the weights' gradient is the one the plain update computes (tested to float tolerance, both
full fine-tuning and LoRA); the cost of the prefix drops from once per sample to once per update.

Row layout of a prefixed micro-batch: ``[prefix (P) | left padding | rest of the prompt | completion | right
padding]``; the attention mask is 0 on both paddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mas_train.models import cache_keyword

if TYPE_CHECKING:
    from transformers import DynamicCache

    from mas_train.samples import Sample


__all__ = [
    "MIN_SHARED_PREFIX",
    "SharedPrefix",
    "agent_prefix_lengths",
    "build_prefixes",
    "common_prefix_len",
    "prefix_logps",
]

#: Shorter shared prefixes are not worth a separate forward.
MIN_SHARED_PREFIX = 16


def common_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix all ``prompts`` share, at most ``min(len) - 1`` (every row keeps at
    least one prompt token of its own, which predicts its first completion token). 0 for no prompts."""
    if not prompts:
        return 0
    first = prompts[0]
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return max(n, 0)


def agent_prefix_lengths(samples: Sequence[Sample]) -> dict[str, int]:
    """``{agent: n}`` for each agent whose samples' prompts (``.prompt_ids``) share their first
    ``n >= MIN_SHARED_PREFIX`` tokens (:func:`common_prefix_len`)."""
    out = {}
    for agent in dict.fromkeys(s.agent for s in samples):
        n = common_prefix_len([s.prompt_ids for s in samples if s.agent == agent])
        if n >= MIN_SHARED_PREFIX:
            out[agent] = n
    return out


def build_prefixes(
    model: torch.nn.Module, samples: Sequence[Sample], lengths: dict[str, int], device: torch.device | str
) -> dict[str, SharedPrefix] | None:
    """One :class:`SharedPrefix` per agent of ``lengths`` (its first ``n`` prompt tokens), run forward now; None
    when the model's cache cannot be broadcast over a batch."""
    out: dict[str, SharedPrefix] = {}
    for agent, n in lengths.items():
        ids = next(s.prompt_ids for s in samples if s.agent == agent)[:n]
        try:
            out[agent] = SharedPrefix(model, ids, device)
        except ValueError:
            return None
    return out


class SharedPrefix:
    """The key/value states of one token prefix, computed once by ``model`` (autograd on when grad is enabled).

    Args:
        model: a Hugging Face causal LM (or a PEFT model around one) whose cache is a plain ``DynamicCache``.
        prefix_ids: ``(P,)`` the shared tokens.
        device: where the states live.

    Raises:
        ValueError: the model's cache is not made of plain dynamic layers (e.g. sliding-window attention), where
            broadcasting it over a batch would not be exact; the caller falls back to the plain forward.
    """

    def __init__(self, model: torch.nn.Module, prefix_ids: Sequence[int], device: torch.device | str) -> None:
        from transformers.cache_utils import DynamicLayer

        ids = torch.tensor([list(prefix_ids)], dtype=torch.long, device=device)
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        # transformers 5.24 returns the cache as ``cache``; 5.19 (SGLang 0.5.23's pin) as ``past_key_values``
        cache = getattr(out, "cache", None)
        if cache is None:
            cache = getattr(out, "past_key_values", None)
        self.cache_kw = cache_keyword(model)
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            raise ValueError("shared-prefix forward needs a DynamicCache of plain DynamicLayers")
        self.length = ids.size(1)
        self._states = [t for layer in layers for t in (layer.keys, layer.values)]
        # fp32 leaves: the gradient of every micro-batch accumulates into them, which in bf16 (a bf16 base, or
        # the states of a bf16 autocast forward) would round at each addition; each micro-batch reads them cast
        # back to the states' dtype (a no-op in fp32)
        self._leaves = [t.detach().float().requires_grad_(t.requires_grad) for t in self._states]

    def cache(self, batch_size: int) -> DynamicCache:
        """A fresh ``DynamicCache`` holding the prefix states broadcast to ``batch_size`` rows (no copy)."""
        from transformers import DynamicCache

        dtype = self._states[0].dtype
        pairs = zip(self._leaves[0::2], self._leaves[1::2], strict=True)
        return DynamicCache(
            ddp_cache_data=[
                (k.to(dtype).expand(batch_size, -1, -1, -1), v.to(dtype).expand(batch_size, -1, -1, -1))
                for k, v in pairs
            ]
        )

    def backward(self) -> None:
        """Back-propagate the gradient accumulated in the prefix states into the weights (once), then clear it."""
        pairs = [
            (s, leaf.grad)
            for s, leaf in zip(self._states, self._leaves, strict=True)
            if leaf.grad is not None
        ]
        if pairs and pairs[0][0].requires_grad:
            torch.autograd.backward([s for s, _ in pairs], [g.to(s.dtype) for s, g in pairs])
        for leaf in self._leaves:
            leaf.grad = None


def prefix_logps(
    model: torch.nn.Module,
    prefix: SharedPrefix,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token completion logprobs (and entropies) of rows laid out ``[prefix | rest]`` (module docstring).

    Args:
        model: the policy, with TRL's fused LM head (``fused_lm_head=True`` returns ``log_probs``/``entropy``).
        prefix: the shared prefix (its ``length`` P first columns of ``input_ids``).
        input_ids, attention_mask: ``(B, P + S)``; the first P columns are the prefix (mask 1).
        logits_to_keep: T, the completion width (the last T columns).

    Returns:
        ``(logps (B, T), entropies (B, T) or None)``, as :func:`mas_train.grpo.trl_adapter.fused_logps`.
    """
    p = prefix.length
    rest = input_ids[:, p:]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, p:]
    labels = rest.masked_fill(attention_mask[:, p:] == 0, -100)
    labels[:, :-logits_to_keep] = -100
    out = model(
        input_ids=rest,
        attention_mask=attention_mask,
        position_ids=position_ids,
        labels=labels,
        **{prefix.cache_kw: prefix.cache(rest.size(0))},
        fused_lm_head=True,
    )
    logps = out.log_probs[:, -logits_to_keep:]
    ent = out.entropy[:, -logits_to_keep:] if compute_entropy and out.entropy is not None else None
    return logps, ent

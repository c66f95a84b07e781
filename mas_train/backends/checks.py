"""The checks every token-id backend makes on a request and its reply (the HTTP-server backends ``sglang_http``
and ``vllm_http``, and SGLang's offline engine): the prompts, one :class:`SamplingParams` per prompt, the
weight-update tensors, and the defensive stop-string cut of a completion that ran past a stop string.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from mas_train.backends.base import SamplingParams

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["earliest_stop", "named_tensor_list", "per_prompt_sampling", "validate_prompts"]


def per_prompt_sampling(
    prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    """One :class:`SamplingParams` per prompt.

    Raises:
        ValueError: a list of another length than the prompts.
    """
    if isinstance(sampling, SamplingParams):
        return [sampling] * len(prompt_ids)
    sampling = list(sampling)
    if len(sampling) != len(prompt_ids):
        raise ValueError(
            f"got {len(prompt_ids)} prompts but {len(sampling)} SamplingParams; pass one, or one per prompt"
        )
    return sampling


def validate_prompts(prompt_ids: Sequence[Sequence[int]], engine: str = "SGLang") -> list[list[int]]:
    """The prompts as ``list[list[int]]``.

    Raises:
        ValueError: an empty prompt (engines need at least one input token).
    """
    prompts = [[int(t) for t in p] for p in prompt_ids]
    for k, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {k} is empty; {engine} needs at least one input token")
    return prompts


def named_tensor_list(
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs from a mapping or an iterable of pairs.

    Raises:
        ValueError: no tensors.
    """
    items = list(named_tensors.items()) if isinstance(named_tensors, Mapping) else list(named_tensors)
    if not items:
        raise ValueError("update_weights got no tensors")
    return items


def earliest_stop(
    completion_ids: Sequence[int], stops: Sequence[str], tokenizer: PreTrainedTokenizerBase
) -> tuple[int, str] | None:
    """Index ``i`` of the first token after which the decoded completion contains a stop string, and that string.

    Guards against servers that let generation run past a stop string (e.g. one that ends inside a
    multi-character token). Containing a stop string is monotone in the prefix length, so after one full
    decode (the common no-stop case) a binary search needs O(log T) more decodes. ``None`` when no stop string
    occurs (or there is no tokenizer to decode with).
    """
    if not stops or tokenizer is None or not completion_ids:
        return None

    def hit(n: int) -> list[str]:
        text = tokenizer.decode(list(completion_ids[:n]), skip_special_tokens=False)
        return [s for s in stops if s in text]

    if not hit(len(completion_ids)):
        return None
    lo, hi = 1, len(completion_ids)  # invariant: prefix hi contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    text = tokenizer.decode(list(completion_ids[:hi]), skip_special_tokens=False)
    # several may complete on the same token: report the one that appears first in the text
    return hi - 1, min(hit(hi), key=text.find)

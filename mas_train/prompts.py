"""Prompt ids and seeds of the rollout: a chat prompt rendered with a model group's template, and the stable
per-request seeds that make a run (and a resumed run) sample the same again."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["render_prompt", "request_seed"]


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Render chat ``messages`` with ``tokenizer``'s chat template into prompt token ids.

    ``add_generation_prompt=True`` opens the assistant turn. ``enable_thinking=False`` is passed to every
    template: Qwen3-style templates then emit an empty think block (as the Dr. MAS math recipe runs), and
    templates that do not read the variable ignore it.

    Returns:
        ``list[int]`` prompt ids (special tokens exactly as the template writes them; none added).

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template; the collector "
            "renders env messages with it. Use an instruct/chat model or set tokenizer.chat_template."
        )
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, enable_thinking=False
    )
    # Some tokenizers return a BatchEncoding / nested list even with return_dict=False.
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(t) for t in ids]


def request_seed(base_seed: int, *parts: object) -> int:
    """A stable 31-bit seed from ``base_seed`` and identifying parts (step, env index, turn, ...).

    ``hash()`` is salted per process, so CRC32 of the parts' text is used to keep runs and resumes reproducible.
    """
    key = ":".join(str(p) for p in (base_seed, *parts)).encode()
    return zlib.crc32(key) & 0x7FFFFFFF

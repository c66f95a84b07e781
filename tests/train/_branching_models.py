"""Tiny Qwen3 policies whose first completion token is a coin flip between a scripted valid action and junk.

A random-init model never writes a valid action, so every turn scores the same, every advantage is 0 and
nothing trains. These models give the math-2agent env varied scores from the first step: from the last prompt
token (``"\\n"`` after ``<|im_start|>assistant``) the model continues the scripted text with probability
``p_follow`` (then the rest of the script with probability ~1, ending in EOS) and otherwise samples uniformly
(junk, an invalid action).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tests.backends.fake_sglang import script_model

SOLVER_TEXT = "\\boxed{7}"  # valid solver action: a balanced \boxed{...}
# valid verdict; "</Verify>" (capital V, the env's tag match ignores case) keeps every scripted token distinct
VERIFIER_TEXT = "<verify>approve</Verify>\n"


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
    chain = [*newline, *tok.encode(text, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
    script_model(model, chain)
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    g = math.log(p_follow / (1 - p_follow) * (vocab - 1))
    with torch.no_grad():
        # the hidden state after RMSNorm of the one-hot e_0 is sqrt(hidden) * e_0
        model.get_output_embeddings().weight[chain[1], 0] = g / math.sqrt(hidden)
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    return str(dst)

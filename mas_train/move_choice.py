"""A game's move chosen among its legal moves by the model's probability of each move text, instead of sampled
freely (``legal_moves_only``): no move is then illegal, and the policy played is the one an exact evaluation (Kuhn
poker's exploitability) reads from the same log-probabilities."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from mas_envs.games.moves import format_move
from mas_train.backends.base import GenerationOutput, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["choose_moves", "reply_ids"]


def reply_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """The token ids of ``text`` as a whole reply: its encoding (no special tokens added) and then EOS, the token a
    sampled reply stops on, so the probability scored is that of replying exactly ``text`` and stopping. The one
    encoding of a scored reply: the moves played (:func:`choose_moves`) and the exact evaluation
    (:func:`mas_train.eval.score_replies`) read the same policy."""
    eos = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
    return tokenizer.encode(text, add_special_tokens=False) + eos


def choose_moves(
    score: Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], list[list[float]]],
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Sequence[int]],
    legal: Sequence[Sequence[str]],
    sampling: Sequence[SamplingParams],
    *,
    version: int = 0,
) -> list[tuple[str, GenerationOutput]]:
    """Draw one move per prompt among its legal labels by the model's probability of each move text
    (``RolloutCollector(legal_moves_only=True)``): the candidates ``<move>LABEL</move>`` + EOS (:func:`reply_ids`) are scored in one
    ``score(prompt_ids, completion_ids)`` call (per-token log-probs, temperature 1), each distinct (prompt,
    candidate) pair once; move k is drawn with
    probability ∝ exp(Σ log p_k / T) from ``numpy.random.default_rng(sampling.seed)`` (T = 0: the likeliest).

    Returns:
        Per prompt, the label and a :class:`GenerationOutput` of the candidate's ids and scored logprobs
        (``finish_reason`` ``"stop"``, ``weight_version`` ``version``).
    """
    cands = [[reply_ids(tokenizer, format_move(m)) for m in moves] for moves in legal]
    pairs = [(tuple(p), tuple(c)) for p, cs in zip(prompts, cands, strict=True) for c in cs]
    # a game's episodes revisit few states (Kuhn poker: 12 prompts): each distinct pair is scored once
    distinct = list(dict.fromkeys(pairs))
    got_distinct = score([list(p) for p, _ in distinct], [list(c) for _, c in distinct])
    by_pair = dict(zip(distinct, got_distinct, strict=True))
    scores = [by_pair[pc] for pc in pairs]
    out, at = [], 0
    for moves, cs, sp in zip(legal, cands, sampling, strict=True):
        got = scores[at : at + len(moves)]
        at += len(moves)
        total = np.array([sum(s) for s in got])
        if sp.temperature <= 0:
            k = int(np.argmax(total))
        else:
            z = total / sp.temperature
            p = np.exp(z - z.max())
            k = int(np.random.default_rng(sp.seed).choice(len(moves), p=p / p.sum()))
        out.append((str(moves[k]), GenerationOutput(list(cs[k]), list(got[k]), "stop", version)))
    return out

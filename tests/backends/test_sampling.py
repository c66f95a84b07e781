"""Top-p truncation without a full sort: the same tokens and logprobs as the full sort (issue 28, item 11)."""

from __future__ import annotations

import pytest
import torch

from mas_train.backends.base import SamplingParams
from mas_train.backends.hf import HFBackend, sampling
from mas_train.backends.hf.sampling import nucleus_mask, sample_tokens, truncate_logits
from mas_train.backends.testing import chat_prompt


def full_sort_truncate(scaled, top_k, top_p, greedy):
    """The reference: every row sorted over the whole vocabulary (what truncate_logits computed before)."""
    rows = ~greedy & ((top_k > 0) | (top_p < 1))
    vals, idx = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vals.shape[-1])[None, :]
    has_k = top_k > 0
    drop = has_k[:, None] & (ranks >= top_k[:, None])
    vals = vals.masked_fill(drop, float("-inf"))
    norm = torch.where(has_k, torch.logsumexp(vals, dim=-1), torch.logsumexp(scaled, dim=-1))
    probs = (vals - norm[:, None]).exp()
    cum = probs.cumsum(dim=-1)
    drop |= (top_p < 1)[:, None] & ((cum - probs) >= top_p[:, None])
    kept = torch.full_like(scaled, float("-inf")).scatter(1, idx, vals.masked_fill(drop, float("-inf")))
    return torch.where(rows[:, None], kept, scaled)


def _ties_at_boundary(x, top_p, got, ref):
    """Tokens where the masks differ all tie (in probability) with a token the other mask keeps at the edge."""
    probs = (x - torch.logsumexp(x, -1, keepdim=True)).exp()
    for r in (got != ref).any(-1).nonzero()[:, 0].tolist():
        diff = (got[r] != ref[r]).nonzero()[:, 0]
        edge = probs[r][ref[r]].min()
        assert bool((probs[r][diff] == edge).all()), f"row {r}: masks differ away from a tie"


# flat (a random-init model's logits over Qwen's 151,936 tokens: the nucleus is 94 % of the vocabulary),
# peaked (a trained model: the nucleus fits the 1024-token head), and in between (SmolLM2's 49,152)
CASES = [
    (151_936, 0.05, 0.95),
    (151_936, 4.0, 0.95),
    (49_152, 1.0, 0.95),
    (49_152, 0.3, 0.5),
    (3000, 1.0, 0.999),
]


@pytest.mark.parametrize(("vocab", "spread", "p"), CASES)
def test_nucleus_mask_is_the_full_sort_nucleus(vocab, spread, p):
    x = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab)) * spread / 0.6
    top_p = torch.full((6,), p)
    got = nucleus_mask(x, top_p)
    ref = torch.isfinite(
        full_sort_truncate(x, torch.zeros(6, dtype=torch.long), top_p, torch.zeros(6, dtype=bool))
    )
    _ties_at_boundary(x, top_p, got, ref)
    assert got.sum().item() == ref.sum().item()


@pytest.mark.parametrize(("vocab", "spread", "p"), CASES)
def test_sampled_tokens_and_logprobs_equal_the_full_sort(vocab, spread, p):
    """Mixed rows (top-p only, top-k + top-p, greedy, untruncated), a fixed seed: identical picks."""
    n = 8
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, vocab, generator=gen) * spread / 0.6
    draws = torch.rand(n, generator=gen)
    top_k = torch.tensor([0, 0, 0, 50, 0, 0, 7, 0])
    top_p = torch.tensor([p, p, p, p, 1.0, p, 1.0, p])
    greedy = torch.tensor([False, False, False, False, False, True, False, False])
    logps = torch.log_softmax(x, -1)
    got = sample_tokens(x, logps, draws, top_k, top_p, greedy, True)
    ref = torch.softmax(full_sort_truncate(x, top_k, top_p, greedy), dim=-1)
    want = sampling.inverse_cdf(ref, draws)
    want[greedy] = x[greedy].argmax(-1)
    assert got.tolist() == want.tolist()
    assert torch.equal(logps.gather(1, got[:, None]), logps.gather(1, want[:, None]))
    # and the truncated logits themselves: bit-identical where both keep a token
    fast = truncate_logits(x, top_k, top_p, greedy)
    slow = full_sort_truncate(x, top_k, top_p, greedy)
    _ties_at_boundary(x, top_p, torch.isfinite(fast), torch.isfinite(slow))
    both = torch.isfinite(fast) & torch.isfinite(slow)
    assert torch.equal(fast[both], slow[both])


def test_nucleus_mask_falls_back_to_the_sort_when_the_buckets_do_not_bracket(monkeypatch):
    """A window that does not bracket top_p (forced here) is caught by the float64 check and sorted instead."""
    x = torch.randn(3, 5000, generator=torch.Generator().manual_seed(3))
    top_p = torch.full((3,), 0.9)
    ref = nucleus_mask(x, top_p)
    calls = []
    real = sampling._nucleus_by_sort

    def spy(probs, tp):
        calls.append(probs.shape[0])
        return real(probs, tp)

    monkeypatch.setattr(sampling, "_nucleus_by_sort", spy)
    monkeypatch.setattr(sampling, "_WINDOW_MARGIN", -1.0)  # no bucket qualifies: every token looks "sure"
    assert torch.equal(nucleus_mask(x, top_p), ref)
    assert calls == [3]


def test_generate_with_top_p_equals_the_full_sort(tiny_model_and_tokenizer, monkeypatch):
    """End to end on the tiny Qwen3 (151k vocabulary, flat logits): same tokens and logprobs, fixed seed."""
    model, tok = tiny_model_and_tokenizer
    prompts = [chat_prompt(tok, q) for q in ("What is 2 + 3?", "Name a colour.")]
    sp = SamplingParams(max_new_tokens=12, temperature=0.6, top_p=0.95, seed=7)
    fast = HFBackend(model, tok, seed=0).generate(prompts, [sp, sp])
    monkeypatch.setattr(sampling, "truncate_logits", full_sort_truncate)
    slow = HFBackend(model, tok, seed=0).generate(prompts, [sp, sp])
    for a, b in zip(fast, slow, strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == b.logprobs

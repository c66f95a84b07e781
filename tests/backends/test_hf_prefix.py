"""HFBackend prefix sharing: distinct prompts with a long common prefix prefill that prefix once."""

from __future__ import annotations

from mas_train.backends.base import SamplingParams
from mas_train.backends.hf import HFBackend
from mas_train.backends.hf.loop import _MIN_SHARED_TOKENS
from mas_train.backends.testing import chat_prompt, reference_greedy, teacher_forced_logprobs


def _record_forwards(backend: HFBackend) -> list[tuple[int, int, bool]]:
    """(rows, columns, had a cache) of every forward ``backend`` runs from now on."""
    calls: list[tuple[int, int, bool]] = []
    forward = backend._forward

    def recording(ids, mask, pos, cache, adapters=None):
        calls.append((ids.shape[0], ids.shape[1], cache is not None))
        return forward(ids, mask, pos, cache, adapters)

    backend._forward = recording
    return calls


def test_long_common_prefix_is_prefilled_once_and_rows_sample_as_if_alone(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    # a task group's later turn: the same long task text, then each trajectory's own (different-length) reply
    task = "Solve step by step: " + " ".join(f"x{i} = {i} + {i}." for i in range(12))
    replies = ["The answer is 4.", "I think 7", "Let me check: 2 + 2 = 4, so the answer is 4.", "4"]
    prompts = [chat_prompt(tok, task + "\nAnswer from the solver: " + r) for r in replies]
    prompts.append(prompts[1])  # a duplicate rides on row 1's prefill
    lcp = 0
    while all(p[lcp] == prompts[0][lcp] for p in prompts):
        lcp += 1
    assert lcp * 3 >= _MIN_SHARED_TOKENS  # the case under test: sharing pays
    params = [SamplingParams(max_new_tokens=6, temperature=1.0, seed=s) for s in range(4)]
    params.append(SamplingParams(max_new_tokens=4, temperature=0.0))
    backend = HFBackend(model, tok)
    calls = _record_forwards(backend)
    outs = backend.generate(prompts, params)
    # one forward over the prefix (1 row), one over the 4 distinct suffixes (with the prefix cache), then decode
    assert calls[0] == (1, lcp, False)
    assert calls[1][0] == 4 and calls[1][2]
    assert calls[1][1] == max(len(p) for p in prompts) - lcp
    assert all(c[1] == 1 and c[2] for c in calls[2:])
    for prompt, sp, out in zip(prompts, params, outs, strict=True):
        alone = HFBackend(model, tok).generate([prompt], sp)[0]
        assert out.completion_ids == alone.completion_ids
        assert max(abs(x - y) for x, y in zip(out.logprobs, alone.logprobs, strict=True)) < 1e-5
        expected = teacher_forced_logprobs(model, prompt, out.completion_ids, max(sp.temperature, 1.0))
        assert max(abs(x - y) for x, y in zip(out.logprobs, expected, strict=True)) < 1e-4
    assert outs[4].completion_ids == reference_greedy(model, prompts[4], 4)


def test_short_common_prefix_is_not_shared(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    prompts = [chat_prompt(tok, q) for q in ("What is 2 + 3?", "Solve 3x + 7 = 22.")]
    backend = HFBackend(model, tok)
    calls = _record_forwards(backend)
    backend.generate(prompts, SamplingParams(max_new_tokens=2, temperature=0.0))
    assert calls[0] == (2, max(len(p) for p in prompts), False)

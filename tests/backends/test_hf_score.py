"""``HFBackend.score``: the log-probabilities of given completions, against a teacher-forced forward of the
reference model (one unpadded sequence at a time), with left padding, batch splits and empty completions."""

from __future__ import annotations

import pytest

from mas_train.backends.base import LogprobScorer, SamplingParams
from mas_train.backends.hf import HFBackend
from mas_train.backends.testing import chat_prompt, teacher_forced_logprobs


@pytest.fixture
def model_tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer


LONG = "The rules of a game that every prompt repeats before its own question. " * 6


@pytest.mark.parametrize("max_batch_size", [None, 2])
def test_score_with_a_shared_preamble_and_repeated_prompts(model_tok, max_batch_size):
    """Prompts that share a long preamble (prefilled once) and repeat (one prefill per distinct prompt), with
    completions of 1, 2 and 7 tokens: every row as a teacher-forced forward of its own sequence."""
    model, tok = model_tok
    backend = HFBackend(model, tok, max_batch_size=max_batch_size)
    a, b = chat_prompt(tok, LONG + "Card: J"), chat_prompt(tok, LONG + "Card: K, betting: bet")
    prompts = [a, b, a, b, a]
    comps = [tok.encode(t, add_special_tokens=False)
             for t in ("<move>bet</move>", "<move>fold</move>", "x", "<move>call</move>", "ok then")]  # fmt: skip
    assert sorted({len(c) for c in comps})[0] == 1 and max(len(c) for c in comps) >= 7
    got = backend.score(prompts, comps)
    for p, c, g in zip(prompts, comps, got, strict=True):
        assert g == pytest.approx(teacher_forced_logprobs(model, p, c, 1.0), abs=1e-4)


@pytest.mark.parametrize("max_batch_size", [None, 2])
def test_score_equals_a_teacher_forced_forward_row_by_row(model_tok, max_batch_size):
    model, tok = model_tok
    backend = HFBackend(model, tok, max_batch_size=max_batch_size)
    assert isinstance(backend, LogprobScorer) and backend.can_score
    prompts = [chat_prompt(tok, "Hi"), chat_prompt(tok, "A much longer prompt than the first one, really."),
               chat_prompt(tok, "Hi")]  # fmt: skip
    comps = [
        tok.encode("<move>bet</move>", add_special_tokens=False),
        tok.encode("x", add_special_tokens=False),
        [],
    ]
    got = backend.score(prompts, comps)
    assert [len(g) for g in got] == [len(c) for c in comps]
    for p, c, g in zip(prompts, comps, got, strict=True):
        assert g == pytest.approx(teacher_forced_logprobs(model, p, c, 1.0), abs=1e-4)


def test_score_of_a_greedy_completion_equals_its_sampling_logprobs(model_tok):
    """The greedy completion's reported logprobs are the model's temperature-1 ones: score gives them back."""
    model, tok = model_tok
    backend = HFBackend(model, tok)
    prompt = chat_prompt(tok, "Count: 1 2 3")
    (out,) = backend.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0, seed=0))
    (got,) = backend.score([prompt], [out.completion_ids])
    assert got == pytest.approx(out.logprobs, abs=1e-4)


def test_score_refuses_bad_requests(model_tok):
    model, tok = model_tok
    backend = HFBackend(model, tok)
    with pytest.raises(ValueError, match="2 completions for 1 prompts"):
        backend.score([[1, 2]], [[3], [4]])
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        backend.score([[]], [[3]])
    with pytest.raises(ValueError, match="outside"):
        backend.score([[1]], [[10**9]])
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        backend.score([[1]], [[2]])

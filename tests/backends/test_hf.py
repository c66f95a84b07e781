"""HFBackend: the backend contract on the tiny Qwen3 for real, plus what is specific to the HF backend."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from mas_train.backends import make_backend as make_backend_by_name
from mas_train.backends.base import SamplingParams
from mas_train.backends.hf import HFBackend
from mas_train.backends.hf.sampling import sample_tokens, truncate_logits
from mas_train.backends.testing import BackendContract, chat_prompt, reference_greedy, teacher_forced_logprobs


class TestHFBackend(BackendContract):
    """Default mode: a private copy of the model, all prompts in one batch."""

    @pytest.fixture
    def make_backend(self, tiny_model_and_tokenizer):
        model, tok = tiny_model_and_tokenizer
        return lambda: HFBackend(model, tok, seed=0)


class TestHFBackendSharedSmallBatches:
    """``share_model=True`` (on a private deep copy: the contract changes weights) and batches of 2.

    Reuses the contract tests where sharing or splitting the batch could matter (padding, batch composition,
    weight updates), to keep the default test run short.
    """

    logprob_atol = BackendContract.logprob_atol
    seeds_batch_invariant = True
    _check_logprobs = BackendContract._check_logprobs
    reference_model_and_tokenizer = BackendContract.reference_model_and_tokenizer
    backend = BackendContract.backend
    prompts = BackendContract.prompts
    test_greedy_round_trip_matches_reference_model = (
        BackendContract.test_greedy_round_trip_matches_reference_model
    )
    test_per_request_seed_independent_of_batch = BackendContract.test_per_request_seed_independent_of_batch
    test_mixed_sampling_params_in_one_call = BackendContract.test_mixed_sampling_params_in_one_call
    test_update_weights_bumps_version_and_changes_samples = (
        BackendContract.test_update_weights_bumps_version_and_changes_samples
    )

    @pytest.fixture
    def make_backend(self, tiny_model_and_tokenizer):
        model, tok = tiny_model_and_tokenizer
        return lambda: HFBackend(copy.deepcopy(model), tok, share_model=True, max_batch_size=2)


@pytest.fixture
def model_tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer


def test_private_copy_leaves_callers_model_alone(model_tok):
    model, tok = model_tok
    before = {k: v.clone() for k, v in model.state_dict().items()}
    backend = HFBackend(model, tok)
    head = backend.model.get_output_embeddings().weight
    backend.update_weights({"lm_head.weight": torch.zeros_like(head)})
    assert torch.count_nonzero(backend.model.get_output_embeddings().weight) == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert backend.model is not model


def test_shared_model_sees_in_place_training_and_keeps_train_mode(model_tok):
    model, tok = model_tok
    trainer_model = copy.deepcopy(model).train()
    backend = HFBackend(trainer_model, tok, share_model=True)
    prompt = [chat_prompt(tok, "What is 2 + 3?")]
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    first = backend.generate(prompt, greedy)[0].completion_ids
    assert trainer_model.training  # restored after sampling in eval mode
    with torch.no_grad():
        trainer_model.lm_head.weight.neg_()  # "an optimizer step" on the shared module
    # the trainer passes its own tensors: nothing is copied, only the version moves
    assert backend.update_weights(trainer_model.state_dict()) == 1
    second = backend.generate(prompt, greedy)[0]
    assert second.completion_ids != first and second.weight_version == 1
    assert second.completion_ids == reference_greedy(trainer_model.eval(), prompt[0], 4)


def test_update_weights_is_all_or_nothing(model_tok):
    model, tok = model_tok
    backend = HFBackend(model, tok)
    head = backend.model.lm_head.weight.clone()
    bad = {"lm_head.weight": torch.zeros_like(head), "no.such.weight": torch.zeros(2)}
    with pytest.raises(RuntimeError, match=r"nothing was changed: unknown tensor 'no.such.weight'"):
        backend.update_weights(bad)
    with pytest.raises(RuntimeError, match=r"shape \(3,\) != \(64,\)"):
        backend.update_weights({"model.norm.weight": torch.ones(3)})
    with pytest.raises(RuntimeError, match="no tensors"):
        backend.update_weights({})
    assert torch.equal(backend.model.lm_head.weight, head) and backend.weight_version == 0


def test_update_weights_strips_wrapper_prefixes_and_casts(model_tok):
    model, tok = model_tok
    backend = HFBackend(model, tok)
    ones = torch.ones(64, dtype=torch.float64)
    assert backend.update_weights([("_orig_mod.module.model.norm.weight", ones * 2)]) == 1
    assert backend.model.model.norm.weight.dtype == torch.float32
    assert torch.equal(backend.model.model.norm.weight, torch.full((64,), 2.0))


def test_private_copy_in_bfloat16(model_tok):
    # runs on every CPU: without oneDNN's bf16 path the bf16 layers step aside to F.linear (packing refuses them)
    model, tok = model_tok
    backend = HFBackend(model, tok, dtype=torch.bfloat16)
    assert (
        backend.model.lm_head.weight.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.float32
    )
    prompt = chat_prompt(tok, "What is 2 + 3?")
    out = backend.generate([prompt], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))[0]
    assert len(out.logprobs) == 4 and all(lp <= 0 for lp in out.logprobs)
    expected = teacher_forced_logprobs(backend.model, prompt, out.completion_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(out.logprobs, expected, strict=True)) < 0.1  # bf16 noise


def test_bad_requests_raise(model_tok):
    model, tok = model_tok
    backend = HFBackend(model, tok)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        backend.generate([[1, 2], []], SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError, match=r"outside \[0, 151669\)"):
        backend.generate([[151669]], SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError, match="max_batch_size"):
        HFBackend(model, tok, max_batch_size=0)
    with pytest.raises(ValueError, match="only apply to the private copy"):
        HFBackend(model, tok, share_model=True, dtype=torch.bfloat16)
    assert backend.generate([], SamplingParams()) == []


def test_asleep_or_closed_backend_refuses_work(model_tok):
    model, tok = model_tok
    backend = HFBackend(model, tok)
    backend.sleep()
    with pytest.raises(RuntimeError, match="call wake"):
        backend.generate([[1]], SamplingParams(max_new_tokens=1))
    backend.wake()
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        backend.generate([[1]], SamplingParams(max_new_tokens=1))
    with pytest.raises(RuntimeError, match="closed"):
        backend.update_weights({"model.norm.weight": torch.ones(64)})


def test_unseeded_requests_reproducible_from_backend_seed(model_tok):
    model, tok = model_tok
    prompts = [chat_prompt(tok, "hello"), chat_prompt(tok, "world")]
    sp = SamplingParams(max_new_tokens=6, temperature=1.0)
    a = HFBackend(model, tok, seed=7).generate(prompts, sp)
    b = HFBackend(model, tok, seed=7).generate(prompts, sp)
    c = HFBackend(model, tok, seed=8).generate(prompts, sp)
    assert [o.completion_ids for o in a] == [o.completion_ids for o in b]
    assert [o.completion_ids for o in a] != [o.completion_ids for o in c]
    assert a[0].meta["seed"] == b[0].meta["seed"]


def test_eos_ids_default_to_tokenizer_and_generation_config(model_tok):
    model, tok = model_tok
    assert HFBackend(model, tok).eos_token_ids == {151645, 151643}  # <|im_end|>, <|endoftext|>
    assert HFBackend(model, tok, eos_token_ids=[7]).eos_token_ids == {7}


def test_custom_eos_id_stops_and_is_kept(model_tok):
    """Any id in eos_token_ids ends the row; here the 3rd greedy token is declared EOS."""
    model, tok = model_tok
    prompt = chat_prompt(tok, "What is 2 + 3?")
    ref = reference_greedy(model, prompt, 6)
    assert ref[2] not in ref[:2]
    out = HFBackend(model, tok, eos_token_ids=[ref[2]]).generate(
        [prompt], SamplingParams(max_new_tokens=6, temperature=0)
    )
    assert out[0].completion_ids == ref[:3] and out[0].finish_reason == "stop" and out[0].stop_string is None


def test_sampler_frequencies_match_truncated_distribution():
    """Inverse-CDF sampling draws each token with its (truncated, renormalised) probability."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]]).repeat(40_000, 1)
    n = logits.shape[0]
    gen = torch.Generator().manual_seed(0)
    draws = torch.rand(n, generator=gen)
    no = torch.zeros(n, dtype=torch.long)
    off = torch.ones(n)
    greedy = torch.zeros(n, dtype=torch.bool)

    picked = sample_tokens(logits, torch.log_softmax(logits, -1), draws, no, off, greedy, False)
    freq = torch.bincount(picked, minlength=5).double() / n
    assert torch.allclose(freq, torch.softmax(logits[0].double(), -1), atol=0.01)

    # top_k=2 keeps {0, 1} with probabilities e^2/(e^2+e), e/(e^2+e) = 0.7311, 0.2689
    picked = sample_tokens(logits, None, draws, no + 2, off, greedy, True)
    freq = torch.bincount(picked, minlength=5).double() / n
    assert torch.allclose(freq, torch.tensor([0.7311, 0.2689, 0, 0, 0], dtype=torch.float64), atol=0.01)

    # top_p=0.7: p = [.6412, .2359, .0868, .0319, .0043]; mass before token 1 is .6412 < .7, before 2 .8771
    picked = sample_tokens(logits, None, draws, no, off * 0.7, greedy, True)
    freq = torch.bincount(picked, minlength=5).double() / n
    assert torch.allclose(freq, torch.tensor([0.7311, 0.2689, 0, 0, 0], dtype=torch.float64), atol=0.01)


@pytest.mark.parametrize(
    ("vocab", "k", "p"),
    [(50, 0, 0.9), (50, 5, 1.0), (50, 5, 0.5), (3000, 0, 0.3), (3000, 0, 0.999), (3000, 2000, 0.95)],
)
def test_truncation_matches_transformers_warpers(vocab, k, p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    x = torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab + k)) * 3
    ref = x.clone()
    if k:
        ref = TopKLogitsWarper(k)(None, ref)
    if p < 1:
        ref = TopPLogitsWarper(p)(None, ref)
    got = truncate_logits(x, torch.full((3,), k), torch.full((3,), p), torch.zeros(3, dtype=torch.bool))
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    assert torch.equal(got[torch.isfinite(got)], x[torch.isfinite(got)])


def test_make_backend_factory(model_tok):
    model, tok = model_tok
    from mas_train.backends.options import HFOptions

    made = make_backend_by_name("hf", HFOptions(max_batch_size=3), model, tok)
    assert isinstance(made, HFBackend) and made.max_batch_size == 3
    assert (
        make_backend_by_name("hf", {"max_batch_size": 2, "dtype": "bfloat16"}, model, tok).max_batch_size == 2
    )
    # a resolved model group: its backend and typed backend_options
    group = SimpleNamespace(backend="hf", backend_options=HFOptions(max_batch_size=5, seed=1))
    assert make_backend_by_name(group, model, tok).max_batch_size == 5
    with pytest.raises(ValueError, match="unknown backend 'vlm'.*Did you mean 'hf'|unknown backend 'vlm'"):
        make_backend_by_name("vlm", None, model, tok)
    with pytest.raises(ValueError, match=r"no option 'max_batch'. Did you mean 'max_batch_size'"):
        make_backend_by_name("hf", {"max_batch": 3}, model, tok)
    with pytest.raises(ValueError, match="needs the model group's model and tokenizer"):
        make_backend_by_name("hf")


def test_rows_finishing_early_leave_the_batch_without_disturbing_others(model_tok):
    """Finished rows are dropped from the batch and KV cache; the remaining rows keep their own state."""
    model, tok = model_tok
    prompts = [chat_prompt(tok, q) for q in ("a", "What is 2 + 3?", "Solve 3x + 7 = 22 step by step.")]
    lengths = [2, 8, 5]
    params = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in lengths]
    outs = HFBackend(model, tok).generate(prompts, params)
    for prompt, n, out in zip(prompts, lengths, outs, strict=True):
        assert out.completion_ids == reference_greedy(model, prompt, n)


def _record_prefill_rows(backend: HFBackend) -> list[int]:
    """Batch sizes of the prefill forwards (those without a cache) that ``backend`` runs from now on."""
    rows: list[int] = []
    forward = backend._forward

    def recording(ids, mask, pos, cache, adapters=None):
        if cache is None:
            rows.append(ids.shape[0])
        return forward(ids, mask, pos, cache, adapters)

    backend._forward = recording
    return rows


def test_identical_prompts_prefill_once_and_sample_as_if_alone(model_tok):
    """A task group's G identical prompts share one prefill; each row still samples with its own seed/params."""
    model, tok = model_tok
    a, b, c = (chat_prompt(tok, q) for q in ("What is 2 + 3?", "Solve 3x + 7 = 22.", "hello"))
    prompts = [a, b, a, c, a, b, a]
    params = [
        SamplingParams(max_new_tokens=8, temperature=1.0, seed=1),
        SamplingParams(max_new_tokens=5, temperature=0.7, seed=2),
        SamplingParams(max_new_tokens=3, temperature=1.0, seed=3),  # leaves the expanded batch early
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=4),
        SamplingParams(max_new_tokens=8, temperature=1.0, seed=1),  # same prompt and seed as row 0
        SamplingParams(max_new_tokens=7, temperature=1.0, seed=5, top_k=20),
        SamplingParams(max_new_tokens=4, temperature=0.0),
    ]
    backend = HFBackend(model, tok)
    prefill_rows = _record_prefill_rows(backend)
    outs = backend.generate(prompts, params)
    assert prefill_rows == [3]  # three distinct prompts, one prefill forward over them
    assert outs[0].completion_ids == outs[4].completion_ids
    assert outs[0].completion_ids[:3] != outs[2].completion_ids  # same prompt, other seed: other sample
    for prompt, sp, out in zip(prompts, params, outs, strict=True):
        alone = HFBackend(model, tok).generate([prompt], sp)[0]
        assert out.completion_ids == alone.completion_ids
        assert out.finish_reason == alone.finish_reason
        assert max(abs(x - y) for x, y in zip(out.logprobs, alone.logprobs, strict=True)) < 1e-6
    assert outs[6].completion_ids == reference_greedy(model, a, 4)
    expected = teacher_forced_logprobs(model, a, outs[0].completion_ids, 1.0)
    assert max(abs(x - y) for x, y in zip(outs[0].logprobs, expected, strict=True)) < 1e-3


def test_batch_split_keeps_identical_prompts_together(model_tok):
    """With max_batch_size, equal-length duplicates are ordered together, so each batch prefills one prompt."""
    model, tok = model_tok
    a, b = [11, 12, 13], [11, 12, 14]
    backend = HFBackend(model, tok, max_batch_size=2)
    prefill_rows = _record_prefill_rows(backend)
    sp = [SamplingParams(max_new_tokens=3, temperature=1.0, seed=s) for s in range(4)]
    outs = backend.generate([b, a, b, a], sp)
    assert prefill_rows == [1, 1]
    for prompt, p, out in zip([b, a, b, a], sp, outs, strict=True):
        assert out.completion_ids == HFBackend(model, tok).generate([prompt], p)[0].completion_ids

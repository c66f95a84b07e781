"""HFBackend with per-row LoRA adapters (PEFT mixed-adapter batches): one call over rows of two adapters gives
the same token ids, logprobs, finish reasons and stop strings as one call per adapter."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("peft")

from mas_train.backends.base import SamplingParams  # noqa: E402
from mas_train.backends.hf import HFBackend  # noqa: E402
from mas_train.backends.testing import chat_prompt, teacher_forced_logprobs  # noqa: E402
from tests.backends.test_hf import _record_prefill_rows  # noqa: E402

ADAPTERS = ("solver", "verifier")


@pytest.fixture(scope="module")
def peft_and_tok(tiny_model_and_tokenizer):
    """The tiny Qwen3 with two LoRA adapters whose B is non-zero (so they change the outputs, differently)."""
    from peft import LoraConfig, get_peft_model

    model, tok = tiny_model_and_tokenizer
    cfg = dict(target_modules=["q_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        peft = get_peft_model(
            copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, **cfg), adapter_name="solver"
        )
        peft.add_adapter("verifier", LoraConfig(r=2, lora_alpha=4, **cfg))
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0.0, 0.5)
    peft.eval()
    return peft, tok


def _requests(tok):
    # two identical prompts under different adapters (must not share a prefill), distinct lengths, mixed
    # temperatures / top-k / top-p / greedy and stop strings, all seeded
    long = "Explain, step by step and very carefully, " * 8
    texts = ["What is 2 + 3?", "What is 2 + 3?", "Name a colour.", long + "why?", long + "how?", "Hi"]
    adapters = ["solver", "verifier", "verifier", "solver", "verifier", "solver"]
    sampling = [
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=11),
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=11),
        SamplingParams(max_new_tokens=5, temperature=0.0, seed=3),
        SamplingParams(max_new_tokens=7, temperature=0.7, top_k=20, seed=5, stop=("a", "e")),
        SamplingParams(max_new_tokens=4, temperature=1.3, top_p=0.9, seed=6),
        SamplingParams(max_new_tokens=3, temperature=1.0, seed=7, stop=("o",)),
    ]
    return [chat_prompt(tok, t) for t in texts], sampling, adapters


def _one_call_per_adapter(backend, peft, prompts, sampling, adapters):
    outs = [None] * len(prompts)
    for name in ADAPTERS:
        rows = [i for i, a in enumerate(adapters) if a == name]
        peft.set_adapter(name)
        got = backend.generate([prompts[i] for i in rows], [sampling[i] for i in rows])
        for i, out in zip(rows, got, strict=True):
            outs[i] = out
    peft.set_adapter("solver")
    return outs


@pytest.mark.parametrize("max_batch_size", [None, 2])
def test_mixed_adapter_call_equals_one_call_per_adapter(peft_and_tok, max_batch_size):
    peft, tok = peft_and_tok
    backend = HFBackend(peft, tok, share_model=True, max_batch_size=max_batch_size)
    prompts, sampling, adapters = _requests(tok)
    reference = _one_call_per_adapter(backend, peft, prompts, sampling, adapters)
    peft.set_adapter("verifier")  # the active adapter must not matter: each row names its own
    mixed = backend.generate(prompts, sampling, adapters=adapters)
    for i, (m, r) in enumerate(zip(mixed, reference, strict=True)):
        assert m.completion_ids == r.completion_ids, i
        assert m.finish_reason == r.finish_reason and m.stop_string == r.stop_string, i
        assert m.meta["seed"] == r.meta["seed"] == sampling[i].seed
        assert torch.allclose(torch.tensor(m.logprobs), torch.tensor(r.logprobs), atol=1e-5), i
    # the adapters really differ: the same prompt and seed under the other adapter gives other logprobs
    assert not torch.allclose(torch.tensor(mixed[0].logprobs), torch.tensor(mixed[1].logprobs), atol=1e-3)
    # and each row's logprobs are its own adapter's (teacher-forced with that adapter active)
    for i in (0, 1, 4):
        peft.set_adapter(adapters[i])
        expected = teacher_forced_logprobs(peft, prompts[i], mixed[i].completion_ids, sampling[i].temperature)
        assert torch.allclose(torch.tensor(mixed[i].logprobs), torch.tensor(expected), atol=1e-4), i
    peft.set_adapter("solver")


def test_one_adapter_rows_share_the_long_prefix_and_match(peft_and_tok):
    # a task group's later turns: distinct prompts with a long common prefix (prefilled once), all one adapter
    peft, tok = peft_and_tok
    backend = HFBackend(peft, tok, share_model=True)
    head = "You are a careful solver. " * 20
    prompts = [chat_prompt(tok, head + f"Question {k}?") for k in range(3)]
    sampling = [SamplingParams(max_new_tokens=4, temperature=1.0, seed=k) for k in range(3)]
    peft.set_adapter("verifier")
    reference = backend.generate(prompts, sampling)
    peft.set_adapter("solver")
    mixed = backend.generate(prompts, sampling, adapters=["verifier"] * 3)
    for m, r in zip(mixed, reference, strict=True):
        assert m.completion_ids == r.completion_ids
        assert torch.allclose(torch.tensor(m.logprobs), torch.tensor(r.logprobs), atol=1e-5)


def test_a_prompt_is_prefilled_once_per_adapter(peft_and_tok):
    peft, tok = peft_and_tok
    backend = HFBackend(peft, tok, share_model=True)
    prompt = chat_prompt(tok, "What is 2 + 3?")
    sampling = [SamplingParams(max_new_tokens=3, temperature=1.0, seed=k) for k in range(4)]
    rows = _record_prefill_rows(backend)
    outs = backend.generate([prompt] * 4, sampling, adapters=["solver", "verifier", "solver", "verifier"])
    assert rows == [2]  # one prefill row per (adapter, prompt), copied to the rows that share it
    peft.set_adapter("verifier")
    alone = backend.generate([prompt] * 2, sampling[1::2])
    peft.set_adapter("solver")
    assert [o.completion_ids for o in outs[1::2]] == [o.completion_ids for o in alone]
    assert torch.allclose(torch.tensor(outs[3].logprobs), torch.tensor(alone[1].logprobs), atol=1e-5)


def test_adapters_that_cannot_be_honoured_are_refused(peft_and_tok, tiny_model_and_tokenizer):
    peft, tok = peft_and_tok
    backend = HFBackend(peft, tok, share_model=True)
    sp = SamplingParams(max_new_tokens=1)
    with pytest.raises(ValueError, match="got 1 adapter names for 2 prompts"):
        backend.generate([[1, 2], [3]], sp, adapters=["solver"])
    with pytest.raises(ValueError, match=r"adapters \['critic'\] are not adapters of the model"):
        backend.generate([[1, 2]], sp, adapters=["critic"])
    plain = HFBackend(*tiny_model_and_tokenizer)
    with pytest.raises(ValueError, match="needs a peft.PeftModel"):
        plain.generate([[1, 2]], sp, adapters=["solver"])
    merged = copy.deepcopy(peft)
    merged.merge_adapter(["solver"])
    with pytest.raises(ValueError, match="merged into the base weights"):
        HFBackend(merged, tok, share_model=True).generate([[1, 2]], sp, adapters=["solver"])


def test_a_peft_model_gets_the_cache_keyword_and_no_deprecation_warning(peft_and_tok):
    # Regression: PEFT's forward(*args, **kwargs) hid `cache` and `logits_to_keep`, so every LoRA run passed the
    # deprecated `past_key_values` (a FutureWarning per run) and prefilled full B x L x vocab logits.
    import warnings

    peft, tok = peft_and_tok
    backend = HFBackend(peft, tok, share_model=True)
    assert backend._cache_kw == "cache" and backend._keep_last_logits
    prompts, sampling, adapters = _requests(tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        outs = backend.generate(prompts[:2], sampling[:2], adapters=adapters[:2])
    assert all(1 <= len(o.completion_ids) == len(o.logprobs) <= 6 for o in outs)

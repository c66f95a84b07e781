"""The fused decode step (:mod:`mas_train.backends.hf.decode`) against the model's own forward, and the two-level
inverse-CDF sampler against a full cumulative sum."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from mas_train.backends.base import SamplingParams
from mas_train.backends.hf import HFBackend
from mas_train.backends.hf import decode as hf_decode
from mas_train.backends.hf import kernels as hf_kernels
from mas_train.backends.hf.sampling import CDF_BLOCK, inverse_cdf
from mas_train.backends.testing import chat_prompt


def _tiny(arch: str):
    """A random tiny model of ``arch`` (GQA: 4 query heads over 2 key/value heads)."""
    import transformers

    cfg_cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }[arch]
    extra = {"attention_bias": True} if arch == "llama" else {}
    if arch == "mistral":
        extra["sliding_window"] = None
    cfg = cfg_cls(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **extra,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, type(cfg).__name__.replace("Config", "ForCausalLM"))(cfg)
        if arch == "llama":  # non-zero biases, so the fused step's bias handling is exercised
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if name.endswith("bias"):
                        p.normal_(0.0, 0.2)
    return model.eval()


def _prompts(vocab: int):
    # distinct lengths (left padding) and different max_new_tokens (rows leave the batch at different steps)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (9, 4, 1, 6)]
    sampling = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in (7, 3, 5, 1)]
    sampling[1] = SamplingParams(max_new_tokens=6, temperature=1.0, seed=4)
    return prompts, sampling


def _compare(model, tok, prompts, sampling, adapters=None, tol=1e-4, **kw):
    """The fused step's outputs equal the model forward's: ids, finish reasons, logprobs within ``tol``."""
    ref = HFBackend(model, tok, share_model=True, fused_decode=False, **kw)
    fused = HFBackend(model, tok, share_model=True, **kw)
    assert fused._fused_decode is None and ref._fused_decode is False
    calls = []
    build = hf_decode.FusedDecoder.build.__func__

    def spy(cls, *args):
        step = build(cls, *args)
        calls.append(step)
        return step

    want = ref.generate(prompts, sampling, adapters=adapters)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_decode.FusedDecoder, "build", classmethod(spy))
        got = fused.generate(prompts, sampling, adapters=adapters)
    assert calls and all(c is not None for c in calls)  # the fused step really ran
    for w, g in zip(want, got, strict=True):
        assert g.completion_ids == w.completion_ids and g.finish_reason == w.finish_reason
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) < tol
    assert sum(len(w.completion_ids) for w in want) > len(want)
    return got


class _Tok:
    pad_token_id = 0
    eos_token_id = 1

    def decode(self, ids, **kw):
        return " ".join(map(str, ids))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("packed", [False, True])
def test_fused_decode_matches_the_model_forward(arch, packed, monkeypatch):
    if packed:
        if not hf_kernels.onednn_available():
            pytest.skip("this torch build has no oneDNN")
        monkeypatch.setattr(hf_kernels, "MIN_PACKED_NUMEL", 0)  # pack every linear of the tiny model
    model = _tiny(arch)
    prompts, sampling = _prompts(model.config.vocab_size)
    _compare(model, _Tok(), prompts, sampling, eos_token_ids=(), packed_linears=packed)


def test_fused_decode_matches_on_qwen3_with_qk_norms(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    assert hasattr(model.model.layers[0].self_attn, "q_norm")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        model = copy.deepcopy(model)
        for lay in model.model.layers:  # norms away from 1, so a skipped q/k norm would show
            lay.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            lay.self_attn.k_norm.weight.uniform_(0.5, 1.5)
            lay.self_attn.k_norm.variance_epsilon = 0.5  # k_norm's own eps, not q_norm's, must be used
    prompts = [chat_prompt(tok, t) for t in ("What is 2 + 3?", "Hi", "Name a colour, then two more.")]
    sampling = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in (6, 2, 4)]
    _compare(model, tok, prompts, sampling, eos_token_ids=())


def test_fused_decode_matches_peft_mixed_adapter_batches(tiny_model_and_tokenizer):
    peft = pytest.importorskip("peft")
    model, tok = tiny_model_and_tokenizer
    cfg = dict(target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pm = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, lora_alpha=8, **cfg), "solver")
        pm.add_adapter("verifier", peft.LoraConfig(r=2, lora_alpha=4, **cfg))
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0.0, 0.5)
    pm.eval()
    prompts = [chat_prompt(tok, t) for t in ("What is 2 + 3?", "What is 2 + 3?", "Hi", "Name a colour.")]
    sampling = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in (6, 6, 2, 4)]
    mixed = _compare(pm, tok, prompts, sampling, adapters=["solver", "verifier", "verifier", "solver"])
    assert mixed[0].completion_ids != mixed[1].completion_ids  # the adapters really differ
    _compare(pm, tok, prompts, sampling)  # no adapter names: the active adapter on every row
    pm.set_adapter("verifier")
    _compare(pm, tok, prompts, sampling)
    with pm.disable_adapter():
        _compare(pm, tok, prompts, sampling)


def test_a_dora_adapter_steps_through_the_model_forward(tiny_model_and_tokenizer):
    peft = pytest.importorskip("peft")
    model, tok = tiny_model_and_tokenizer
    cfg = peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora=True, task_type="CAUSAL_LM")
    pm = peft.get_peft_model(copy.deepcopy(model), cfg).eval()
    prompt = [chat_prompt(tok, "Hi")]
    sp = SamplingParams(max_new_tokens=3, temperature=0.0)
    want = HFBackend(pm, tok, share_model=True, fused_decode=False).generate(prompt, sp)
    assert (
        HFBackend(pm, tok, share_model=True).generate(prompt, sp)[0].completion_ids == want[0].completion_ids
    )
    with pytest.raises(RuntimeError, match="fused_decode=True, but this batch cannot run the fused step"):
        HFBackend(pm, tok, share_model=True, fused_decode=True).generate(prompt, sp)


def test_fused_decode_true_is_refused_where_unsupported():
    import transformers

    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)
    )
    with pytest.raises(ValueError, match="fused_decode=True, but GPT2LMHeadModel is not one of"):
        HFBackend(gpt2, _Tok(), share_model=True, fused_decode=True)
    assert HFBackend(gpt2, _Tok(), share_model=True)._fused_decode is False  # None: off, the forward steps
    fp16 = _tiny("llama").to(torch.float16)
    with pytest.raises(ValueError, match="its weights are neither all fp32 nor all bf16"):
        HFBackend(fp16, _Tok(), share_model=True, fused_decode=True)
    assert HFBackend(_tiny("llama").to(torch.bfloat16), _Tok(), share_model=True, fused_decode=True)


def test_a_lora_on_the_embedding_is_refused_before_any_batch(tiny_model_and_tokenizer):
    peft = pytest.importorskip("peft")
    from mas_train.backends import make_backend
    from mas_train.backends.options import HFOptions

    model, tok = tiny_model_and_tokenizer
    cfg = peft.LoraConfig(r=2, target_modules=["embed_tokens", "q_proj"], task_type="CAUSAL_LM")
    pm = peft.get_peft_model(copy.deepcopy(model), cfg).eval()
    with pytest.raises(ValueError, match="fused_decode=True, but its input embedding is a Embedding, not an"):
        HFBackend(pm, tok, share_model=True, fused_decode=True)
    assert HFBackend(pm, tok, share_model=True)._fused_decode is False
    # the typed backend option reaches the backend
    assert make_backend("hf", HFOptions(fused_decode=False), model, tok)._fused_decode is False
    assert make_backend("hf", HFOptions(), model, tok)._fused_decode is None


@pytest.mark.parametrize("vocab", [5, CDF_BLOCK, 1000, 49152])
def test_inverse_cdf_picks_the_full_cumsum_token_and_never_a_zero_probability_one(vocab):
    g = torch.Generator().manual_seed(vocab)
    probs = torch.softmax(torch.randn(256, vocab, generator=g) * 3, -1)
    probs[:, ::3] = 0  # tokens a truncation removed
    draws = torch.rand(256, generator=g)
    cdf = probs.double().cumsum(-1)
    want = torch.searchsorted(cdf, (draws.double() * cdf[:, -1])[:, None], right=True)[:, 0]
    got = inverse_cdf(probs, draws)
    assert torch.equal(got, want)
    assert bool((probs[torch.arange(256), got] > 0).all())


def test_inverse_cdf_edges():
    one = torch.zeros(3, 1000)
    one[:, 0] = 1.0
    assert inverse_cdf(one, torch.tensor([0.0, 0.5, 1 - 1e-12])).tolist() == [0, 0, 0]
    tail = torch.zeros(2, 1000)
    tail[:, 3], tail[:, 999] = 1.0, 1e-30  # the last block's mass is tiny but positive
    assert inverse_cdf(tail, torch.tensor([0.25, 0.999999])).tolist() == [3, 3]


def _ids(model, **kw):
    prompts, sampling = _prompts(model.config.vocab_size)
    outs = HFBackend(model, _Tok(), share_model=True, eos_token_ids=(), **kw).generate(prompts, sampling)
    return [o.completion_ids for o in outs]


def test_a_forward_hook_leaves_the_batch_to_the_model_forward():
    # the step calls no module, so a hook (a user's steering hook, accelerate's replaced forward) would be skipped
    model = _tiny("llama")
    handle = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, args, out: out * 0 + 1.0)
    want = _ids(model, fused_decode=False)
    assert _ids(model) == want
    with pytest.raises(RuntimeError, match="a module with forward hooks"):
        _ids(model, fused_decode=True)
    handle.remove()
    lin = model.model.layers[1].mlp.down_proj
    lin.forward = lambda x: (
        F.linear(x, lin.weight) * 2
    )  # a replaced forward (accelerate's) is not the class's
    want = _ids(model, fused_decode=False)
    assert _ids(model) == want
    with pytest.raises(RuntimeError, match="a module with forward hooks"):
        _ids(model, fused_decode=True)
    del lin.forward
    model.enable_input_require_grads()  # a trainer's gradient-checkpointing hook changes no value: still fused
    prompts, sampling = _prompts(model.config.vocab_size)
    _compare(model, _Tok(), prompts, sampling, eos_token_ids=())


def test_a_bf16_lora_adapter_on_an_fp32_model_is_refused():
    # PEFT casts a row's input to its LoRA factors' dtype (bf16 rounding); the step's fp32 stack would not
    peft = pytest.importorskip("peft")
    cfg = dict(target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pm = peft.get_peft_model(_tiny("llama"), peft.LoraConfig(r=4, **cfg), "a")
        pm.add_adapter("b", peft.LoraConfig(r=4, **cfg))
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0.0, 0.5)
    for m in pm.modules():
        if hasattr(m, "lora_A") and "b" in m.lora_A:
            m.lora_A["b"].bfloat16()
            m.lora_B["b"].bfloat16()
    pm.eval()
    prompts, sampling = _prompts(pm.config.vocab_size)
    names = ["a", "b", "b", "a"]
    want = HFBackend(pm, _Tok(), share_model=True, fused_decode=False, eos_token_ids=())
    got = HFBackend(pm, _Tok(), share_model=True, eos_token_ids=())
    ref, fused = (b.generate(prompts, sampling, adapters=names) for b in (want, got))
    for w, g in zip(ref, fused, strict=True):
        assert g.completion_ids == w.completion_ids and g.logprobs == pytest.approx(w.logprobs, abs=1e-6)
    with pytest.raises(ValueError, match="its weights are neither all fp32 nor all bf16"):
        HFBackend(pm, _Tok(), share_model=True, fused_decode=True)


@pytest.mark.parametrize("fused", [False, None])
def test_disabled_adapters_of_a_merged_model_are_unmerged_before_packing(fused, monkeypatch):
    # PEFT's forward unmerges a disabled layer's merged adapters on its first call; packed before, the copy (used
    # by the packed forward and the fused step alike) kept the merged weights
    peft = pytest.importorskip("peft")
    if not hf_kernels.onednn_available():
        pytest.skip("this torch build has no oneDNN")
    monkeypatch.setattr(hf_kernels, "MIN_PACKED_NUMEL", 0)
    cfg = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pm = peft.get_peft_model(_tiny("llama"), cfg)
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0.0, 1.0)
    pm.eval()
    with pm.disable_adapter():
        want = _ids(pm, fused_decode=False, packed_linears=False)
    assert _ids(pm, fused_decode=False, packed_linears=False) != want  # the adapter changes the tokens
    pm.merge_adapter()
    with pm.disable_adapter():
        assert _ids(pm, fused_decode=fused, packed_linears=True) == want


def test_replaced_modules_and_custom_attention_are_refused():
    import transformers

    model = _tiny("qwen2")

    class ShiftedMLP(type(model.model.layers[0].mlp)):
        def forward(self, x):
            return super().forward(x) + 0.5

    mlp = model.model.layers[1].mlp
    mlp.__class__ = ShiftedMLP  # same weights, another forward
    want = _ids(model, fused_decode=False)
    assert _ids(model) == want
    with pytest.raises(ValueError, match=r"it has modules of other classes \(ShiftedMLP\)"):
        HFBackend(model, _Tok(), share_model=True, fused_decode=True)
    mlp.__class__ = ShiftedMLP.__mro__[1]

    def halved(module, query, key, value, attention_mask, **kw):
        out, w = transformers.integrations.sdpa_attention.sdpa_attention_forward(
            module, query, key, value, attention_mask, **kw
        )
        return out * 0.5, w

    transformers.AttentionInterface.register("halved_sdpa", halved)
    model.config._attn_implementation = "halved_sdpa"
    want = _ids(model, fused_decode=False)
    assert _ids(model) == want
    with pytest.raises(ValueError, match="its attention implementation 'halved_sdpa' is not eager or sdpa"):
        HFBackend(model, _Tok(), share_model=True, fused_decode=True)


def test_trls_fused_lm_head_patch_still_runs_the_fused_step(tiny_model_and_tokenizer):
    # GRPOTrainer patches the trained model's forward (add_fused_lm_head); the backend samples with that very
    # module on CPU, so refusing every instance forward made the default run step through the model forward
    from trl.trainer.utils import add_fused_lm_head

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model)
    add_fused_lm_head(model, temperature=1.0)
    assert "forward" in model.__dict__
    prompts = [chat_prompt(tok, t) for t in ("What is 2 + 3?", "Hi")]
    _compare(model, tok, prompts, [SamplingParams(max_new_tokens=n, temperature=0.0) for n in (5, 3)])


#: bf16 keeps 8 bits of mantissa, and the fused step rounds at other places than the model's forward (an fp32
#: LoRA delta added before rounding, one F.rms_norm for Llama's two roundings, another summation order): on the
#: tiny models they agree to 6e-3 (measured), so to this, not to fp32's 1e-4
BF16_LOGPROB_TOL = 2e-2
#: a bf16 step against the fp32 model its weights were rounded from (measured 3e-3 on the tiny Qwen3)
BF16_VS_FP32_TOL = 2e-2


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_decode_in_bf16_matches_the_bf16_model_forward(arch):
    model = _tiny(arch).to(torch.bfloat16)
    prompts, sampling = _prompts(model.config.vocab_size)
    _compare(model, _Tok(), prompts, sampling, eos_token_ids=(), tol=BF16_LOGPROB_TOL)


def test_fused_decode_on_a_bf16_base_with_fp32_lora_adapters(tiny_model_and_tokenizer):
    # What dtype auto builds for a LoRA group on a native-bf16 CPU: PEFT keeps the adapters fp32 over a bf16 base.
    # Greedy ties of the random 151k-token model break differently under bf16 rounding, so each row's completion
    # is scored teacher-forced by the model's own forward (bf16) and by the fp32 model it came from.
    peft = pytest.importorskip("peft")
    from mas_train.backends.testing import teacher_forced_logprobs

    model, tok = tiny_model_and_tokenizer
    cfg = dict(target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pm32 = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, lora_alpha=8, **cfg), "solver")
        pm32.add_adapter("verifier", peft.LoraConfig(r=2, lora_alpha=4, **cfg))
        with torch.no_grad():
            for name, p in pm32.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0.0, 0.5)
    pm = copy.deepcopy(pm32)
    for n, p in pm.named_parameters():
        if ".lora_" not in n:
            p.data = p.data.to(torch.bfloat16)
    assert {p.dtype for n, p in pm.named_parameters() if ".lora_" in n} == {torch.float32}
    assert {p.dtype for n, p in pm.named_parameters() if ".lora_" not in n} == {torch.bfloat16}
    pm.eval(), pm32.eval()
    prompts = [chat_prompt(tok, t) for t in ("What is 2 + 3?", "What is 2 + 3?", "Hi", "Name a colour.")]
    sampling = [SamplingParams(max_new_tokens=n, temperature=1.0, seed=i) for i, n in enumerate((6, 6, 2, 4))]
    names = ["solver", "verifier", "verifier", "solver"]
    steps = []
    build = hf_decode.FusedDecoder.build.__func__

    def spy(cls, *args):
        steps.append(build(cls, *args))
        return steps[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_decode.FusedDecoder, "build", classmethod(spy))
        got = HFBackend(pm, tok, share_model=True).generate(prompts, sampling, adapters=names)
    assert steps and all(s is not None for s in steps)  # the fused step really ran, in bf16
    worst = {"bf16 forward": 0.0, "fp32 model": 0.0}
    with torch.no_grad():
        for prompt, out, name in zip(prompts, got, names, strict=True):
            for label, m in (("bf16 forward", pm), ("fp32 model", pm32)):
                m.set_adapter(name)
                ref = teacher_forced_logprobs(m, prompt, out.completion_ids, 1.0)
                worst[label] = max(
                    worst[label], *(abs(a - b) for a, b in zip(out.logprobs, ref, strict=True))
                )
    assert worst["bf16 forward"] < BF16_LOGPROB_TOL, worst
    assert worst["fp32 model"] < BF16_VS_FP32_TOL, worst


def test_bf16_layers_are_packed_only_where_onednn_has_a_bf16_linear(monkeypatch):
    if not hf_kernels.onednn_available():
        pytest.skip("this torch build has no oneDNN")
    monkeypatch.setattr(hf_kernels, "MIN_PACKED_NUMEL", 0)
    model = _tiny("llama").to(torch.bfloat16)
    packs = hf_kernels.PackedLinears(model)
    if hf_kernels.onednn_bf16_available():
        assert packs.skipped is None and len(packs.units()) == 2 * 4 + 1  # qkv, o, gate|up, down; the head
    else:  # e.g. an AVX2-only CPU: the layers step aside to F.linear, and requiring the packing is refused
        assert packs.skipped == hf_kernels.BF16_UNPACKED and packs.units() == []
        with pytest.raises(
            ValueError, match="packed_linears=True, but oneDNN has no bf16 linear on this CPU"
        ):
            HFBackend(model, _Tok(), share_model=True, packed_linears=True)
    fp32 = hf_kernels.PackedLinears(_tiny("llama"))
    assert fp32.skipped is None and len(fp32.units()) == 9

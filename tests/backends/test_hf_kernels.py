"""The HF backend's CPU decode kernels: oneDNN-packed linears and the preallocated KV cache."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from mas_train.backends.base import SamplingParams
from mas_train.backends.hf import HFBackend
from mas_train.backends.hf import kernels as hf_kernels
from mas_train.backends.hf.kernels import (
    PackedLinears,
    PreallocatedLayer,
    onednn_available,
    preallocated_cache,
)
from mas_train.backends.testing import BackendContract, chat_prompt

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture
def pack_everything(monkeypatch):
    # the tiny test model's layers are far below the packing threshold: pack every linear so the tests cover them
    monkeypatch.setattr(hf_kernels, "MIN_PACKED_NUMEL", 0)


@needs_onednn
class TestHFBackendPackedEverywhere(BackendContract):
    """The whole backend contract with every linear layer of the tiny model packed."""

    @pytest.fixture
    def make_backend(self, tiny_model_and_tokenizer, pack_everything):
        model, tok = tiny_model_and_tokenizer
        return lambda: HFBackend(model, tok, seed=0, packed_linears=True)


@needs_onednn
def test_packed_forward_matches_f_linear_and_is_removed_after():
    torch.manual_seed(0)
    lin = torch.nn.Linear(576, 1536)
    small = torch.nn.Linear(576, 16, bias=False)  # a LoRA-sized factor: below the threshold, not packed
    model = torch.nn.Sequential(lin, torch.nn.ReLU(), torch.nn.Linear(1536, 576), small)
    packed = PackedLinears(model)
    assert packed.units() == [(lin,), (model[2],)]  # the LoRA-sized factor is not packed
    x = torch.randn(8, 576)
    with torch.no_grad():
        want = model(x)
        with packed.active():
            assert "forward" in lin.__dict__ and "forward" not in small.__dict__
            got = model(x)
            one = lin(x)
    assert "forward" not in lin.__dict__  # the class's forward again: training never sees the packed op
    assert not torch.equal(got, torch.zeros_like(got))
    assert (got - want).abs().max().item() < 1e-4
    assert (one - F.linear(x, lin.weight, lin.bias)).abs().max().item() < 1e-4


@needs_onednn
def test_a_changed_frozen_weight_is_repacked():
    lin = torch.nn.Linear(512, 256, bias=False).requires_grad_(False)  # a LoRA base, a private copy
    packed = PackedLinears(lin)
    assert packed.refresh() == 1 and packed.refresh() == 0  # nothing changed: nothing repacked
    x = torch.randn(4, 512)
    with torch.no_grad():
        lin.weight.mul_(-2.0)  # an in-place write (a weight sync's copy_)
        with packed.active():
            got = lin(x)
        assert (got - x @ lin.weight.T).abs().max().item() < 1e-4
        assert packed.refresh() == 0
        lin.weight = torch.nn.Parameter(torch.ones(256, 512), requires_grad=False)  # a new tensor (a load)
        assert packed.refresh() == 1
        with packed.active():
            assert torch.allclose(lin(x), x.sum(-1, keepdim=True).expand(4, 256), atol=1e-4)


@needs_onednn
@pytest.mark.parametrize("fused", [False, True])
def test_a_trainable_weight_is_repacked_after_any_optimizer_step(fused):
    # torch's fused AdamW (TRL's default optimizer) writes parameters without bumping their version counter
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 256)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.5, fused=fused)
    packed = PackedLinears(lin)
    x = torch.randn(4, 512)
    with torch.no_grad(), packed.active():
        before = lin(x)
    lin(x).square().sum().backward()
    opt.step()
    with torch.no_grad():
        with packed.active():
            after = lin(x)
        want = F.linear(x, lin.weight, lin.bias)
    assert torch.allclose(after, want, rtol=1e-5, atol=1e-4)
    assert (after - before).abs().max().item() > 1.0  # the step did change the outputs (by ~100 here)


@needs_onednn
def test_a_hooked_forward_is_left_alone():
    lin = torch.nn.Linear(512, 256)
    hooked = lin.forward
    lin.forward = lambda x: hooked(x) * 0  # e.g. accelerate's hook: an instance forward
    assert PackedLinears(lin).units() == []


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(256, 512, bias=False)
        self.k_proj = torch.nn.Linear(256, 256, bias=False)
        self.v_proj = torch.nn.Linear(256, 256, bias=False)
        self.o_proj = torch.nn.Linear(512, 256, bias=False)


@needs_onednn
def test_sibling_projections_are_fused_and_each_gets_its_own_product():
    torch.manual_seed(0)
    attn = torch.nn.Sequential()
    attn.add_module("self_attn", _Attention())
    a = attn.self_attn
    packed = PackedLinears(attn)
    assert packed.units() == [(a.q_proj, a.k_proj, a.v_proj), (a.o_proj,)]
    x, y = torch.randn(3, 256), torch.randn(3, 256)
    with torch.no_grad(), packed.active():
        q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        q_first = q.clone()
        k_y = a.k_proj(y)  # another input: its own product, not x's slice
        q2 = a.q_proj(x)
        q2.mul_(0.0)  # an in-place edit of one slice (PEFT's mixed-batch `+=`)...
        v_again = a.v_proj(x)  # ...then a second call of a sibling on the same input: recomputed
    assert q.shape == (3, 512) and k.shape == v.shape == (3, 256)
    want = {
        "q": F.linear(x, a.q_proj.weight),
        "k": F.linear(x, a.k_proj.weight),
        "v": F.linear(x, a.v_proj.weight),
    }
    assert (q_first - want["q"]).abs().max().item() < 1e-4
    assert (k - want["k"]).abs().max().item() < 1e-4
    assert (v - want["v"]).abs().max().item() < 1e-4
    assert (k_y - F.linear(y, a.k_proj.weight)).abs().max().item() < 1e-4
    assert (v_again - want["v"]).abs().max().item() < 1e-4
    assert "forward" not in a.q_proj.__dict__


@needs_onednn
def test_peft_base_layers_are_fused_and_mixed_adapter_decode_matches(
    tiny_model_and_tokenizer, pack_everything
):
    peft = pytest.importorskip("peft")
    model, tok = tiny_model_and_tokenizer
    cfg = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lora = peft.get_peft_model(copy.deepcopy(model), cfg, adapter_name="solver")
        lora.add_adapter("verifier", cfg)
        with torch.no_grad():
            for name, p in lora.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0.0, 0.5)
    units = PackedLinears(lora).units()
    fused = [u for u in units if len(u) == 3]
    assert (
        len(fused) == model.config.num_hidden_layers
    )  # every layer's q/k/v base layers, under PEFT's wrappers
    prompts = [chat_prompt(tok, "What is 2 + 3?")] * 2 + [chat_prompt(tok, "Name a colour.")]
    adapters = ["solver", "verifier", "verifier"]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    plain = HFBackend(lora, tok, share_model=True, packed_linears=False).generate(
        prompts, greedy, adapters=adapters
    )
    fast = HFBackend(lora, tok, share_model=True, packed_linears=True).generate(
        prompts, greedy, adapters=adapters
    )
    assert plain[0].completion_ids != plain[1].completion_ids  # the adapters differ, so a leak would show
    for a, b in zip(plain, fast, strict=True):
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_packed_linears_refused_off_cpu_or_without_onednn(tiny_model_and_tokenizer, monkeypatch):
    model, tok = tiny_model_and_tokenizer
    monkeypatch.setattr("mas_train.backends.hf.backend.onednn_available", lambda: False)
    with pytest.raises(ValueError, match="packed_linears=True needs generation on CPU with a oneDNN"):
        HFBackend(model, tok, packed_linears=True)
    assert HFBackend(model, tok)._packed is None  # the default falls back to F.linear


def test_preallocated_layer_equals_a_growing_cat():
    torch.manual_seed(0)
    pre, ref = PreallocatedLayer(reserve=3), DynamicLayer()
    chunks = [
        torch.randn(2, 3, n, 4) for n in (5, 1, 1, 1, 1, 2, 1)
    ]  # prefill, then decode steps past reserve
    for c in chunks:
        k1, v1 = pre.update(c, -c)
        k2, v2 = ref.update(c, -c)
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
        assert pre.get_seq_length() == ref.get_seq_length()
    assert pre.get_seq_length() == 12
    idx = torch.tensor([1, 1, 0])  # repeated rows: a distinct prompt copied to the rows that share it
    pre.batch_select_indices(idx)
    ref.batch_select_indices(idx)
    step = torch.randn(3, 3, 1, 4)
    k1, _ = pre.update(step, step)
    k2, _ = ref.update(step, step)
    assert torch.equal(k1, k2) and k1.shape == (3, 3, 13, 4)


def test_preallocated_cache_only_for_full_attention_layers(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    cache = preallocated_cache(model.config, reserve=8)
    assert cache is not None and all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    assert len(cache.layers) == model.config.num_hidden_layers
    sliding = copy.deepcopy(model.config)
    sliding.layer_types = ["sliding_attention"] * sliding.num_hidden_layers
    sliding.sliding_window = 4
    assert preallocated_cache(sliding, reserve=8) is None


def test_decode_with_packed_linears_matches_plain_decode(tiny_model_and_tokenizer, pack_everything):
    if not onednn_available():
        pytest.skip("this torch build has no oneDNN")
    model, tok = tiny_model_and_tokenizer
    prompts = [chat_prompt(tok, "What is 2 + 3?"), chat_prompt(tok, "Name a colour.")]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    plain = HFBackend(model, tok, packed_linears=False).generate(prompts, greedy)
    fast = HFBackend(model, tok, packed_linears=True).generate(prompts, greedy)
    for a, b in zip(plain, fast, strict=True):
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


@needs_onednn
def test_backends_over_one_model_share_one_packed_copy():
    # shared_lora: the agents' backends sample with one base model; they must not pack it once each
    lin = torch.nn.Linear(512, 256).requires_grad_(False)  # the frozen base
    first, second = PackedLinears(lin), PackedLinears(lin)
    assert first.refresh() == 1
    assert second.refresh() == 0
    assert hf_kernels.PACKS[lin][2] is not None
    other = torch.nn.Linear(512, 256).requires_grad_(False)
    assert PackedLinears(other).refresh() == 1  # a different module gets its own


def test_fused_rms_norms_give_the_same_logits_bit_for_bit(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    norms = [m for m in model.modules() if type(m).__name__ == "Qwen3RMSNorm"]
    assert len(norms) == 1 + 4 * model.config.num_hidden_layers  # final + per layer: 2 norms, q_norm, k_norm
    ids = torch.tensor([chat_prompt(tok, "What is 2 + 3?")])
    with torch.no_grad():
        want = model(ids).logits
        with hf_kernels.fused_rms_norms(model):
            assert all("forward" in m.__dict__ for m in norms)
            got = model(ids).logits
    assert torch.equal(got, want)
    assert not any("forward" in m.__dict__ for m in norms)


def test_backend_options_turn_packing_off(tiny_model_and_tokenizer):
    from mas_train.backends import make_backend
    from mas_train.backends.options import HFOptions

    model, tok = tiny_model_and_tokenizer
    assert make_backend("hf", HFOptions(packed_linears=False), model, tok)._packed is None
    default = make_backend("hf", HFOptions(), model, tok)
    assert (default._packed is not None) == onednn_available()


@needs_onednn
@pytest.mark.parametrize("frozen_factors", [False, True])
def test_merging_and_unmerging_an_adapter_repacks_the_base_weights(
    tiny_model_and_tokenizer, pack_everything, frozen_factors
):
    # PEFT merges with `base_layer.weight.data += delta`, which bumps no version counter: before the fix the
    # packed copies kept the unmerged base, so a merged model sampled as if it had no adapter at all.
    peft = pytest.importorskip("peft")
    model, tok = tiny_model_and_tokenizer
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lora = peft.get_peft_model(copy.deepcopy(model), cfg, adapter_name="solver")
        with torch.no_grad():
            for name, p in lora.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0.0, 0.5)
    if frozen_factors:
        lora.requires_grad_(False)  # an inference-only adapter: its factors' version counters are the stamp
    prompts = [chat_prompt(tok, "What is 2 + 3?"), chat_prompt(tok, "Name a colour.")]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    plain = HFBackend(lora, tok, share_model=True, packed_linears=False)
    fast = HFBackend(lora, tok, share_model=True, packed_linears=True)
    with lora.disable_adapter():
        base_only = plain.generate(prompts, greedy)

    def check() -> list:
        want, got = plain.generate(prompts, greedy), fast.generate(prompts, greedy)
        for a, b in zip(want, got, strict=True):
            assert a.completion_ids == b.completion_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
        return want

    unmerged = check()  # packs the unmerged base weights
    assert [o.completion_ids for o in unmerged] != [o.completion_ids for o in base_only]  # the adapter shows
    lora.merge_adapter()
    check()
    lora.unmerge_adapter()
    with torch.no_grad():  # a training step on the factors, then the next round's merge
        for name, p in lora.named_parameters():
            if ".lora_B." in name:
                p.mul_(-1.0)
    lora.merge_adapter()
    merged_again = check()
    assert [o.completion_ids for o in merged_again] != [o.completion_ids for o in unmerged]
    lora.unmerge_adapter()
    check()


@needs_onednn
def test_close_frees_the_private_copy_and_its_packed_weights(tiny_model_and_tokenizer, pack_everything):
    import gc
    import weakref

    model, tok = tiny_model_and_tokenizer
    backend = HFBackend(model, tok, packed_linears=True)
    backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, temperature=0.0))
    copy_ref = weakref.ref(backend.model)
    lm_head = weakref.ref(backend.model.lm_head)
    assert lm_head() in hf_kernels.PACKS
    backend.close()
    gc.collect()
    assert copy_ref() is None  # before the fix PackedLinears.model kept the closed copy alive
    assert lm_head() is None  # and with it the packed weights in the registry


@needs_onednn
def test_weights_without_a_version_counter_are_repacked_every_call():
    # inference tensors (a module built under inference_mode) keep no version counter: an in-place write there
    # left the stamp unchanged, so the packed copy went stale
    with torch.inference_mode():
        torch.manual_seed(0)
        # big enough for oneDNN to reorder it into a copy (tiny weights may be aliased, not copied)
        lin = torch.nn.Linear(576, 1536).requires_grad_(False)
        assert lin.weight.is_inference()
        packed, x = PackedLinears(torch.nn.Sequential(lin)), torch.randn(4, 576)
        with packed.active():
            lin(x)
        lin.weight.mul_(-1.0)
        with packed.active():
            got = lin(x)
        want = F.linear(x, lin.weight, lin.bias)
    assert (got - want).abs().max().item() < 1e-4


@needs_onednn
def test_a_private_copy_built_under_inference_mode_sees_weight_updates(
    tiny_model_and_tokenizer, pack_everything
):
    model, tok = tiny_model_and_tokenizer
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(0)
        fast = HFBackend(model, tok, packed_linears=True)
        plain = HFBackend(model, tok, packed_linears=False)
        # version counters, so unchanged layers are not repacked
        assert not next(fast.model.parameters()).is_inference()
        before = fast.generate(prompts, greedy)
        update = {k: v + 0.1 * torch.randn_like(v) for k, v in model.state_dict().items() if "_proj." in k}
        fast.update_weights(update)
        plain.update_weights(update)
        want, got = plain.generate(prompts, greedy), fast.generate(prompts, greedy)
    assert [o.completion_ids for o in want] != [o.completion_ids for o in before]  # the update shows
    for a, b in zip(want, got, strict=True):
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


@needs_onednn
def test_merge_and_unload_repacks_the_unwrapped_base_layers(tiny_model_and_tokenizer, pack_everything):
    # merge_and_unload adds B A to the base weights through .data and drops the wrappers: the base layers are
    # the same objects with unchanged stamps, so before the fix they kept their unmerged packed copies
    peft = pytest.importorskip("peft")
    model, tok = tiny_model_and_tokenizer
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lora = peft.get_peft_model(copy.deepcopy(model), cfg)
    prompts = [chat_prompt(tok, "What is 2 + 3?")]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    with lora.disable_adapter():
        base_only = HFBackend(lora, tok, share_model=True, packed_linears=False).generate(prompts, greedy)
        packs_the_base = HFBackend(lora, tok, share_model=True, packed_linears=True)
        packs_the_base.generate(prompts, greedy)
    merged = lora.merge_and_unload()
    want = HFBackend(merged, tok, share_model=True, packed_linears=False).generate(prompts, greedy)[0]
    got = HFBackend(merged, tok, share_model=True, packed_linears=True).generate(prompts, greedy)[0]
    assert want.completion_ids != base_only[0].completion_ids  # the merged adapter shows
    assert got.completion_ids == want.completion_ids
    assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs, strict=True)) < 1e-4


@needs_onednn
def test_active_refuses_grad_mode_with_trainable_weights(pack_everything):
    lin = torch.nn.Linear(64, 32)  # trainable
    packed = PackedLinears(torch.nn.Sequential(lin))
    with pytest.raises(RuntimeError, match="without autograd"):
        with packed.active():
            pass
    assert "forward" not in lin.__dict__
    with torch.no_grad(), packed.active():  # the supported way
        assert "forward" in lin.__dict__
    lin.requires_grad_(False)
    with packed.active():  # frozen layers: no gradient to lose
        assert "forward" in lin.__dict__

"""One test per workaround of mas_train.grpo.trl_adapter: each checks the TRL behaviour the workaround relies on,
so a TRL upgrade that changes it fails here by name instead of silently changing training."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from mas_train.grpo.trl_adapter import (  # noqa: E402
    TRLGRPO,
    fused_forward,
    fused_logps,
    grpo_args,
    no_reward,
    restore_fused_forward,
)


def _inputs(tok, b=2, p=5, t=3, adv=(1.0, -1.0)):
    g = torch.Generator().manual_seed(0)
    return {
        "prompt_ids": torch.randint(0, 5000, (b, p), generator=g),
        "prompt_mask": torch.ones(b, p, dtype=torch.long),
        "completion_ids": torch.randint(0, 5000, (b, t), generator=g),
        "completion_mask": torch.ones(b, t, dtype=torch.long),
        "advantages": torch.tensor(adv),
        "num_items_in_batch": torch.tensor(float(b * t)),
    }


def _adapter(tiny_model_and_tokenizer, tmp_path, **kw):
    model, tok = tiny_model_and_tokenizer
    return TRLGRPO(copy.deepcopy(model), tok, grpo_args(str(tmp_path), max_steps=2, **kw))


def test_1_trl_builds_no_reference_model_at_beta_zero_and_ours_is_a_copy(tiny_model_and_tokenizer, tmp_path):
    # The workaround relies on TRL deciding about the reference model from args.beta inside __init__.
    assert "beta" in inspect.getsource(GRPOTrainer.__init__)
    plain = _adapter(tiny_model_and_tokenizer, tmp_path / "a")
    assert plain.beta == 0.0 and plain.ref_model is None
    kl = _adapter(tiny_model_and_tokenizer, tmp_path / "b", beta=0.1)
    assert kl.beta == 0.1 and kl.args.beta == 0.1  # restored after TRL's constructor
    assert kl.ref_model is not None and kl.ref_model is not kl.model
    assert not any(p.requires_grad for p in kl.ref_model.parameters())


def test_2_trl_still_takes_a_reward_source_and_a_dataset(tiny_model_and_tokenizer, tmp_path):
    params = inspect.signature(GRPOTrainer.__init__).parameters
    assert {"reward_funcs", "train_dataset"} <= set(params)
    tr = _adapter(tiny_model_and_tokenizer, tmp_path)
    assert tr.reward_funcs == [no_reward] and len(tr.train_dataset) == 1  # the dummies, never used


def test_3_grpo_config_still_validates_batch_shapes(tmp_path):
    # If this stops raising, grpo_args no longer needs to fake num_generations / per_device_train_batch_size.
    with pytest.raises(ValueError):
        GRPOConfig(output_dir=str(tmp_path), num_generations=3, per_device_train_batch_size=2, use_cpu=True)
    args = grpo_args(str(tmp_path), max_steps=3)
    assert (args.num_generations, args.per_device_train_batch_size, args.bf16, args.report_to) == (
        2,
        2,
        False,
        [],
    )


def test_4_trl_patches_the_policy_forward_and_we_can_put_a_group_s_patch_back(tmp_path, tiny_qwen3_path):
    peft = pytest.importorskip("peft")
    from mas_train.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_qwen3_path, dtype="float32", device="cpu")
    pm = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]), adapter_name="a")
    TRLGRPO(pm, tok, grpo_args(str(tmp_path), max_steps=2, temperature=0.7))
    mine = fused_forward(pm)
    assert mine is not None  # TRL installed its fused LM head as an instance forward
    pm.get_base_model().forward = lambda *a, **k: None  # another group's trainer patched it since
    restore_fused_forward(pm, mine)
    assert fused_forward(pm) is mine


def test_4_our_forward_reads_trl_s_fused_lm_head(tiny_model_and_tokenizer, tmp_path):
    # fused_logps calls the patched forward with fused_lm_head=True and reads log_probs / entropy from it
    tr = _adapter(tiny_model_and_tokenizer, tmp_path)
    inp = _inputs(tr.processing_class)
    out = fused_logps(tr.model, inp, compute_entropy=True, autocast=tr.accelerator.autocast)
    assert out.logps.shape == out.entropies.shape == (2, 3) and (out.logps <= 0).all()
    # the same numbers as a plain forward's log-softmax at the trainer's temperature (1.0 here)
    ids = torch.cat([inp["prompt_ids"], inp["completion_ids"]], 1)
    with torch.no_grad():
        logits = tiny_model_and_tokenizer[0](input_ids=ids).logits[:, -4:-1]
    want = torch.log_softmax(logits.float(), -1).gather(-1, inp["completion_ids"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out.logps.detach(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(tr.completion_logps(tr.model, inp), out.logps.detach())

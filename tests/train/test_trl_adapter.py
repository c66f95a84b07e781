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


def test_4_trl_loss_reads_logprobs_through_the_overridden_private_forward(tiny_model_and_tokenizer, tmp_path):
    tr = _adapter(tiny_model_and_tokenizer, tmp_path)
    assert "self._get_per_token_logps_and_entropies(" in inspect.getsource(GRPOTrainer._compute_loss)
    calls = []
    base = TRLGRPO.training_logps

    def spy(self, model, *a, **k):
        calls.append(model is self.model)
        return base(self, model, *a, **k)

    tr.training_logps = spy.__get__(tr)
    loss = tr.grpo_loss(tr.model, _inputs(tr.processing_class))
    assert torch.isfinite(loss) and calls == [True]
    lp = tr.trl_logps(tr.model, _inputs(tr.processing_class))
    assert lp.shape == (2, 3) and (lp <= 0).all()


def test_5_trl_divides_the_loss_by_the_accumulation_steps_we_set(tiny_model_and_tokenizer, tmp_path):
    tr = _adapter(tiny_model_and_tokenizer, tmp_path, loss_type="grpo")
    tr.model.train()  # TRL normalises by the accumulation steps in training mode (the update's mode)
    inp = _inputs(tr.processing_class, adv=(1.0, 0.5))
    tr.set_accumulation(1)
    one = tr.grpo_loss(tr.model, dict(inp)).item()
    tr.set_accumulation(4)
    four = tr.grpo_loss(tr.model, dict(inp)).item()
    assert one != 0.0 and four == pytest.approx(one / 4, rel=1e-5)


def test_6_trl_metrics_are_collected_and_cleared(tiny_model_and_tokenizer, tmp_path):
    tr = _adapter(tiny_model_and_tokenizer, tmp_path)
    tr.model.train()  # TRL files a training forward's metrics under "train" (the update trains the model)
    tr.set_accumulation(1)
    tr.grpo_loss(tr.model, _inputs(tr.processing_class))
    got = tr.pop_trl_metrics()
    assert any(k.startswith("clip_ratio") for k in got) and all(isinstance(v, float) for v in got.values())
    assert tr.pop_trl_metrics() == {}


def test_7_the_entropy_bonus_flag_still_exists(tiny_model_and_tokenizer, tmp_path):
    tr = _adapter(tiny_model_and_tokenizer, tmp_path)
    assert hasattr(tr, "_entropy_bonus_enabled") and tr.entropy_bonus_enabled is False


def test_8_trl_patches_the_policy_forward_and_we_can_put_a_group_s_patch_back(tmp_path, tiny_qwen3_path):
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

"""The sampler–trainer mismatch metrics per agent (exact, on hand-built logprobs) and where the truncated
importance-sampling correction is applied (mas_train.precision.tis_rule): where sampler and trainer differ, and
nowhere else."""

from __future__ import annotations

import copy
import math
import types

import pytest
import torch

from mas_train.grpo.importance import SamplerCheck, mismatch_sums
from mas_train.metrics import update_metrics
from mas_train.precision import Precision, tis_rule

FP32 = Precision("float32", False, "fp32")
BF16_BASE = Precision("bfloat16", False, "bf16 base")
AUTOCAST = Precision("float32", True, "autocast")


def test_mismatch_sums_are_exact_on_hand_built_logprobs():
    train = torch.tensor([[-1.0, -2.0, -3.0, -0.5], [-1.0, -1.0, -9.0, -9.0]])
    # deltas row 0: +0.05, -0.2, +0.3, (masked: 5.0); row 1: 0.0, -0.095, (masked), (masked)
    samp = torch.tensor([[-1.05, -1.8, -3.3, -5.5], [-1.0, -0.905, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    total, outside, worst, n = mismatch_sums(train, samp, mask)
    assert n == 5
    assert total == pytest.approx(0.05 + 0.2 + 0.3 + 0.0 + 0.095, abs=1e-6)
    # exp(0.05)=1.051 in, exp(-0.2)=0.819 out, exp(0.3)=1.35 out, exp(0)=1 in, exp(-0.095)=0.909 in
    assert outside == 2.0
    assert worst == pytest.approx(0.3, abs=1e-6)
    assert mismatch_sums(train, samp, torch.zeros_like(mask)) == (0.0, 0.0, 0.0, 0.0)


def _inputs(train, samp, mask, adv):
    return {
        "completion_mask": torch.tensor(mask),
        "sampling_per_token_logps": torch.tensor(samp),
        "advantages": torch.tensor(adv),
    }, torch.tensor(train)


def test_sampler_check_reports_per_agent_and_corrects_only_when_told():
    rows = ["solver", "verifier", "solver"]
    train = [[-1.0, -1.0], [-2.0, -2.0], [-1.0, -3.0]]
    samp = [[-1.2, -1.0], [-2.0, -2.5], [-1.0, -3.05]]  # Δ: (0.2, 0), (0, 0.5), (0, 0.05)
    mask = [[1, 1], [1, 1], [1, 0]]
    for correct in (False, True):
        check = SamplerCheck(correct, "token_truncate", 0.5, 1.5)
        inp, old = _inputs(train, samp, mask, [1.0, -1.0, 2.0])
        weight = check(inp, old, rows)
        # a second micro-batch of the solver: one token, Δ = -0.1
        inp2, old2 = _inputs([[-1.0]], [[-0.9]], [[1]], [0.5])
        check(inp2, old2, ["solver"])
        out = check.pop()
        assert out["mismatch/mean_abs_logp_diff/solver"] == pytest.approx((0.2 + 0 + 0 + 0.1) / 4, abs=1e-6)
        assert out["mismatch/ratio_outside_10pct/solver"] == pytest.approx(1 / 4)  # exp(0.2) only
        assert out["mismatch/max_abs_logp_diff/solver"] == pytest.approx(0.2, abs=1e-6)
        assert out["mismatch/mean_abs_logp_diff/verifier"] == pytest.approx(0.25, abs=1e-6)
        assert out["mismatch/ratio_outside_10pct/verifier"] == pytest.approx(1 / 2)
        assert out["mismatch/max_abs_logp_diff/verifier"] == pytest.approx(0.5, abs=1e-6)
        assert torch.equal(inp["advantages"], torch.tensor([1.0, -1.0, 2.0]))  # never written into
        if correct:  # token_truncate: w = clamp(exp(Δ), 0.5, 1.5) per token, the loss's per-token weight
            w = torch.tensor(
                [[math.exp(0.2), 1.0], [1.0, 1.5], [1.0, 1.0]]
            )  # exp(0.5)=1.65 capped; masked Δ=0
            torch.testing.assert_close(weight, w)
            assert "sampling/importance_sampling_ratio/mean" in out
        else:
            assert weight is None
            assert not any(k.startswith("sampling/") for k in out)
        assert check.pop() == {}  # cleared
    named = update_metrics("g", {"mismatch/max_abs_logp_diff/solver": 0.2})
    assert named == {"charts/sampling/mismatch/max_abs_logp_diff/solver": 0.2}


def _group(backend="hf", dtype=None, grpo=None):
    from mas_train.backends.options import HFOptions

    return types.SimpleNamespace(
        backend=backend,
        backend_options=HFOptions(dtype=dtype),  # what a resolved hf group holds (other kinds: not read)
        grpo_config_kwargs=lambda: dict(grpo or {}),
    )


def test_tis_is_applied_where_sampler_and_trainer_differ_and_nowhere_else():
    assert tis_rule(_group(), FP32) == (False, "fp32 HF sampler and fp32 trainer")
    assert tis_rule(_group(), BF16_BASE) == (True, "HF sampler in bfloat16, trainer in bfloat16")
    assert tis_rule(_group(), AUTOCAST) == (True, "HF sampler in float32, trainer in bf16 autocast")
    assert tis_rule(_group(dtype="bfloat16"), FP32) == (True, "HF sampler in bfloat16, trainer in float32")
    for engine in ("vllm", "sglang", "vllm_http", "sglang_http"):
        assert tis_rule(_group(engine), FP32) == (True, f"the {engine} backend samples with its own kernels")
    explicit = "as set (grpo.vllm_importance_sampling_correction)"
    assert tis_rule(_group(grpo={"vllm_importance_sampling_correction": True}), FP32) == (True, explicit)
    assert tis_rule(_group("vllm", grpo={"vllm_importance_sampling_correction": False}), FP32) == (
        False,
        explicit,
    )


pytest.importorskip("trl")
pytest.importorskip("peft")

from mas_train.config import TrainConfig  # noqa: E402
from mas_train.grpo.build import build_group_trainer  # noqa: E402
from mas_train.models import load_model_and_tokenizer  # noqa: E402
from mas_train.rollout import Sample  # noqa: E402


def _resolved(tmp_path, model, **extra):
    cfg = TrainConfig.from_dict(
        dict(env="parity", model=model, max_steps=4, output_dir=str(tmp_path), run_name="run", device="cpu",
             learning_rate=1e-2, sampling={"max_new_tokens": 4}, **extra)
    )  # fmt: skip
    return cfg.resolve(["solver", "verifier"])


@pytest.mark.parametrize(
    ("extra", "applied"),
    [
        ({}, False),  # the default on this CPU: fp32 HF sampler, fp32 trainer
        ({"backend_options": {"dtype": "bfloat16"}}, True),  # a bf16 sampling copy
        ({"grpo": {"vllm_importance_sampling_correction": True}}, True),  # asked for
    ],
)
def test_the_update_corrects_exactly_where_the_rule_says(
    tmp_path, tiny_qwen3_path, monkeypatch, extra, applied
):
    import mas_train.precision as precision

    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: (False, "CPU has no native bf16 (AVX2)"))
    resolved = _resolved(tmp_path, tiny_qwen3_path, **extra)
    model, tok = load_model_and_tokenizer(tiny_qwen3_path)
    tr = build_group_trainer(resolved, "shared", copy.deepcopy(model), tok, "cpu")
    assert tr.args.vllm_importance_sampling_correction is applied
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(f"t{i}", f"r{i}", "solver" if i < 2 else "verifier", "shared", 0,
               torch.randint(0, 5000, (6,), generator=g).tolist(), torch.randint(0, 5000, (3,), generator=g).tolist(),
               [-9.0] * 3, False, 1.0, True, 0, "stop", "x")
        for i in range(4)
    ]  # fmt: skip
    seen = []
    real = tr.sampler_check.__call__

    def spy(inputs, old, rows):
        before = inputs["advantages"].clone()
        weight = real(inputs, old, rows)
        assert torch.equal(
            inputs["advantages"], before
        )  # the weight goes to the loss, not into the advantages
        seen.append(weight is not None)
        return weight

    tr.sampler_check = _Callable(spy, tr.sampler_check)
    m = tr.update(samples, [1.0, -1.0, 0.5, -0.5])
    assert seen and all(s is applied for s in seen)  # a weight exactly when applied
    assert ("sampling/importance_sampling_ratio/mean" in m) is applied
    # sampling logprobs of -9 against the trainer's ~-12 (log 1/151k: random init): every token is off by > 0.1
    for agent in ("solver", "verifier"):
        assert m[f"mismatch/ratio_outside_10pct/{agent}"] == 1.0
        assert m[f"mismatch/max_abs_logp_diff/{agent}"] >= m[f"mismatch/mean_abs_logp_diff/{agent}"] > 0.1


class _Callable:
    """The real check's attributes (``pop``, ``correct``) with its call replaced by a spy."""

    def __init__(self, call, real):
        self._call, self.pop, self.correct = call, real.pop, real.correct

    def __call__(self, *a):
        return self._call(*a)

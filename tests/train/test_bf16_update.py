"""The GRPO update in the two bf16 modes ``dtype: auto`` picks on a CPU with native bf16 (mas_train.precision), on
the tiny Qwen3, against the fp32 update: a bf16 base under fp32 LoRA adapters, and fp32 master weights under bf16
autocast. On a CPU without native bf16 (this AVX2 box) they run emulated, slowly but the same; nothing here
measures speed."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")

from mas_train import lora as L  # noqa: E402
from mas_train.config import LoraConfig  # noqa: E402
from mas_train.grpo.update import GroupGRPOTrainer, grpo_args  # noqa: E402
from mas_train.rollout import Sample  # noqa: E402

ADV = [1.0, -1.0, 0.5, -0.5, 1.2, -0.7, 0.3]

#: bf16 against fp32, first update of the tiny Qwen3: the gradient's direction (cosine) and norm, the loss.
#: Measured (AMD EPYC, AVX2, emulated bf16): cosine 0.99995 (LoRA) and 0.99998 (autocast), norm within 0.4 %;
#: bf16 keeps 8 mantissa bits (4e-3 relative)
COSINE_MIN = 0.999
NORM_RTOL = 3e-2
#: shared-prefix against plain update, both in the same bf16 mode (the prefix's states round at another place);
#: measured cosine 0.99998, norm within 0.07 %
PREFIX_COSINE_MIN = 0.9999


def _samples(seed=0):
    """Solver and verifier samples whose prompts share a 20 / 24-token prefix per agent (as few-shot prompts do)."""
    g = torch.Generator().manual_seed(seed)
    heads = {
        a: torch.randint(0, 5000, (n,), generator=g).tolist() for a, n in (("solver", 20), ("verifier", 24))
    }
    out = []
    for i in range(7):
        agent = "solver" if i < 4 else "verifier"
        p = heads[agent] + torch.randint(0, 5000, (1 + i % 3 * 2,), generator=g).tolist()
        c = torch.randint(0, 5000, (2 + i % 4,), generator=g).tolist()
        out.append(
            Sample(
                f"t{i % 2}", f"r{i}", agent, "g", 0, p, c, [-12.0] * len(c), False, 1.0, True, 0, "stop", "x"
            )
        )
    return out


def _build(model, tok, tmp_path, mode: str, share: bool = False):
    """``mode``: ``fp32`` / ``fp32_lora``; ``bf16_lora`` (bf16 base, fp32 adapters, no autocast); ``autocast``
    (fp32 master weights, bf16 autocast: TRL's ``bf16=True``)."""
    policy = copy.deepcopy(model)
    if mode == "bf16_lora":
        policy = policy.to(torch.bfloat16)
    if mode.endswith("lora"):
        torch.manual_seed(0)  # the same adapter initialisation in every mode
        policy = L.wrap(policy, LoraConfig(r=4, alpha=8), "a")
        with torch.no_grad():  # B != 0, so the adapter's A factors get a gradient too
            for n, p in policy.named_parameters():
                if ".lora_B." in n:
                    p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    args = grpo_args(
        str(tmp_path / "trl"), max_steps=10, learning_rate=1e-2, loss_type="dapo", bf16=mode == "autocast"
    )
    return GroupGRPOTrainer(policy, tok, args, micro_batch_size=2, share_prefix=share)


def _first_grads(tr, samples):
    grads = []
    step = tr.optimizer.step

    def wrapped(*a, **k):
        grads.append(
            {n: p.grad.detach().float().clone() for n, p in tr.model.named_parameters() if p.grad is not None}
        )
        return step(*a, **k)

    tr.optimizer.step = wrapped
    metrics = tr.update(samples, ADV)
    return grads[0], metrics


def _flat(g):
    return torch.cat([g[k].flatten() for k in sorted(g)])


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize(("mode", "ref_mode"), [("bf16_lora", "fp32_lora"), ("autocast", "fp32")])
def test_bf16_update_matches_the_fp32_update(tiny_model_and_tokenizer, tmp_path, mode, ref_mode):
    model, tok = tiny_model_and_tokenizer
    samples = _samples()
    ref = _build(model, tok, tmp_path, ref_mode)
    inputs = ref.build_inputs(samples, ADV)
    true = ref.completion_logps(ref.model, inputs)  # on-policy (fp32) sampling logprobs
    samples = [
        Sample(**{**s.__dict__, "sampling_logprobs": true[i, : len(s.completion_ids)].tolist()})
        for i, s in enumerate(samples)
    ]
    tr = _build(model, tok, tmp_path, mode)
    if mode == "bf16_lora":
        assert {p.dtype for n, p in tr.model.named_parameters() if ".lora_" not in n} == {torch.bfloat16}
        assert {p.dtype for p in tr.model.parameters() if p.requires_grad} == {torch.float32}
    else:
        assert tr.accelerator.mixed_precision == "bf16" and {p.dtype for p in tr.model.parameters()} == {
            torch.float32
        }
    g_ref, m_ref = _first_grads(ref, samples)
    g, m = _first_grads(tr, samples)
    assert g.keys() == g_ref.keys() and g
    a, b = _flat(g), _flat(g_ref)
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    assert cos > COSINE_MIN, cos
    assert float(a.norm()) == pytest.approx(float(b.norm()), rel=NORM_RTOL)
    assert m["loss"] == pytest.approx(m_ref["loss"], rel=NORM_RTOL, abs=1e-3)
    # the trainer's own logprobs differ from the fp32 sampler's by bf16 rounding, not by more
    for agent in ("solver", "verifier"):
        assert 0.0 < m[f"mismatch/mean_abs_logp_diff/{agent}"] < 2e-2
    state = [t for s in tr.optimizer.state.values() for k, t in s.items() if k != "step"]
    assert state and {t.dtype for t in state} == {torch.float32}  # AdamW's moments stay fp32


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("mode", ["bf16_lora", "autocast"])
def test_shared_prefix_update_in_bf16_has_the_plain_bf16_gradient(tiny_model_and_tokenizer, tmp_path, mode):
    model, tok = tiny_model_and_tokenizer
    samples = _samples()
    shared, plain = _build(model, tok, tmp_path, mode, share=True), _build(model, tok, tmp_path, mode)
    g_shared, _ = _first_grads(shared, samples)
    g_plain, _ = _first_grads(plain, samples)
    assert shared.share_prefix  # the shared path ran (it turns itself off where it cannot)
    a, b = _flat(g_shared), _flat(g_plain)
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    assert cos > PREFIX_COSINE_MIN, cos
    assert float(a.norm()) == pytest.approx(float(b.norm()), rel=NORM_RTOL)

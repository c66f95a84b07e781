"""The GRPO loss of mas_train.grpo.loss: hand-computed values per loss_type on tiny tensors, the importance-sampling
weight's caps by hand, parity with TRL's own compute_loss on the same batch, and an update that never reaches a
private TRL hook."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mas_train.grpo import loss as L
from mas_train.grpo.importance import importance_ratio

# B=2 rows, T=3 tokens; row 0's last token is padding.
RATIO = torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 2.0]])
ADV = torch.tensor([[1.0], [-2.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
EPS_LOW, EPS_HIGH = 0.2, 0.28  # clip(r) to [0.8, 1.28]


def test_clipped_surrogate_by_hand():
    # row 0 (A=+1): clip(r) = [1.0, 1.28, 0.8]; min(r·A, clip·A) = [1.0, 1.28, 0.5]
    # row 1 (A=-2): r·A = [-2.2, -1.4, -4.0], clip·A = [-2.2, -1.6, -2.56]; min = [-2.2, -1.6, -4.0]
    got = L.clipped_surrogate(RATIO, ADV, EPS_LOW, EPS_HIGH)
    torch.testing.assert_close(got, torch.tensor([[-1.0, -1.28, -0.5], [2.2, 1.6, 4.0]]))
    # delta = 1.2 caps the unclipped ratio: row 0 [1.0, 1.2, 0.5] -> min [1.0, 1.2, 0.5];
    # row 1 r' = [1.1, 0.7, 1.2], r'·A = [-2.2, -1.4, -2.4] -> min with clip·A [-2.2, -1.6, -2.56]
    got = L.clipped_surrogate(RATIO, ADV, EPS_LOW, EPS_HIGH, delta=1.2)
    torch.testing.assert_close(got, torch.tensor([[-1.0, -1.2, -0.5], [2.2, 1.6, 2.56]]))


# the per-token loss above; masked sums: row 0 -1.0 - 1.28 = -2.28 over 2 tokens, row 1 2.2 + 1.6 + 4.0 = 7.8
# over 3: 5 tokens, total 5.52
@pytest.mark.parametrize(
    ("loss_type", "kw", "want"),
    [
        ("grpo", {}, (-2.28 / 2 + 7.8 / 3) / 2),  # mean of the per-sequence means: (-1.14 + 2.6) / 2 = 0.73
        ("grpo", {"accumulation_steps": 2}, 0.73 / 2),
        ("bnpo", {}, 5.52 / 5),  # the micro-batch's token mean: 1.104
        ("bnpo", {"accumulation_steps": 4}, 5.52 / 5 / 4),
        ("dr_grpo", {"max_completion_length": 4}, 5.52 / (2 * 4)),  # sum / (B · L_max) = 0.69
        ("dr_grpo", {"max_completion_length": 4, "accumulation_steps": 2}, 0.69 / 2),
        ("dapo", {"num_items": 10.0}, 5.52 / 10),  # sum / the step's tokens, whatever the accumulation
        ("dapo", {"num_items": 10.0, "accumulation_steps": 3}, 5.52 / 10),
        ("luspo", {}, (-2.28 + 7.8) / 2),  # mean of the per-sequence sums: 2.76
    ],
)
def test_aggregate_by_hand(loss_type, kw, want):
    per_token = L.clipped_surrogate(RATIO, ADV, EPS_LOW, EPS_HIGH)
    got = L.aggregate(per_token, MASK, loss_type, **kw)
    assert got.shape == () and got.item() == pytest.approx(want, rel=1e-6)


def test_aggregate_refuses_what_it_cannot_normalise():
    per_token = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="max_completion_length"):
        L.aggregate(per_token, MASK, "dr_grpo")
    with pytest.raises(ValueError, match="num_items"):
        L.aggregate(per_token, MASK, "dapo")
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        L.aggregate(per_token, MASK, "ppo")


def test_clip_fractions_by_hand():
    # low: r < 0.8 with A < 0: row 1 token 1 (0.7); high: r > 1.28 with A > 0: row 0 token 1 (1.5).
    # row 0 token 2 (0.5, A > 0) is not clipped-low; row 1 token 2 (2.0, A < 0) not clipped-high.
    got = L.clip_fractions(RATIO, ADV, MASK, EPS_LOW, EPS_HIGH)
    assert got == pytest.approx(
        {
            "clip_ratio/low_mean": 1 / 5,
            "clip_ratio/high_mean": 1 / 5,
            "clip_ratio/region_mean": 2 / 5,
            "clip_ratio/low_min": 0.0,  # rows: 0/2, 1/3
            "clip_ratio/high_max": 0.5,  # rows: 1/2, 0/3
        }
    )


def test_policy_ratio_token_and_sequence():
    logps = torch.tensor([[-1.0, -2.0, -9.0]])
    old = torch.tensor([[-1.5, -1.5, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    # log-ratios [0.5, -0.5, -9]: per token exp of each; per sequence exp of the masked mean (0.5 - 0.5) / 2 = 0
    torch.testing.assert_close(
        L.policy_ratio(logps, old, mask), torch.tensor([[math.exp(0.5), math.exp(-0.5), math.exp(-9.0)]])
    )
    torch.testing.assert_close(L.policy_ratio(logps, old, mask, "sequence"), torch.tensor([[1.0]]))
    with pytest.raises(ValueError, match="importance_sampling_level"):
        L.policy_ratio(logps, old, mask, "seq")


def test_k3_kl_by_hand():
    logps = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-2.0, -1.0, -3.0]])
    # d = ref - logps = [-1, 1, 0]: exp(d) - d - 1 = [e^-1, e - 2, 0]
    torch.testing.assert_close(L.k3_kl(logps, ref), torch.tensor([[math.exp(-1), math.e - 2, 0.0]]))


def test_cispo_sapo_vespo_by_hand():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ratio = torch.tensor([[0.5, 3.0]])
    adv = torch.tensor([[2.0]])
    # cispo: -min(r, 2)·A·logp = -[0.5, 2]·2·[-1, -2] = [1, 8]; the capped ratio carries no gradient
    got = L.cispo_surrogate(ratio, adv, logps, 2.0)
    torch.testing.assert_close(got.detach(), torch.tensor([[1.0, 8.0]]))
    got.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.0, -4.0]]))
    # sapo, A > 0 so tau = 2: -(4/2)·sigmoid(2(r - 1))·A; r = 1: -2·0.5·2 = -2; r = 2: -2·sigmoid(2)·2
    got = L.sapo_surrogate(torch.tensor([[1.0, 2.0]]), adv, 2.0, 5.0)
    torch.testing.assert_close(got, torch.tensor([[-2.0, -4.0 / (1 + math.exp(-2))]]))
    # A < 0 takes the negative temperature: -(4/5)·sigmoid(5·0)·(-1) = 0.4
    assert L.sapo_surrogate(torch.tensor([[1.0]]), torch.tensor([[-1.0]]), 2.0, 5.0).item() == pytest.approx(
        0.4
    )
    # vespo: -phi·A·logp = -0.5·2·[-1, -2] = [1, 2]
    got = L.vespo_surrogate(torch.tensor([[0.5]]), adv, logps.detach())
    torch.testing.assert_close(got, torch.tensor([[1.0, 2.0]]))


def test_importance_weight_caps_by_hand_and_weights_the_loss():
    old = torch.tensor([[-1.0, -2.0, -0.5, -4.0]])
    samp = torch.tensor([[-1.5, -1.0, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # masked diffs old - samp = [0.5, -1.0, 0.0, (masked: 0)]; exp = [1.6487, 0.3679, 1, 1]
    w, _ = importance_ratio(old, samp, mask, mode="token_truncate", clip_min=0.5, clip_max=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5, 1.0, 1.0]]))  # capped into [0.5, 1.5]
    w, _ = importance_ratio(old, samp, mask, mode="token_mask", clip_min=0.5, clip_max=1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 1.0, 1.0]]))  # outside [0.5, 1.5]: 0
    # sequence: exp(0.5 - 1.0 + 0) = exp(-0.5) = 0.6065, inside [0.5, 1.5]
    w, _ = importance_ratio(old, samp, mask, mode="sequence_truncate", clip_min=0.5, clip_max=1.5)
    torch.testing.assert_close(w, torch.tensor([[math.exp(-0.5)]]))
    w, _ = importance_ratio(old, samp, mask, mode="sequence_mask", clip_min=None, clip_max=0.6)
    torch.testing.assert_close(w, torch.tensor([[0.0]]))  # 0.6065 > 0.6: masked
    w, _ = importance_ratio(old, samp, mask, mode="sequence_truncate", clip_min=None, clip_max=0.6)
    torch.testing.assert_close(w, torch.tensor([[0.6]]))  # capped at 0.6
    # each token's surrogate takes the weighted advantage A·w = 1 · [1.5, 0.5, 1]: r = [1, 1.5, 0.5], clip(r) =
    # [1, 1.28, 0.8]; min(r·Aw, clip·Aw) = [1.5, min(0.75, 0.64), min(0.5, 0.8)]: the surrogate [-1, -1.28, -0.5]
    # of the unweighted advantage times w
    w, _ = importance_ratio(
        old[:, :3], samp[:, :3], mask[:, :3], mode="token_truncate", clip_min=0.5, clip_max=1.5
    )
    per_token = L.clipped_surrogate(RATIO[:1], L.weighted(ADV[:1], w), EPS_LOW, EPS_HIGH)
    torch.testing.assert_close(per_token, torch.tensor([[-1.5, -0.64, -0.5]]))
    torch.testing.assert_close(per_token, L.clipped_surrogate(RATIO[:1], ADV[:1], EPS_LOW, EPS_HIGH) * w)
    assert L.weighted(ADV, None) is ADV


# ---------------------------------------------------------------------------------------------------------------
# parity with TRL's own compute_loss, and no private TRL hook in the update
# ---------------------------------------------------------------------------------------------------------------
trl = pytest.importorskip("trl")

from trl import GRPOTrainer  # noqa: E402

from mas_train.grpo.trl_adapter import TRLGRPO, grpo_args  # noqa: E402


def _batch(b=3, p=5, t=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    cmask = torch.ones(b, t, dtype=torch.long)
    cmask[0, 2:] = 0  # a shorter completion
    pmask = torch.ones(b, p, dtype=torch.long)
    pmask[1, :2] = 0  # a left-padded prompt
    return {
        "prompt_ids": torch.randint(0, 5000, (b, p), generator=g),
        "prompt_mask": pmask,
        "completion_ids": torch.randint(0, 5000, (b, t), generator=g),
        "completion_mask": cmask,
        "advantages": torch.tensor([1.0, -0.7, 0.4])[:b],
        "num_items_in_batch": cmask.sum().float(),
        # old policy logprobs ~0.3 nats around the current ones: ratios far enough from 1 to clip
        "_noise": 0.3 * torch.randn(b, t, generator=g),
        "_ref_noise": 0.2 * torch.randn(b, t, generator=g),
    }


@pytest.mark.parametrize(
    "kw",
    [
        {"loss_type": "grpo"},
        {"loss_type": "bnpo"},
        {"loss_type": "dr_grpo", "max_completion_length": 6},
        {"loss_type": "dapo", "epsilon_high": 0.28},
        {"loss_type": "grpo", "beta": 0.1},
        {"loss_type": "dapo", "beta": 0.05, "use_bias_correction_kl": True, "delta": 1.2},
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
        {"loss_type": "luspo"},
        {"loss_type": "cispo", "epsilon_high": 1.1},
        {"loss_type": "sapo"},
        {"loss_type": "vespo"},
        {"loss_type": "grpo", "entropy_coef": 0.01, "top_entropy_quantile": 0.5},
        {"loss_type": "dapo", "off_policy_mask_threshold": 0.01},
    ],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()),
)
def test_loss_equals_trl_compute_loss_on_the_same_batch(tiny_model_and_tokenizer, tmp_path, kw):
    model, tok = tiny_model_and_tokenizer
    kw = {"max_completion_length": 4, **kw}
    tr = TRLGRPO(copy.deepcopy(model), tok, grpo_args(str(tmp_path), max_steps=2, **kw))
    tr.model.train()  # TRL divides by the accumulation steps in training mode (the update's mode)
    batch = _batch()
    noise, ref_noise = batch.pop("_noise"), batch.pop("_ref_noise")
    current = tr.completion_logps(tr.model, batch)
    inputs = dict(batch, old_per_token_logps=current + noise, sampling_per_token_logps=current + noise)
    if tr.beta:
        inputs["ref_per_token_logps"] = current + ref_noise
    # two accumulated micro-batches (the token-normalised losses use num_items_in_batch instead)
    tr.set_accumulation(2)
    tr.current_gradient_accumulation_steps = 2  # TRL's normaliser
    params = [p for p in tr.model.parameters() if p.requires_grad]

    def loss_and_grads(fn, **over):
        with tr.compute_loss_context_manager():
            loss = fn(tr.model, {**inputs, **over})
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return loss.detach(), grads

    ours, g_ours = loss_and_grads(tr.compute_loss)
    our_metrics = tr.pop_loss_metrics()
    if "entropy_coef" in kw:  # TRL's static coefficient was not moved by our call (static: nothing moves)
        assert tr.entropy_coef == kw["entropy_coef"]
    # TRL's token normaliser is num_items_in_batch · accumulation steps / steps_per_generation (1); ours is the
    # step's tokens: give TRL the same step
    theirs, g_theirs = loss_and_grads(
        lambda m, i: GRPOTrainer.compute_loss(tr, m, i), num_items_in_batch=inputs["num_items_in_batch"] / 2
    )
    assert ours.item() != 0.0
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    for a, b in zip(g_ours, g_theirs, strict=True):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # the same metrics under the same names (TRL's store is read here only to compare)
    trl_metrics = {k: v[-1] for k, v in tr._metrics["train"].items() if v}
    assert set(our_metrics) == set(trl_metrics) - {"step_time"}
    for k, v in our_metrics.items():
        assert v == pytest.approx(trl_metrics[k], rel=1e-5, abs=1e-7), k
    if kw["loss_type"] in L.CLIPPED_LOSS_TYPES and "importance_sampling_level" not in kw:
        assert our_metrics["clip_ratio/region_mean"] > 0  # the batch really clips
    assert tr.pop_loss_metrics() == {}  # cleared


def test_compute_loss_refuses_return_outputs(tiny_model_and_tokenizer, tmp_path):
    model, tok = tiny_model_and_tokenizer
    tr = TRLGRPO(copy.deepcopy(model), tok, grpo_args(str(tmp_path), max_steps=2))
    with pytest.raises(ValueError, match="return_outputs=False"):
        tr.compute_loss(tr.model, {}, return_outputs=True)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize(
    "kw",
    [
        {"loss_type": "dapo", "vllm_importance_sampling_correction": True},  # IS from the training forward
        {"loss_type": "grpo", "beta": 0.1, "num_iterations": 2, "vllm_importance_sampling_correction": True},
    ],
)
def test_the_update_reaches_no_private_trl_hook(tiny_model_and_tokenizer, tmp_path, monkeypatch, kw):
    from mas_train.grpo.update import GroupGRPOTrainer
    from mas_train.rollout import Sample

    model, tok = tiny_model_and_tokenizer
    tr = GroupGRPOTrainer(
        copy.deepcopy(model), tok, grpo_args(str(tmp_path), max_steps=4, **kw), micro_batch_size=2
    )

    def private(*a, **k):
        raise AssertionError("the update reached a private TRL hook")

    # TRL's loss, its forward, and its batch preparation and generation (the hook the old path wrote into)
    for name in (
        "_compute_loss",
        "_get_per_token_logps_and_entropies",
        "_prepare_inputs",
        "_generate_and_score_completions",
    ):
        monkeypatch.setattr(GRPOTrainer, name, private)
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(3):
        p = torch.randint(0, 5000, (5 + i,), generator=g).tolist()
        c = torch.randint(0, 5000, (2 + i,), generator=g).tolist()
        samples.append(
            Sample("t", f"r{i}", "solver", "g", 0, p, c, [-12.0] * len(c), False, 1.0, True, 0, "stop", "x")
        )
    inputs = tr.build_inputs(samples, [1.0, -1.0, 0.5])
    true = tr.completion_logps(tr.model, inputs)  # on-policy sampling logprobs: the IS weight is ~1
    samples = [
        Sample(**{**s.__dict__, "sampling_logprobs": true[i, : len(s.completion_ids)].tolist()})
        for i, s in enumerate(samples)
    ]
    before = [p.detach().clone() for p in tr.model.parameters()]
    m = tr.update(samples, [1.0, -1.0, 0.5])
    assert m["grad_norm"] > 0 and m["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    assert "clip_ratio/region_mean" in m and "entropy" in m and ("kl" in m) == ("beta" in kw)
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))

"""Lemma 4.2: the live factor on a hand-computed batch, and the numerical check of the lemma itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mas_train.advantages import compute_advantages
from mas_train.lemma_stats import lemma_factors, lemma_metrics, lld_metrics, noise_share, success_logp
from mas_train.tools.lemma import Kind, LemmaSetup, measure, predict, sweep_setup

# Three task groups; no penalties, so a turn's score is its trajectory's R.
# task A: R = [1, 0, 1, 0]; solver once in each, verifier in trajectories 1 and 3 (scores [1, 1]).
# task B: R = [1, 0, 0, 0]; solver once in each, verifier twice in trajectory 1 and once in trajectory 2
#         (scores [1, 1, 0]).
# task C: R = [0, 0]; solver once in each, verifier once in trajectory 1: sigma = 0, undefined.
ROWS = [
    ("A", "t1", "solver", 1.0),
    ("A", "t1", "verifier", 1.0),
    ("A", "t2", "solver", 0.0),
    ("A", "t3", "solver", 1.0),
    ("A", "t3", "verifier", 1.0),
    ("A", "t4", "solver", 0.0),
    ("B", "t1", "solver", 1.0),
    ("B", "t1", "verifier", 1.0),
    ("B", "t1", "verifier", 1.0),
    ("B", "t2", "solver", 0.0),
    ("B", "t2", "verifier", 0.0),
    ("B", "t3", "solver", 0.0),
    ("B", "t4", "solver", 0.0),
    ("C", "t1", "solver", 0.0),
    ("C", "t1", "verifier", 0.0),
    ("C", "t2", "solver", 0.0),
]
GROUPS, TRAJS, AGENTS, SCORES = (list(c) for c in zip(*ROWS, strict=True))


def test_lemma_factor_hand_computed_batch():
    st = lemma_factors(SCORES, GROUPS, TRAJS, AGENTS)
    assert list(st) == ["solver", "verifier"]
    sv, ve = st["solver"], st["verifier"]
    # A: mu = 0.5, sigma = 0.5. B: mu = 1/4, sigma^2 = 3/16. C: sigma = 0 -> left out.
    # solver acts once per trajectory: mu_k = mu, sigma_k = sigma -> factor 1 in A and B.
    assert sv.groups == 3 and sv.defined_frac == pytest.approx(2 / 3)
    assert sv.factor == pytest.approx(1.0, abs=1e-12)
    assert sv.mu_k == pytest.approx((0.5 + 0.25) / 2)
    assert sv.sigma_k == pytest.approx((0.5 + math.sqrt(3) / 4) / 2)
    assert sv.mu == pytest.approx(0.375) and sv.sigma == pytest.approx(sv.sigma_k)
    # verifier A: mu_k = 1, sigma_k = 0 -> (0 + 0.5^2) / 0.25 = 1.
    # verifier B: [1, 1, 0]: mu_k = 2/3, sigma_k^2 = 2/9 -> (2/9 + (2/3 - 1/4)^2) / (3/16) = 19/9.
    assert ve.groups == 3 and ve.defined_frac == pytest.approx(2 / 3)
    assert ve.factor == pytest.approx((1 + 19 / 9) / 2, abs=1e-12)
    assert ve.mu_k == pytest.approx((1 + 2 / 3) / 2)
    assert ve.sigma_k == pytest.approx(math.sqrt(2) / 3 / 2)
    assert ve.mu == pytest.approx(0.375)
    assert ve.sigma == pytest.approx((0.5 + math.sqrt(3) / 4) / 2)


def test_lemma_metrics_names_and_undefined_agent():
    # an agent that only acts in the sigma = 0 group has no factor: NaN, defined_frac 0
    m = lemma_metrics(SCORES + [0.0], GROUPS + ["C"], TRAJS + ["t2"], AGENTS + ["judge"])
    assert set(m) == {
        f"lemma/{k}/{a}"
        for k in ("factor", "noise_share", "mu_k", "sigma_k", "mu", "sigma", "defined_frac")
        for a in ("solver", "verifier", "judge")
    }
    assert m["lemma/factor/verifier"] == pytest.approx(14 / 9)
    assert math.isnan(m["lemma/factor/judge"]) and m["lemma/defined_frac/judge"] == 0.0
    assert m["lemma/noise_share/verifier"] == pytest.approx(41 / 57)
    assert math.isnan(m["lemma/noise_share/judge"])


def test_noise_share_hand_computed_batch():
    st = lemma_factors(SCORES, GROUPS, TRAJS, AGENTS)
    # solver: mu_k = mu in A and B (it acts once per trajectory): no offset -> 0
    assert st["solver"].noise_share == 0.0
    # verifier A: offset (1 - 0.5)^2 = 0.25, sigma_k = 0 -> 0.25 / 0.25 = 1
    # verifier B: offset (2/3 - 1/4)^2 = 25/144, sigma_k^2 = 2/9 = 32/144 -> 25/57 = 0.438596
    # C is undefined (sigma = 0) and left out, as for the factor: (1 + 25/57) / 2 = 41/57 = 0.719298
    assert st["verifier"].noise_share == pytest.approx(0.719298, abs=1e-6)
    assert st["verifier"].noise_share == pytest.approx(41 / 57, rel=1e-12)


def test_noise_share_formula_and_zero_denominator():
    # (mu_k - mu)^2 / (sigma_k^2 + (mu_k - mu)^2): offset 0.09, spread 0.16 -> 0.09 / 0.25 = 0.36;
    # a pure offset -> 1; no offset and no spread (denominator 0) -> 0, not NaN
    out = noise_share(np.array([0.8, 1.0, 0.5]), np.array([0.4, 0.0, 0.0]), np.array([0.5, 0.25, 0.5]))
    np.testing.assert_allclose(out, [0.36, 1.0, 0.0], rtol=1e-12)
    # in a batch: r = [1, 0, 0.5], agent k acts only in the trajectory with r = mu = 0.5 -> share 0, factor 0
    st = lemma_factors([1.0, 0.0, 0.5], [0, 0, 0], [0, 1, 2], ["a", "a", "k"])
    assert st["k"].noise_share == 0.0 and st["k"].factor == 0.0
    # and a = [1, 0]: mu_k = 0.5, sigma_k = 0.5 -> offset 0 -> 0
    assert st["a"].noise_share == 0.0


def test_success_logp_hand_computed():
    agents = ["a", "a", "a", "b", "c", "c"]
    success = [True, True, False, False, True, True]
    logprobs = [[-0.5, -1.5], [-1.0], [-9.0], [-0.1], [], [-2.0, -4.0]]
    # a: its successful turns' tokens [-0.5, -1.5, -1.0] -> -3.0 / 3 = -1.0 (the failed turn's -9 left out);
    # b: no successful turn -> NaN; c: the empty completion adds no token -> (-2 - 4) / 2 = -3.0
    out = success_logp(agents, success, logprobs)
    assert list(out) == ["a", "b", "c"]
    assert out["a"] == pytest.approx(-1.0, rel=1e-12) and out["c"] == pytest.approx(-3.0, rel=1e-12)
    assert math.isnan(out["b"])
    # token-weighted, not turn-weighted: turns [-1, -1, -1] and [-4] -> -7 / 4 = -1.75 (the mean of the
    # per-turn means would be -2.5)
    assert success_logp(["x", "x"], [True, True], [[-1.0, -1.0, -1.0], [-4.0]])["x"] == pytest.approx(-1.75)
    m = lld_metrics(agents, success, logprobs)
    assert set(m) == {"lld/success_logp/a", "lld/success_logp/b", "lld/success_logp/c"}
    assert m["lld/success_logp/a"] == pytest.approx(-1.0)


def test_success_logp_rejects_bad_input():
    with pytest.raises(ValueError, match="one entry per turn"):
        success_logp(["a"], [True, False], [[-1.0]])
    with pytest.raises(ValueError, match="NaN/inf log-probability"):
        success_logp(["a"], [True], [[-1.0, float("nan")]])
    assert success_logp([], [], []) == {}


def test_lemma_factor_uses_the_reward_grpo_gives_each_turn():
    # penalised turns: t1 = solver 1.0, verifier 0.9 -> r1 = 0.95; t2 = solver 0, solver 0, verifier 0 -> r2 = 0;
    # t3 = solver 1, verifier 1 -> r3 = 1. mu = 0.65, sigma^2 = (0.3^2 + 0.65^2 + 0.35^2) / 3 = 0.211667.
    scores = [1.0, 0.9, 0.0, 0.0, 0.0, 1.0, 1.0]
    trajs = [1, 1, 2, 2, 2, 3, 3]
    agents = ["s", "v", "s", "s", "v", "s", "v"]
    st = lemma_factors(scores, [0] * 7, trajs, agents)
    var = (0.3**2 + 0.65**2 + 0.35**2) / 3
    # the solver's turns get r = [0.95, 0, 0, 1] under GRPO (it acted twice in the failed trajectory)
    assert st["s"].factor == pytest.approx((0.3**2 + 2 * 0.65**2 + 0.35**2) / 4 / var)
    assert st["s"].mu_k == pytest.approx(1.95 / 4)
    # the verifier acts once per trajectory: its turns' rewards are the trajectories' -> exactly 1, although its
    # own penalised score 0.9 differs from r1 (over the turn scores the factor would be 0.957)
    assert st["v"].factor == pytest.approx(1.0)
    # and the factor is what GRPO's advantages give: the mean of A^2 over each agent's turns
    adv = compute_advantages(scores, [0] * 7, trajs, agents, mode="grpo", eps=0.0)
    for a in ("s", "v"):
        mask = np.array(agents) == a
        assert st[a].factor == pytest.approx(float(np.mean(adv[mask] ** 2)))


def test_lemma_factor_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN/inf"):
        lemma_factors([1.0, float("nan")], [0, 0], [0, 1], ["a", "a"])
    with pytest.raises(ValueError, match="group_ids has 1 entries"):
        lemma_factors([1.0, 0.0], [0], [0, 1], ["a", "a"])
    assert lemma_factors([], [], [], []) == {}


def test_sweep_setup_population_values_are_the_construction():
    q, sb, m = 0.2, 0.5, 2.0
    p = predict(sweep_setup(m, rare_prob=q, rare_std=sb))
    ch = p["checker"]
    assert ch.mu == pytest.approx(q * m) and ch.sigma == pytest.approx(1.0)
    assert ch.mu_k == pytest.approx(m) and ch.sigma_k == pytest.approx(sb)
    assert ch.deviation == pytest.approx((1 - q) * m)
    assert ch.factor == pytest.approx(sb**2 + ((1 - q) * m) ** 2)
    assert p["solver"].factor == pytest.approx(1.0)
    # E||z||^2 = 1 - ||pi||^2 for logits (1, 0)
    pi = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()
    assert ch.z2 == pytest.approx(1 - pi @ pi)
    with pytest.raises(ValueError, match="too large"):
        sweep_setup(3.0)


def test_score_function_is_the_autograd_gradient_of_log_softmax():
    # the experiment uses ||z||^2 = ||e_a - pi||^2 = 1 - 2 pi_a + ||pi||^2 in closed form; check it with torch
    theta = torch.tensor([0.5, -0.5, 0.0, 1.5], dtype=torch.float64, requires_grad=True)
    pi = torch.softmax(theta, 0).detach().numpy()
    for a in range(4):
        (g,) = torch.autograd.grad(torch.log_softmax(theta, 0)[a], theta)
        assert float(g @ g) == pytest.approx(1 - 2 * pi[a] + pi @ pi, rel=1e-12)


@pytest.mark.parametrize("shift", [0.0, 1.25, 2.2])
def test_lemma_42_second_moment_matches_prediction(shift):
    """Monte Carlo E||g_k||^2 is within 10 % of E||z||^2 * factor (global) and of E||z||^2 (Dr. MAS, eq. 6)."""
    setup = sweep_setup(shift)
    pred = predict(setup)
    meas = measure(setup, 60_000, seed=7)
    for agent in setup.agents:
        p, m = pred[agent], meas[agent]
        assert m.g2["grpo"] == pytest.approx(p.z2 * p.factor, rel=0.10), agent
        assert m.g2["drmas"] == pytest.approx(p.z2, rel=0.10), agent
        # Delta_k is sampling noise only: actions are drawn independently of the reward
        assert abs(m.delta["grpo"]) < 0.03 * m.g2["grpo"], agent
    # the construction does inflate: at the largest shift the checker's factor is 0.25 + 1.76^2 = 3.35
    if shift == 2.2:
        assert meas["checker"].g2["grpo"] / pred["checker"].z2 > 3.0


def test_reward_that_depends_on_the_action_makes_delta_count():
    # agent 0's rarest action earns a bonus: ||z||^2 (largest for that action) and A^2 are correlated
    setup = sweep_setup(0.0)
    m = measure(setup, 40_000, seed=3, action_bonus=2.0)["solver"]
    without_delta = m.z2 * m.a2["grpo"]
    assert m.delta["grpo"] > 0.2 * m.g2["grpo"]
    assert without_delta < 0.9 * m.g2["grpo"]  # the lemma's first term alone misses by > 10 %
    assert without_delta + m.delta["grpo"] == pytest.approx(m.g2["grpo"], rel=1e-9)


def test_setup_validation():
    with pytest.raises(ValueError, match="sum to 1"):
        LemmaSetup(("a",), ((0.0, 1.0),), (Kind(0.5, 0.0, 1.0, (1,)),))
    with pytest.raises(ValueError, match="never acts"):
        LemmaSetup(("a", "b"), ((0.0,), (0.0,)), (Kind(1.0, 0.0, 1.0, (1, 0)),))

"""Advantage rule: hand-computed cases from the issue and the paper, plus hypothesis properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mas_train.advantages import MODES, compute_advantages, compute_advantages_with_stats

EPS = 1e-6

# the modes computed from the batch alone (rae carries a baseline across steps: test_advantages_rae.py)
GROUP_MODES = tuple(m for m in MODES if m != "rae")

# One task group of 4 trajectories, R = [1, 0, 1, 0]; the solver acts once in each, the verifier only in
# trajectories 1 and 3. Sample order: t1 solver, t1 verifier, t2 solver, t3 solver, t3 verifier, t4 solver.
FOUR_SCORES = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
FOUR_GROUPS = ["task"] * 6
FOUR_TRAJ = ["t1", "t1", "t2", "t3", "t3", "t4"]
FOUR_AGENTS = ["solver", "verifier", "solver", "solver", "verifier", "solver"]
SOLVER = np.array([0, 2, 3, 5])
VERIFIER = np.array([1, 4])


def four(mode: str) -> np.ndarray:
    return compute_advantages(FOUR_SCORES, FOUR_GROUPS, FOUR_TRAJ, FOUR_AGENTS, mode=mode)


def test_drmas_four_trajectories():
    adv = four("drmas")
    # solver: mu_k = 0.5, sigma_k = 0.5 -> +-0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose(adv[SOLVER], [0.999998, -0.999998, 0.999998, -0.999998], atol=1e-6)
    np.testing.assert_allclose(adv[SOLVER], np.array([1, -1, 1, -1]) * 0.5 / (0.5 + EPS), rtol=0, atol=1e-15)
    # verifier: both scores 1 -> sigma_k = 0 -> exactly 0, not eps-inflated
    assert adv[VERIFIER].tolist() == [0.0, 0.0]


def test_grpo_four_trajectories_every_step_gets_its_trajectory_value():
    adv = four("grpo")
    np.testing.assert_allclose(adv, [0.999998, 0.999998, -0.999998, 0.999998, 0.999998, -0.999998], atol=1e-6)


def test_agent_std_verifier_zero_std():
    adv = four("agent_std")
    assert adv[VERIFIER].tolist() == [0.0, 0.0]
    # solver: (s - mu) / (sigma_k + eps) with mu = 0.5 (trajectories), sigma_k = 0.5
    np.testing.assert_allclose(adv[SOLVER], [0.999998, -0.999998, 0.999998, -0.999998], atol=1e-6)


def test_agent_mean_uses_agent_mean_and_the_std_of_all_turn_scores():
    res = compute_advantages_with_stats(FOUR_SCORES, FOUR_GROUPS, FOUR_TRAJ, FOUR_AGENTS, mode="agent_mean")
    # sigma_s over the six turn scores [1, 1, 0, 1, 1, 0]: mean 2/3, population std sqrt(2/9) = 0.471405
    # (the trajectory scores' sigma would be 0.5: the two-turn trajectories both succeeded)
    sigma_s = np.sqrt(2 / 9)
    # verifier: (1 - mu_k=1) / (sigma_s + eps) = 0; sigma_s is not 0, so not flagged
    assert res.advantages[VERIFIER].tolist() == [0.0, 0.0]
    assert not res.zero_std.any()
    # solver: mu_k = 0.5 -> +-0.5 / (0.471405 + eps) = +-1.060658
    np.testing.assert_allclose(res.advantages[SOLVER], [1.060658, -1.060658, 1.060658, -1.060658], atol=1e-6)
    np.testing.assert_allclose(
        res.advantages[SOLVER], np.array([1, -1, 1, -1]) * 0.5 / (sigma_s + EPS), rtol=1e-12
    )


def test_agent_mean_on_one_scale_does_not_inflate_penalty_only_groups():
    # both trajectories fail (R = 0); only the verifier's invalid action in t1 (c = 0.1) varies:
    # t1: solver 0.0, verifier -0.1; t2: solver 0.0, verifier 0.0
    s, g, t, a = [0.0, -0.1, 0.0, 0.0], [0] * 4, [1, 1, 2, 2], ["s", "v", "s", "v"]
    # Before: sigma of the trajectory scores r = [-0.05, 0] is 0.025, and the verifier got
    # (-0.1 - (-0.05)) / 0.025 = -2, A^2 = 4, from a penalty alone.
    # Now: sigma_s of the turn scores [0, -0.1, 0, 0]: mean -0.025, deviations [.025, -.075, .025, .025],
    # variance (3 * 0.000625 + 0.005625) / 4 = 0.001875, sigma_s = 0.0433013; verifier mu_k = -0.05:
    # (-0.1 + 0.05) / 0.0433013 = -1.154701 (-1.154674 with eps = 1e-6 on so small a sigma), +1.154674;
    # solver mu_k = 0: 0, 0. The verifier's E[A^2] is 1.33, not 4.
    adv = compute_advantages(s, g, t, a, mode="agent_mean")
    np.testing.assert_allclose(adv, [0.0, -1.154674, 0.0, 1.154674], atol=1e-6)
    sigma_s = np.sqrt(0.001875)
    np.testing.assert_allclose(adv, [0.0, -0.05 / (sigma_s + EPS), 0.0, 0.05 / (sigma_s + EPS)], rtol=1e-12)


# ------------------------------------------------------------------------------------------- stats="reference"


def test_reference_stats_unbiased_std():
    # FOUR: solver [1, 0, 1, 0]: mu_k 0.5, unbiased std sqrt(1/3) = 0.577350 -> +-0.5 / (0.577350 + eps) = +-0.866024
    # (the population std 0.5 gives +-1); verifier [1, 1]: std 0 -> 0 in both
    res = compute_advantages_with_stats(FOUR_SCORES, FOUR_GROUPS, FOUR_TRAJ, FOUR_AGENTS, stats="reference")
    np.testing.assert_allclose(res.advantages[SOLVER], [0.866024, -0.866024, 0.866024, -0.866024], atol=1e-6)
    np.testing.assert_allclose(
        res.advantages[SOLVER], np.array([1, -1, 1, -1]) * 0.5 / (np.sqrt(1 / 3) + EPS), rtol=1e-12
    )
    assert res.advantages[VERIFIER].tolist() == [0.0, 0.0]
    assert res.zero_std.tolist() == [False, True, False, False, True, False]
    # grpo: r = [1, 0, 1, 0] -> the same +-0.866024 on every step of each trajectory
    np.testing.assert_allclose(
        compute_advantages(FOUR_SCORES, FOUR_GROUPS, FOUR_TRAJ, FOUR_AGENTS, mode="grpo", stats="reference"),
        [0.866024, 0.866024, -0.866024, 0.866024, 0.866024, -0.866024],
        atol=1e-6,
    )


def test_reference_stats_single_sample_cell_gets_its_raw_score():
    # the answer agent acted once in the group: mu := 0, sigma := 1 -> A = 0.7 / (1 + 1e-6) = 0.6999993
    # (paper stats: 0, test_agent_with_one_sample_in_a_group_gets_zero). solver [1, 0]: mu 0.5, unbiased std
    # sqrt(0.5) = 0.707107 -> +-0.5 / 0.707107 = +-0.707106
    s, g, t, a = [1.0, 0.0, 0.7], [0, 0, 0], [0, 1, 1], ["solver", "solver", "answer"]
    res = compute_advantages_with_stats(s, g, t, a, stats="reference")
    np.testing.assert_allclose(res.advantages, [0.707106, -0.707106, 0.6999993], atol=1e-6)
    np.testing.assert_allclose(
        res.advantages, [0.5 / (np.sqrt(0.5) + EPS), -0.5 / (np.sqrt(0.5) + EPS), 0.7 / (1 + EPS)], rtol=1e-12
    )
    assert res.zero_std.tolist() == [False, False, False]
    assert res.per_agent["answer"].zero_std_frac == 0.0
    # a wrong single answer (score 0, or -0.1 with a penalty) is not pushed down below 0 by more than its score
    res = compute_advantages_with_stats([1.0, 0.0, -0.1], g, t, a, stats="reference")
    assert res.advantages[2] == pytest.approx(-0.1 / (1 + EPS), rel=1e-12)
    # a task group of one trajectory under grpo: its raw trajectory score r = (1.0 + 0.9) / 2 = 0.95
    adv = compute_advantages([1.0, 0.9], [0, 0], [0, 0], ["s", "v"], mode="grpo", stats="reference")
    np.testing.assert_allclose(adv, [0.95 / (1 + EPS)] * 2, rtol=1e-12)


def test_reference_stats_in_the_mixed_modes():
    # the mixed-modes batch below: r = [0.95, 0.0]; turn scores [1.0, 0.9, 0.0, 0.0]
    s, g, t, a = [1.0, 0.9, 0.0, 0.0], [0, 0, 0, 0], [0, 0, 1, 1], ["s", "v", "s", "v"]
    # unbiased: sigma (of r) = 0.95 / sqrt(2) = 0.671751; solver sigma_k = 1 / sqrt(2) = 0.707107; verifier
    # sigma_k = 0.9 / sqrt(2) = 0.636396; sigma_s = sqrt(0.9075 / 3) = 0.550000 (sum of squares 0.9075)
    sig_s = np.sqrt(0.9075 / 3)
    assert sig_s == pytest.approx(0.55, rel=1e-12)
    np.testing.assert_allclose(
        compute_advantages(s, g, t, a, mode="agent_mean", stats="reference"),
        [0.5 / (0.55 + EPS), 0.45 / (0.55 + EPS), -0.5 / (0.55 + EPS), -0.45 / (0.55 + EPS)],
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        compute_advantages(s, g, t, a, mode="agent_std", stats="reference"),
        [
            0.525 / (1 / np.sqrt(2) + EPS),
            0.425 / (0.9 / np.sqrt(2) + EPS),
            -0.475 / (1 / np.sqrt(2) + EPS),
            -0.475 / (0.9 / np.sqrt(2) + EPS),
        ],
        rtol=1e-12,
    )


def test_mixed_modes_differ_when_means_differ():
    # penalties make the agent mean differ from the trajectory mean: one group, two trajectories
    # t1: solver 1.0, verifier 0.9 (invalid, c = 0.1); t2: solver 0.0, verifier 0.0
    s = [1.0, 0.9, 0.0, 0.0]
    g = [0, 0, 0, 0]
    t = [0, 0, 1, 1]
    a = ["s", "v", "s", "v"]
    # r = [0.95, 0.0]: mu = 0.475, sigma = 0.475. solver mu_k = 0.5, sigma_k = 0.5; verifier 0.45, 0.45
    sig_s = np.sqrt(0.226875)
    expected = {
        "grpo": [
            0.475 / (0.475 + EPS),
            0.475 / (0.475 + EPS),
            -0.475 / (0.475 + EPS),
            -0.475 / (0.475 + EPS),
        ],
        "drmas": [0.5 / (0.5 + EPS), 0.45 / (0.45 + EPS), -0.5 / (0.5 + EPS), -0.45 / (0.45 + EPS)],
        # sigma_s over the turn scores [1.0, 0.9, 0.0, 0.0]: mean 0.475, squared deviations .275625, .180625,
        # .225625, .225625 -> variance 0.226875, sigma_s = 0.476314
        "agent_mean": [
            0.5 / (sig_s + EPS),
            0.45 / (sig_s + EPS),
            -0.5 / (sig_s + EPS),
            -0.45 / (sig_s + EPS),
        ],
        "agent_std": [0.525 / (0.5 + EPS), 0.425 / (0.45 + EPS), -0.475 / (0.5 + EPS), -0.475 / (0.45 + EPS)],
    }
    for mode, want in expected.items():
        np.testing.assert_allclose(compute_advantages(s, g, t, a, mode=mode), want, rtol=1e-12, err_msg=mode)
    np.testing.assert_allclose(compute_advantages(s, g, t, a, mode="agent_mean")[0], 1.049726, atol=1e-6)


def test_two_trajectories_repeated_solver_turns():
    # R = [1, 0]; trajectory 1 has two solver turns
    s, g, t, a = [1.0, 1.0, 0.0], ["x"] * 3, [1, 1, 2], ["solver"] * 3
    # drmas: mu_k = 2/3, sigma_k = sqrt(2)/3 (population), a trajectory counts once per turn
    np.testing.assert_allclose(compute_advantages(s, g, t, a), [0.707105, 0.707105, -1.414211], atol=1e-6)
    sigma = np.sqrt(2) / 3
    np.testing.assert_allclose(
        compute_advantages(s, g, t, a), [1 / 3 / (sigma + EPS), 1 / 3 / (sigma + EPS), -2 / 3 / (sigma + EPS)]
    )
    # grpo: one r_i per trajectory -> r = [1, 0]
    np.testing.assert_allclose(
        compute_advantages(s, g, t, a, mode="grpo"), [0.999998, 0.999998, -0.999998], atol=1e-6
    )


def test_trajectory_score_is_mean_of_step_scores():
    # t1 steps [1.0, 0.9] -> r = 0.95; t2 [0.0] -> r = 0; t3 [0.5] -> r = 0.5
    s, t = [1.0, 0.9, 0.0, 0.5], [1, 1, 2, 3]
    r = np.array([0.95, 0.0, 0.5])
    mu, sigma = r.mean(), r.std()
    want = (r[[0, 0, 1, 2]] - mu) / (sigma + EPS)
    np.testing.assert_allclose(compute_advantages(s, [0] * 4, t, ["a"] * 4, mode="grpo"), want, rtol=1e-12)


def test_agent_with_one_sample_in_a_group_gets_zero():
    # the reference code would give the raw score 0.7 here (mu := 0, sigma := 1)
    s, g, t, a = [1.0, 0.0, 0.7], [0, 0, 0], [0, 1, 1], ["solver", "solver", "answer"]
    res = compute_advantages_with_stats(s, g, t, a)
    assert res.advantages[2] == 0.0
    assert res.zero_std.tolist() == [False, False, True]
    assert res.per_agent["answer"].zero_std_frac == 1.0
    assert res.per_agent["solver"].zero_std_frac == 0.0


def test_constant_group_gives_zero_in_every_mode():
    for mode in GROUP_MODES:
        adv = compute_advantages([0.3] * 6, [0] * 6, [0, 0, 1, 1, 2, 2], ["a", "b"] * 3, mode=mode)
        assert adv.tolist() == [0.0] * 6, mode


def test_groups_are_normalised_separately_and_ids_may_repeat_across_groups():
    # group A: R = [1, 0]; group B: R = [5, 3] -> both +-1 after normalisation; traj ids reused
    s, g, t, a = [1.0, 0.0, 5.0, 3.0], ["A", "A", "B", "B"], [0, 1, 0, 1], ["x"] * 4
    for mode in GROUP_MODES:
        np.testing.assert_allclose(
            compute_advantages(s, g, t, a, mode=mode),
            [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 1 / (1 + EPS), -1 / (1 + EPS)],
            err_msg=mode,
        )


def test_batch_scope_pools_groups():
    s, g, t, a = [1.0, 0.0, 5.0, 3.0], ["A", "A", "B", "B"], [0, 1, 0, 1], ["x"] * 4
    x = np.array(s)
    want = (x - x.mean()) / (x.std() + EPS)  # mean 2.25, population std of [1, 0, 5, 3]
    for mode in GROUP_MODES:
        np.testing.assert_allclose(
            compute_advantages(s, g, t, a, mode=mode, scope="batch"), want, err_msg=mode
        )


def test_stats_per_agent_and_metrics():
    res = compute_advantages_with_stats(FOUR_SCORES, FOUR_GROUPS, FOUR_TRAJ, FOUR_AGENTS)
    solver, verifier = res.per_agent["solver"], res.per_agent["verifier"]
    assert (solver.count, verifier.count) == (4, 2)
    assert solver.mean == pytest.approx(0.0, abs=1e-15)
    assert solver.std == pytest.approx(0.5 / (0.5 + EPS), rel=1e-12)
    assert (verifier.mean, verifier.std, verifier.zero_std_frac) == (0.0, 0.0, 1.0)
    m = res.metrics()
    assert m["advantages/zero_std_frac/verifier"] == 1.0
    assert m["advantages/count/solver"] == 4.0
    assert list(res.per_agent) == ["solver", "verifier"]


def test_numpy_inputs_and_empty_batch():
    adv = compute_advantages(
        np.array([1.0, 0.0]), np.array([7, 7]), np.array(["a", "b"]), np.array(["s", "s"])
    )
    assert adv.dtype == np.float64 and adv.shape == (2,)
    res = compute_advantages_with_stats([], [], [], [])
    assert res.advantages.shape == (0,) and res.per_agent == {}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_scores_raise(bad):
    with pytest.raises(ValueError, match=r"NaN/inf.*indices \[1\]"):
        compute_advantages([0.0, bad, 1.0], [0, 0, 0], [0, 1, 2], ["a"] * 3)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="mode must be one of"):
        compute_advantages([1.0], [0], [0], ["a"], mode="ppo")
    with pytest.raises(ValueError, match="scope must be one of"):
        compute_advantages([1.0], [0], [0], ["a"], scope="task")
    with pytest.raises(ValueError, match=r"stats must be one of \['paper', 'reference'\]"):
        compute_advantages([1.0], [0], [0], ["a"], stats="unbiased")
    with pytest.raises(ValueError, match="agent_ids has 1 entries but scores has 2"):
        compute_advantages([1.0, 0.0], [0, 0], [0, 1], ["a"])
    with pytest.raises(ValueError, match="eps"):
        compute_advantages([1.0], [0], [0], ["a"], eps=-1.0)
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages([[1.0]], [0], [0], ["a"])


# ------------------------------------------------------------------------------------------------ properties

# Scores on a 0.1 grid, like R in {0, 1} minus penalties: exact enough that "std = 0" is unambiguous.
score = st.integers(-20, 20).map(lambda v: v / 10)


@st.composite
def batches(draw):
    """A batch of 1-3 task groups; each trajectory has 1-4 turns by 1-3 agents."""
    scores, groups, trajs, agents = [], [], [], []
    for g in range(draw(st.integers(1, 3))):
        for t in range(draw(st.integers(1, 5))):
            for _ in range(draw(st.integers(1, 4))):
                scores.append(draw(score))
                groups.append(f"g{g}")
                trajs.append(t)
                agents.append(draw(st.sampled_from(["solver", "verifier", "answer"])))
    return np.array(scores), groups, trajs, agents


@settings(max_examples=200, deadline=None)
@given(batches())
def test_drmas_zero_mean_unit_std_per_agent_and_group(batch):
    s, g, t, a = batch
    adv = compute_advantages(s, g, t, a)
    for key in set(zip(g, a, strict=True)):
        mask = np.array([(gi, ai) == key for gi, ai in zip(g, a, strict=True)])
        sigma_k = s[mask].std()
        assert adv[mask].mean() == pytest.approx(0.0, abs=1e-9)
        # equal values can have a rounding-noise std (std of [0.1]*3 is 1.4e-17): the rule treats it as 0
        if sigma_k > 1e-12 * max(1.0, abs(s[mask].mean())):
            # population std of (s - mu_k)/(sigma_k + eps) is sigma_k/(sigma_k + eps), i.e. 1 up to eps
            assert adv[mask].std() == pytest.approx(sigma_k / (sigma_k + EPS), rel=1e-9)
            assert adv[mask].std() == pytest.approx(1.0, abs=1e-4)
        else:
            assert (adv[mask] == 0).all()


@settings(max_examples=200, deadline=None)
@given(
    batches(),
    st.integers(-50, 50).map(lambda v: v / 10),
    st.sampled_from(GROUP_MODES),
    st.sampled_from(["group", "batch"]),
)
def test_adding_a_constant_to_a_group_changes_nothing(batch, shift, mode, scope):
    s, g, t, a = batch
    target = g[0] if scope == "group" else None  # batch scope pools groups: shift them all
    shifted = s + np.array([shift if target is None or gi == target else 0.0 for gi in g])
    np.testing.assert_allclose(
        compute_advantages(shifted, g, t, a, mode=mode, scope=scope),
        compute_advantages(s, g, t, a, mode=mode, scope=scope),
        atol=1e-8,
    )


@settings(max_examples=200, deadline=None)
@given(
    batches(),
    st.randoms(use_true_random=False),
    st.sampled_from(GROUP_MODES),
    st.sampled_from(["group", "batch"]),
)
def test_permuting_samples_permutes_output(batch, rnd, mode, scope):
    s, g, t, a = batch
    perm = list(range(len(s)))
    rnd.shuffle(perm)
    base = compute_advantages(s, g, t, a, mode=mode, scope=scope)
    permuted = compute_advantages(
        s[perm], [g[i] for i in perm], [t[i] for i in perm], [a[i] for i in perm], mode=mode, scope=scope
    )
    np.testing.assert_allclose(permuted, base[perm], atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=12),
    st.sampled_from(GROUP_MODES),
    st.sampled_from(["group", "batch"]),
)
def test_any_finite_scores_give_finite_bounded_values(scores, mode, scope):
    n = len(scores)
    # a single group where every sample is its own trajectory of one agent, plus a constant group
    s = np.array(scores + [3.0, 3.0])
    g = [0] * n + [1, 1]
    t = list(range(n)) + [0, 1]
    a = ["x"] * (n + 2)
    res = compute_advantages_with_stats(s, g, t, a, mode=mode, scope=scope)
    assert np.isfinite(res.advantages).all()
    if scope == "group":
        assert res.advantages[-2:].tolist() == [0.0, 0.0]
    if n == 1 and scope == "group":  # single-sample group
        assert res.advantages[0] == 0.0
    # |A| <= sqrt(N - 1) for a z-score over N values
    assert (np.abs(res.advantages) <= np.sqrt(n + 2) + 1e-9).all()


def test_advantage_stats_config_default_and_validation():
    from mas_train.config import ConfigError, TrainConfig

    assert TrainConfig.from_dict({}).advantage_stats == "paper"
    assert TrainConfig.from_dict({"advantage_stats": "reference"}).advantage_stats == "reference"
    with pytest.raises(ConfigError, match=r"advantage_stats must be one of \['paper', 'reference'\]"):
        TrainConfig.from_dict({"advantage_stats": "unbiased"})

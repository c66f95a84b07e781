"""SPIRAL's RAE (advantage_mode rae): a per-agent moving-average baseline kept across steps, hand-computed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mas_train.advantages import RAE_DEFAULT_DECAY, RoleBaseline, compute_advantages_with_stats
from mas_train.checkpoint import load_state
from mas_train.config import ConfigError, TrainConfig

P0, P1 = "player_0", "player_1"


def _step(baseline, scores, trajs, agents):
    """One step at G = 1: every trajectory is its own task group."""
    return compute_advantages_with_stats(scores, trajs, trajs, agents, mode="rae", baseline=baseline)


# Two seats of a zero-sum game; player_0 moves at turns 0 and 2, player_1 at turn 1 (samples in turn order).
# Step 1: one game, player_0 wins 1 - (-1). Step 2: two games, "b" first in the batch (-1 / +1), then "a"
# (+2 / -2). Step 3: one game, player_0 wins but its second move was invalid (penalty 0.5): its step scores are
# [1, 0.5], so its trajectory score r = 0.75; player_1 scores -1.
STEPS = [
    ([1.0, -1.0, 1.0], ["g"] * 3, [P0, P1, P0]),
    ([-1.0, 1.0, -1.0, 2.0, -2.0, 2.0], ["b", "b", "b", "a", "a", "a"], [P0, P1, P0] * 2),
    ([1.0, -1.0, 0.5], ["g"] * 3, [P0, P1, P0]),
]
# d = 0.95 (SPIRAL's default); A = s - b (b before this trajectory's update), then b <- 0.95 b + 0.05 r.
#   step 1: b = 0 for both -> A = s; b0 = 0.05 * 1 = 0.05, b1 = -0.05
#   step 2, game b: A0 = -1 - 0.05 = -1.05, A1 = 1 + 0.05 = 1.05;  b0 = 0.0475 - 0.05 = -0.0025, b1 = 0.0025
#           game a: A0 = 2 + 0.0025 = 2.0025, A1 = -2 - 0.0025 = -2.0025;
#                   b0 = -0.002375 + 0.1 = 0.097625, b1 = -0.097625
#   step 3: A0 = 1 - 0.097625 = 0.902375 and 0.5 - 0.097625 = 0.402375, A1 = -1 + 0.097625 = -0.902375;
#           b0 = 0.95 * 0.097625 + 0.05 * 0.75 = 0.13024375, b1 = 0.95 * -0.097625 - 0.05 = -0.14274375
WANT_ADV = [
    [1.0, -1.0, 1.0],
    [-1.05, 1.05, -1.05, 2.0025, -2.0025, 2.0025],
    [0.902375, -0.902375, 0.402375],
]
WANT_BASELINE = [
    {P0: 0.05, P1: -0.05},
    {P0: 0.097625, P1: -0.097625},
    {P0: 0.13024375, P1: -0.14274375},
]
WANT_COUNTS = [{P0: 1, P1: 1}, {P0: 3, P1: 3}, {P0: 4, P1: 4}]


def test_rae_two_seats_three_steps_hand_computed():
    baseline = RoleBaseline()
    assert baseline.decay == RAE_DEFAULT_DECAY == 0.95
    assert baseline.get(P0) == 0.0  # the first step's baseline, as SPIRAL's EMA starts at 0
    for (scores, trajs, agents), adv, b, counts in zip(
        STEPS, WANT_ADV, WANT_BASELINE, WANT_COUNTS, strict=True
    ):
        res = _step(baseline, scores, trajs, agents)
        np.testing.assert_allclose(res.advantages, adv, rtol=0, atol=1e-12)
        assert res.baseline == pytest.approx(b, abs=1e-12)
        assert baseline.values == pytest.approx(b, abs=1e-12) and baseline.counts == counts
        assert not res.zero_std.any()  # no std: nothing is zeroed
        assert res.stat_group.tolist() == [0 if a == P0 else 1 for a in agents]
    metrics = res.metrics(prefix="charts/advantage")
    assert metrics["charts/advantage/baseline/player_0"] == pytest.approx(0.13024375, abs=1e-12)
    assert metrics["charts/advantage/baseline/player_1"] == pytest.approx(-0.14274375, abs=1e-12)
    assert metrics["charts/advantage/mean/player_0"] == pytest.approx((0.902375 + 0.402375) / 2)


def test_rae_updates_in_the_order_trajectories_appear_in_the_batch():
    # step 2 with game "a" first: A0 = 2 - 0.05 = 1.95, b0 = 0.0475 + 0.1 = 0.1475; then game "b":
    # A0 = -1 - 0.1475 = -1.1475 (game b came first above and got -1.05)
    baseline = RoleBaseline()
    _step(baseline, *STEPS[0])
    res = _step(baseline, [2.0, -2.0, -1.0, 1.0], ["a", "a", "b", "b"], [P0, P1, P0, P1])
    np.testing.assert_allclose(res.advantages, [1.95, -1.95, -1.1475, 1.1475], rtol=0, atol=1e-12)
    assert baseline.values[P0] == pytest.approx(0.95 * 0.1475 - 0.05, abs=1e-12)


def test_rae_learns_at_one_generation_where_drmas_has_no_signal():
    scores, trajs, agents = [1.0, -1.0], ["g", "g"], [P0, P1]  # G = 1: one trajectory in its task group
    drmas = compute_advantages_with_stats(scores, trajs, trajs, agents, mode="drmas")
    assert drmas.advantages.tolist() == [0.0, 0.0] and drmas.zero_std.all()
    baseline = RoleBaseline(0.5)
    assert _step(baseline, scores, trajs, agents).advantages.tolist() == [1.0, -1.0]
    assert _step(baseline, scores, trajs, agents).advantages.tolist() == [0.5, -0.5]  # b = +-0.5 now
    cfg = TrainConfig.from_dict({"env": "parity", "advantage_mode": "rae", "num_generations": 1})
    assert cfg.num_generations == 1 and cfg.advantage_rae_decay == 0.95
    with pytest.raises(ConfigError, match="num_generations must be >= 2"):
        TrainConfig.from_dict({"env": "parity", "num_generations": 1})  # drmas still refuses it


def test_rae_state_round_trips_through_a_checkpoint_file(tmp_path):
    a = RoleBaseline()
    for step in STEPS[:2]:
        _step(a, *step)
    torch.save(a.state_dict(), tmp_path / "trainer_state.pt")
    b = RoleBaseline()
    b.load_state_dict(load_state(tmp_path / "trainer_state.pt"))  # plain data: the safe loader accepts it
    assert b.values == a.values and b.counts == a.counts
    np.testing.assert_array_equal(_step(b, *STEPS[2]).advantages, _step(a, *STEPS[2]).advantages)
    assert b.values == a.values
    with pytest.raises(ValueError, match="resume with advantage_rae_decay 0.95"):
        RoleBaseline(0.9).load_state_dict(a.state_dict())


def test_rae_needs_its_baseline_and_no_other_mode_takes_one():
    with pytest.raises(ValueError, match="mode='rae' needs baseline"):
        compute_advantages_with_stats([1.0], ["g"], ["g"], [P0], mode="rae")
    with pytest.raises(ValueError, match="no other mode takes one"):
        compute_advantages_with_stats([1.0], ["g"], ["g"], [P0], mode="drmas", baseline=RoleBaseline())
    for bad in (0.0, 1.0, -0.5, True):
        with pytest.raises(ValueError, match=r"decay must be a number in \(0, 1\)"):
            RoleBaseline(bad)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (
            {"advantage_rae_decay": 0.9},
            "advantage_rae_decay is set but advantage_mode is drmas, so it would do nothing",
        ),
        (
            {"advantage_mode": "rae", "advantage_rae_decay": 1.0},
            r"advantage_rae_decay must be a number in \(0, 1\)",
        ),
        (
            {"advantage_mode": "rae", "advantage_stats": "reference"},
            "advantage_stats 'reference' does not apply",
        ),
        (
            {"advantage_mode": "rae", "advantage_scope": "batch", "tasks_per_step": 2},
            "advantage_scope 'batch' does not apply",
        ),
        (
            {"advantage_mode": "rae", "dynamic_sampling": {"enabled": True}},
            "set --dynamic_sampling.enabled false",
        ),
    ],
)
def test_rae_settings_that_would_do_nothing_are_refused_in_one_line(settings, match):
    with pytest.raises(ConfigError, match=match) as err:
        TrainConfig.from_dict({"env": "parity", **settings})
    assert "\n" not in str(err.value)


def test_a_training_step_at_one_generation_trains_on_rae_advantages(tmp_path, tiny_qwen3_path):
    pytest.importorskip("trl")
    from _train_fakes import PARITY_TASKS, make_parity_env

    from mas_train.assemble import assemble_trainer

    cfg = TrainConfig.from_dict(
        dict(
            env="parity",
            model=tiny_qwen3_path,
            advantage_mode="rae",
            advantage_rae_decay=0.5,
            num_generations=1,
            tasks_per_step=1,
            max_steps=2,
            output_dir=str(tmp_path),
            run_name="g1",
            learning_rate=1e-3,
            sampling={"max_new_tokens": 4},
        )
    )
    trainer = assemble_trainer(
        cfg.resolve(["solver", "verifier"]), env_factory=make_parity_env, train_tasks=PARITY_TASKS
    )
    try:
        m1, _ = trainer.train_step()
        m2, _ = trainer.train_step()
    finally:
        trainer.close()
    assert trainer.role_baseline is not None and trainer.role_baseline.counts == {"solver": 2, "verifier": 2}
    for agent in ("solver", "verifier"):
        # one trajectory a step, each agent acting once: step 1's advantage is its score (b = 0), after it
        # b = 0.5 * score; step 2's advantage is its score minus that
        b1 = m1[f"charts/advantage/baseline/{agent}"]
        s1 = m1[f"charts/advantage/mean/{agent}"]
        assert s1 != 0.0  # ParityEnv's checksum reward: a signal at G = 1, where drmas would give 0
        assert m1[f"charts/advantage/count/{agent}"] == 1.0 and b1 == pytest.approx(0.5 * s1)
        s2 = m2[f"charts/advantage/mean/{agent}"] + b1
        assert m2[f"charts/advantage/baseline/{agent}"] == pytest.approx(0.5 * b1 + 0.5 * s2)
    assert m1["charts/skipped/shared"] == 0.0  # the group trained (G = 1 is not refused or skipped)

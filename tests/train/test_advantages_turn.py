"""scope="turn": AT-GRPO's (task group, agent, turn position) cells, with the small-cell fallback, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mas_train.advantages import compute_advantages, compute_advantages_with_stats

EPS = 1e-6
# Task A, 4 trajectories: solver first attempts [0, 0, 1, 1]; trajectories 0 and 1 were rejected and retried,
# both retries right [1, 1]; verifier [1, 1, 1, 0]. Task B, 2 trajectories: solver [0, 1], only trajectory 0
# retried (1); verifier [1, 0]. Rows: (group, traj, agent, turn, score), in a shuffled order.
ROWS = [
    ("B", 0, "solver", 2, 1.0),
    ("A", 0, "solver", 0, 0.0),
    ("A", 3, "verifier", 1, 0.0),
    ("A", 1, "solver", 2, 1.0),
    ("A", 0, "verifier", 1, 1.0),
    ("B", 1, "solver", 0, 1.0),
    ("A", 1, "solver", 0, 0.0),
    ("A", 2, "solver", 0, 1.0),
    ("B", 0, "verifier", 1, 1.0),
    ("A", 0, "solver", 2, 1.0),
    ("A", 1, "verifier", 1, 1.0),
    ("A", 3, "solver", 0, 1.0),
    ("B", 0, "solver", 0, 0.0),
    ("A", 2, "verifier", 1, 1.0),
    ("B", 1, "verifier", 1, 0.0),
]


def _cols(rows=ROWS):
    g, t, a, turn, s = zip(*rows, strict=True)
    return list(s), list(g), list(t), list(a), list(turn)


def _run(mode="drmas", **kw):
    s, g, t, a, turn = _cols()
    return compute_advantages_with_stats(s, g, t, a, mode=mode, scope="turn", turn_ids=turn, **kw)


def _by_row(values):
    return {(r[0], r[1], r[2], r[3]): v for r, v in zip(ROWS, values, strict=True)}


ONE = 0.5 / (0.5 + EPS)  # a cell {0, 1}: mu 0.5, sigma 0.5
SQRT_2_9 = math.sqrt(2 / 9)  # population std of {0, 1, 1}
V_STD = math.sqrt(0.1875)  # population std of {1, 1, 1, 0}


def test_turn_scope_by_hand():
    res = _run()
    adv = _by_row(res.advantages)
    expected = {
        # A, solver position 0: [0, 0, 1, 1]
        ("A", 0, "solver", 0): -ONE,
        ("A", 1, "solver", 0): -ONE,
        ("A", 2, "solver", 0): ONE,
        ("A", 3, "solver", 0): ONE,
        # A, solver position 1: [1, 1] -> zero std, no signal (group scope would give them +0.707)
        ("A", 0, "solver", 2): 0.0,
        ("A", 1, "solver", 2): 0.0,
        # A, verifier position 0: [1, 1, 1, 0], mu 0.75
        ("A", 0, "verifier", 1): 0.25 / (V_STD + EPS),
        ("A", 1, "verifier", 1): 0.25 / (V_STD + EPS),
        ("A", 2, "verifier", 1): 0.25 / (V_STD + EPS),
        ("A", 3, "verifier", 1): -0.75 / (V_STD + EPS),
        # B, solver position 0: [0, 1]
        ("B", 0, "solver", 0): -ONE,
        ("B", 1, "solver", 0): ONE,
        # B, solver position 1: one turn < min_turn_samples 2 -> B's solver statistics over [0, 1, 1]
        ("B", 0, "solver", 2): (1 - 2 / 3) / (SQRT_2_9 + EPS),
        # B, verifier [1, 0]
        ("B", 0, "verifier", 1): ONE,
        ("B", 1, "verifier", 1): -ONE,
    }
    assert adv.keys() == expected.keys()
    for k, v in expected.items():
        assert adv[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k
    assert round(adv[("B", 0, "solver", 2)], 6) == 0.707105
    fallback = {k for k, f in _by_row(res.turn_fallback).items() if f}
    assert fallback == {("B", 0, "solver", 2)}
    zero = {k for k, z in _by_row(res.zero_std).items() if z}
    assert zero == {("A", 0, "solver", 2), ("A", 1, "solver", 2)}
    # cells: A has solver p0, solver p1, verifier p0; B has solver p0, solver fallback, verifier p0
    cells = _by_row(res.stat_group)
    assert len(set(cells.values())) == 6
    assert cells[("A", 0, "solver", 2)] == cells[("A", 1, "solver", 2)] != cells[("A", 0, "solver", 0)]


def test_group_scope_pools_the_positions_for_contrast():
    s, g, t, a, _ = _cols()
    adv = _by_row(compute_advantages(s, g, t, a, scope="group"))
    # A's solver pool [0, 0, 1, 1, 1, 1]: mu 2/3, sigma sqrt(2/9): the retries get +0.707, not 0
    assert adv[("A", 0, "solver", 2)] == pytest.approx((1 / 3) / (SQRT_2_9 + EPS), rel=1e-12)
    assert adv[("A", 0, "solver", 0)] == pytest.approx((-2 / 3) / (SQRT_2_9 + EPS), rel=1e-12)


def test_min_turn_samples():
    # 1: never fall back; B's lone retry has zero std -> 0
    res = _run(min_turn_samples=1)
    assert not res.turn_fallback.any()
    assert _by_row(res.advantages)[("B", 0, "solver", 2)] == 0.0
    # 3: A's two retries fall back to A's solver pool [0, 0, 1, 1, 1, 1], and so does B's position-0 pair;
    # A's four first attempts keep their own cell
    adv = _by_row(_run(min_turn_samples=3).advantages)
    assert adv[("A", 0, "solver", 2)] == pytest.approx((1 / 3) / (SQRT_2_9 + EPS), rel=1e-12)
    assert adv[("A", 0, "solver", 0)] == pytest.approx(-ONE, rel=1e-12)
    assert adv[("B", 1, "solver", 0)] == pytest.approx((1 - 2 / 3) / (SQRT_2_9 + EPS), rel=1e-12)
    assert adv[("A", 3, "verifier", 1)] == pytest.approx(-0.75 / (V_STD + EPS), rel=1e-12)  # 4 >= 3


def test_the_mixed_modes_use_the_turn_cells():
    adv = _by_row(_run("agent_mean").advantages)
    # (s - mu_{k,p}) / sigma_s and (s - mu) / sigma_{k,p}; sigma_s over A's ten turn scores (7 ones, 3 zeros):
    # mean 0.7, population std sqrt(0.7 * 0.3) = 0.458258; A's verifier cell [1, 1, 1, 0] has mu 0.75:
    # -0.75 / 0.458258 = -1.636634
    assert adv[("A", 3, "verifier", 1)] == pytest.approx(-1.636634, abs=1e-5)
    assert adv[("A", 3, "verifier", 1)] == pytest.approx(-0.75 / (math.sqrt(0.21) + EPS), rel=1e-12)
    # mu and sigma_{k,p}: mu over A's trajectory means
    r = {}
    for grp, tr, _, _, sc in ROWS:
        r.setdefault((grp, tr), []).append(sc)
    r_a = np.array([np.mean(v) for (grp, _), v in sorted(r.items()) if grp == "A"])
    adv = _by_row(_run("agent_std").advantages)
    assert adv[("A", 3, "verifier", 1)] == pytest.approx((0.0 - r_a.mean()) / (V_STD + EPS), rel=1e-12)


def test_turn_scope_errors():
    s, g, t, a, turn = _cols()
    with pytest.raises(ValueError, match="mode='grpo' has none"):
        compute_advantages(s, g, t, a, mode="grpo", scope="turn", turn_ids=turn)
    with pytest.raises(ValueError, match="scope='turn' needs turn_ids"):
        compute_advantages(s, g, t, a, scope="turn")
    with pytest.raises(ValueError, match="turn_ids has shape"):
        compute_advantages(s, g, t, a, scope="turn", turn_ids=turn[:-1])
    with pytest.raises(ValueError, match="min_turn_samples must be an int >= 1"):
        compute_advantages(s, g, t, a, scope="turn", turn_ids=turn, min_turn_samples=0)
    dup = list(turn)
    dup[9] = 0  # row 9 is A/0's solver retry (turn 2): now A/0's solver has turn 0 twice
    with pytest.raises(ValueError, match=r"sample \d+ repeats turn 0 of its agent in its trajectory"):
        compute_advantages(s, g, t, a, scope="turn", turn_ids=dup)
    # turn ids are ignored by the other scopes
    assert np.array_equal(
        compute_advantages(s, g, t, a, scope="group", turn_ids=dup), compute_advantages(s, g, t, a)
    )


def test_the_config_refuses_grpo_with_turn_scope_and_a_zero_threshold():
    from mas_train.config import ConfigError, TrainConfig

    with pytest.raises(
        ConfigError, match="advantage_scope: turn groups the per-agent statistics by turn position"
    ):
        TrainConfig.from_dict({"advantage_scope": "turn", "advantage_mode": "grpo"})
    with pytest.raises(ConfigError, match="advantage_turn_min_samples"):
        TrainConfig.from_dict({"advantage_scope": "turn", "advantage_turn_min_samples": 0})
    cfg = TrainConfig.from_dict({"advantage_scope": "turn", "advantage_turn_min_samples": 3})
    assert (cfg.advantage_scope, cfg.advantage_turn_min_samples) == ("turn", 3)


def test_turn_min_samples_without_the_turn_scope_is_refused_not_ignored():
    from mas_train.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="only applies with advantage_scope turn"):
        TrainConfig.from_dict({"advantage_turn_min_samples": 3})
    assert TrainConfig.from_dict({"advantage_scope": "turn", "advantage_turn_min_samples": 3})

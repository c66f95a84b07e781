"""avg@k / pass@k: the issue's case, per-source splits, the unbiased estimator, bad input."""

from __future__ import annotations

import math

import pytest

from mas_train.metrics import avg_at_k, pass_at_k, pass_at_k_and_avg_at_k, unbiased_pass_at_k


def test_issue_case():
    uids, succ = ["a", "a", "b", "b"], [1, 0, 0, 0]
    assert pass_at_k(uids, succ) == {"pass@2": 0.5}
    assert avg_at_k(uids, succ) == {"avg@2": 0.25}


def test_per_data_source_and_overall_weigh_tasks_equally():
    # gsm8k: task a 2/3 solved, task b 0/3; math: task c 3/3
    uids = ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    succ = [True, True, False, False, False, False, True, True, True]
    src = ["gsm8k"] * 6 + ["math"] * 3
    out = pass_at_k_and_avg_at_k(uids, succ, src)
    assert out == pytest.approx(
        {
            "avg@3": (2 / 3 + 0 + 1) / 3,
            "pass@3": 2 / 3,
            "gsm8k/avg@3": (2 / 3 + 0) / 2,
            "gsm8k/pass@3": 0.5,
            "math/avg@3": 1.0,
            "math/pass@3": 1.0,
        }
    )
    assert list(pass_at_k(uids, succ, src)) == ["pass@3", "gsm8k/pass@3", "math/pass@3"]


def test_interleaved_order_does_not_matter():
    assert pass_at_k_and_avg_at_k(["b", "a", "b", "a"], [0, 0, 0, 1]) == {"avg@2": 0.25, "pass@2": 0.5}


def test_unbiased_estimator_values():
    # 1 - C(n-c, k)/C(n, k)
    assert unbiased_pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert unbiased_pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert unbiased_pass_at_k(10, 0, 3) == 0.0
    assert unbiased_pass_at_k(10, 8, 3) == 1.0  # fewer than k failures
    assert unbiased_pass_at_k(200, 13, 10) == pytest.approx(
        1 - math.comb(187, 10) / math.comb(200, 10), rel=1e-12
    )
    # k = 1 is the success rate
    assert unbiased_pass_at_k(7, 3, 1) == pytest.approx(3 / 7)


def test_unbiased_over_tasks_with_more_samples_than_k():
    # task a: n=4, c=1; task b: n=5, c=2 -> pass@2 = (0.5 + 0.7) / 2
    uids = ["a"] * 4 + ["b"] * 5
    succ = [1, 0, 0, 0, 1, 1, 0, 0, 0]
    out = pass_at_k_and_avg_at_k(uids, succ, k=2, unbiased=True)
    assert out == pytest.approx({"pass@2": 0.6, "avg@2": (1 / 4 + 2 / 5) / 2})
    # with n = k the unbiased estimate equals the plain one
    assert pass_at_k(["a", "a", "b", "b"], [1, 0, 0, 0], unbiased=True) == {"pass@2": 0.5}


def test_empty_input():
    assert pass_at_k_and_avg_at_k([], []) == {}


def test_bad_input_raises():
    with pytest.raises(ValueError, match="different numbers of trajectories"):
        pass_at_k(["a", "a", "b"], [1, 0, 0])
    with pytest.raises(ValueError, match="task 'b' has 1 trajectories; pass@2 needs exactly 2"):
        pass_at_k(["a", "a", "b"], [1, 0, 0], k=2)
    with pytest.raises(ValueError, match="needs at least 3"):
        pass_at_k(["a", "a"], [1, 0], k=3, unbiased=True)
    with pytest.raises(ValueError, match="0/1"):
        pass_at_k(["a", "a"], [0.5, 0])
    with pytest.raises(ValueError, match="one per trajectory"):
        pass_at_k(["a", "a"], [1])
    with pytest.raises(ValueError, match="two data sources"):
        pass_at_k(["a", "a"], [1, 0], ["gsm8k", "math"])
    with pytest.raises(ValueError, match="n=2, c=3"):
        unbiased_pass_at_k(2, 3, 1)

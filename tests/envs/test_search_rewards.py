"""QA exact match and F1 (SQuAD normalisation), hand-computed."""

from __future__ import annotations

import pytest

from mas_envs.rewards.qa import exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The  Eiffel-Tower!", "eiffeltower"),
        ("a cat", "cat"),
        ("An Apple, the pie", "apple pie"),
        ("theater", "theater"),  # articles only as whole words
        ("  Paris\n", "paris"),
        ("", ""),
    ],
)
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_issue_cases():
    assert exact_match("Paris", ["Paris"]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0
    assert f1_score("Paris, France", ["Paris"]) == pytest.approx(2 / 3)  # P = 1/2, R = 1, F1 = 2/3
    assert exact_match("", ["Paris"]) == 0.0
    assert exact_match(None, ["Paris"]) == 0.0
    assert exact_match("   ", [""]) == 0.0  # an empty answer never matches, not even an empty gold


def test_exact_match_any_gold_and_normalisation():
    assert exact_match("the paris", ["Lyon", "Paris"]) == 1.0
    assert exact_match("Paris.", "paris") == 1.0
    assert exact_match("Pariss", ["Paris"]) == 0.0
    assert exact_match("x", []) == 0.0 and f1_score("x", []) == 0.0  # reward functions never raise


def test_f1_hand_computed():
    # pred tokens [george, orwell, wrote, it]; gold [george, orwell]: common 2, P = 2/4, R = 2/2 -> F1 = 2/3
    assert f1_score("George Orwell wrote it", ["George Orwell"]) == pytest.approx(2 / 3)
    # best over golds: vs "Eric Arthur Blair" common 2, P = 2/2, R = 2/3 -> F1 = 0.8 (vs "George Orwell": 0)
    assert f1_score("Eric Blair", ["George Orwell", "Eric Arthur Blair"]) == pytest.approx(0.8)
    # tokens are a multiset: "new new york" vs "new york": common 2, P = 2/3, R = 2/2 -> F1 = 0.8
    assert f1_score("new new york", ["New York"]) == pytest.approx(0.8)
    assert f1_score("Lyon", ["Paris"]) == 0.0
    assert f1_score("", ["Paris"]) == 0.0
    assert f1_score("Paris", ["Paris"]) == 1.0

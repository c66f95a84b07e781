"""QA exact match and F1 (SQuAD normalisation), hand-computed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def test_answer_strings_normalises_gold_shapes():
    import numpy as np

    from mas_envs.rewards.qa import answer_strings

    assert answer_strings("Paris") == ["Paris"]
    assert answer_strings(["Paris", "Lyon"]) == ["Paris", "Lyon"]
    assert answer_strings(("Paris",)) == ["Paris"]
    assert answer_strings(5) == ["5"]
    assert answer_strings(5.0) == ["5"]  # an integral float is the integer a model would write
    assert answer_strings(2.5) == ["2.5"]
    assert answer_strings(np.array(["Paris", "Lyon"], dtype=object)) == ["Paris", "Lyon"]
    assert answer_strings(np.int64(7)) == ["7"]
    assert answer_strings([1, "x", None, "", "  ", float("nan"), True]) == ["1", "x"]
    assert answer_strings(None) == [] and answer_strings([]) == [] and answer_strings(True) == []
    assert answer_strings(b"Paris") == ["Paris"]
    from decimal import Decimal

    assert answer_strings(Decimal("12.50")) == ["12.5"] and answer_strings(3 + 0j) == []
    assert exact_match(Decimal("sNaN"), Decimal("sNaN")) == 0.0


@pytest.mark.parametrize(
    ("prediction", "golds", "em", "f1"),
    [
        (5, ["5"], 1.0, 1.0),  # a number as prediction is stringified
        ("5", 5, 1.0, 1.0),  # a number as gold too
        ("5", 5.0, 1.0, 1.0),
        ("Paris", "Paris", 1.0, 1.0),  # a single string gold
        ("Paris", None, 0.0, 0.0),  # no gold: 0, not TypeError
        (None, None, 0.0, 0.0),
        ("Paris", 3, 0.0, 0.0),
        # not an answer text: scores 0 (str(["Paris"]) would normalise to "paris" and match)
        (["Paris"], ["Paris"], 0.0, 0.0),
        (object(), ["Paris"], 0.0, 0.0),
        (b"Paris", ["Paris"], 1.0, 1.0),
    ],
)
def test_qa_rewards_are_total(prediction, golds, em, f1):
    assert exact_match(prediction, golds) == em
    assert f1_score(prediction, golds) == f1


_ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary() | st.decimals(),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(st.text(), inner),
    max_leaves=6,
)


@given(_ANY, _ANY)
def test_qa_rewards_never_raise(prediction, golds):
    assert exact_match(prediction, golds) in (0.0, 1.0)
    assert 0.0 <= f1_score(prediction, golds) <= 1.0

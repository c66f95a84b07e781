"""The tolerant move parser of the game envs (mas_envs.games.moves)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mas_envs.games.moves import parse_move, resolve_label

CELLS = tuple(str(n) for n in range(1, 10))
KUHN = ("check", "bet", "call", "fold")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<move>4</move>", "4"),
        ("<MOVE> 4 </Move>", "4"),
        ("I think the centre. <move>5</move>", "5"),
        ("<move>1</move> no wait <move>9</move>", "9"),  # the last tag counts
        ("<move>cell 7</move>", "7"),
        ("<move>5 (the centre)</move>", "5"),
        ("Let me take the corner.\n<move>3", "3"),  # generation stopped at </move>, stop string dropped
        ("\\boxed{6}", "6"),
        ("[2]", "2"),
        ("I play 4", "4"),
        ("I'll play 8.", "8"),
        ("position 4", "4"),
        ("Move: 4", "4"),
        ("My move is cell 3", "3"),
        ("I choose square #2", "2"),
        ("4", "4"),
        ("  '4'. ", "4"),
        ("**4**", "4"),
    ],
)
def test_cells(text, expected):
    assert parse_move(text, CELLS) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I don't know",
        "<move>hmm</move> I play 5",  # a tag that names nothing is no move; later rules are not tried
        "<move>4 or 5</move>",  # two labels in one tag: ambiguous
        "45",
        "I play 45",
        "cell 10",
        "<move></move>",
        "I think 3 is better than 5",
        "\x00\ud800",
    ],
)
def test_no_move(text):
    assert parse_move(text, CELLS) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<move>bet</move>", "bet"),
        ("<move>Call</move>", "call"),
        ("I bet", "bet"),
        ("I'll call.", "call"),
        ("I will fold", "fold"),
        ("check", "check"),
        ("\\boxed{fold}", "fold"),
        ("[check]", "check"),
        ("My action: bet", "bet"),
    ],
)
def test_kuhn_words(text, expected):
    assert parse_move(text, KUHN) == expected


def test_kuhn_words_need_a_clear_choice():
    assert parse_move("I would never fold here, but call is risky", KUHN) is None
    assert parse_move("bets", KUHN) is None  # whole words only
    assert parse_move("<move>call or fold</move>", KUHN) is None


def test_resolve_label_and_bad_input():
    assert resolve_label(" column 3 ", tuple("1234567")) == "3"
    assert resolve_label("nothing", CELLS) is None
    assert parse_move(None, CELLS) is None  # type: ignore[arg-type]
    assert parse_move("4", ()) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parse_move_never_raises_and_returns_a_label_or_none(text):
    for labels in (CELLS, KUHN):
        got = parse_move(text, labels)
        assert got is None or got in labels

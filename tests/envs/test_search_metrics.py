"""The search envs' episode metrics (`env/<name>` in training, `eval/env/<name>` in evaluation), exact on
scripted episodes: searches, evidence hit, the verifier's verdict accuracy, answer EM/F1, turns per agent."""

from __future__ import annotations

import pytest

from mas_envs.envs.search import KeywordRetriever, Passage
from mas_envs.envs.search.common import contains_answer
from mas_envs.envs.search.search_1agent import SearchOneAgentEnv
from mas_envs.envs.search.search_3agent import SearchThreeAgentEnv

PASSAGES = [
    Passage("c0", "Kelvor", '"Kelvor"\nKelvor is a city in Prenia.'),
    Passage("c1", "Dulmar", '"Dulmar"\nDulmar is a city in Ostavia.'),
    Passage("p0", "Tolu Marsk", '"Tolu Marsk"\nTolu Marsk was born in Kelvor. Tolu Marsk works as a cook.'),
]  # KeywordRetriever breaks ties by list order: "Kelvor" finds the city before the person
TWO_HOP = {"id": "t2", "question": "In which country was Tolu Marsk born?", "golden_answers": ["Prenia"]}
THINK = "<think>t</think>"
NO, YES = "<verify>no</verify>", "<verify>yes</verify>"


def _search(q):
    return f"{THINK}<search>{q}</search>"


def _answer(a):
    return f"{THINK}<answer>{a}</answer>"


def _three(actions, **kw):
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), topk=1, **kw)
    env.reset(options={"task": TWO_HOP})
    for a in actions:
        env.step(a)
    assert all(env.terminations.values())
    return env.infos["answerer"]["episode_metrics"]


def test_two_hop_found_verified_and_answered():
    # turn 1: no (no evidence yet: right), search "Tolu Marsk" -> p0 (names Kelvor, not the country)
    # turn 2: no (right), search "Kelvor" -> c0 (Prenia); turn 3: yes (right), answer "the Prenia" (EM 1)
    m = _three([NO, _search("Tolu Marsk"), NO, _search("Kelvor"), YES, _answer("the Prenia")], max_turns=4)
    assert m == {
        "searches": 2.0,
        "retrieval_errors": 0.0,
        "evidence_hit": 1.0,
        "answer_em": 1.0,
        "answer_f1": 1.0,
        "turns/verifier": 3.0,
        "turns/searcher": 2.0,
        "turns/answerer": 1.0,
        "verifier_accuracy": 1.0,
        "verifier_yes_rate": 1 / 3,
        "verifier_yes_turn1": 0.0,  # turn 1 said no
    }


def test_early_yes_is_a_wrong_verdict_and_a_wrong_search_is_no_evidence():
    # turn 1: no (right); search "Dulmar" -> c1 (Ostavia: no evidence); turn 2: yes without evidence (wrong);
    # the answer "Prenia Ostavia" shares one of two tokens with the gold: F1 = 2 * (1/2 * 1) / (1/2 + 1) = 2/3
    m = _three([NO, _search("Dulmar"), YES, _answer("Prenia Ostavia")], max_turns=4)
    assert m["verifier_accuracy"] == 0.5 and m["verifier_yes_rate"] == 0.5
    assert (m["searches"], m["evidence_hit"], m["answer_em"]) == (1.0, 0.0, 0.0)
    assert m["answer_f1"] == pytest.approx(2 / 3)
    assert (m["turns/verifier"], m["turns/searcher"], m["turns/answerer"]) == (2.0, 1.0, 1.0)


def test_no_after_the_evidence_arrived_is_wrong_and_invalid_verdicts_are_not_counted():
    # max_turns=3: turn 1 "maybe" (invalid: routed to the answerer) would end it, so: turn 1 no (right), search
    # "Kelvor" -> c0 (evidence); turn 2 no with the evidence in context (wrong), search with no query (invalid,
    # no search); turn 3 the answerer is forced and gives nothing gradable
    m = _three([NO, _search("Kelvor"), NO, "<think>t</think><search></search>", "no tags"], max_turns=3)
    assert (m["verifier_accuracy"], m["verifier_yes_rate"]) == (0.5, 0.0)
    assert (m["searches"], m["evidence_hit"], m["answer_em"], m["answer_f1"]) == (1.0, 1.0, 0.0, 0.0)
    assert (m["turns/verifier"], m["turns/searcher"], m["turns/answerer"]) == (2.0, 2.0, 1.0)
    only_invalid = _three(["maybe", _answer("Prenia")])
    assert "verifier_accuracy" not in only_invalid and "verifier_yes_rate" not in only_invalid
    assert (only_invalid["searches"], only_invalid["evidence_hit"], only_invalid["answer_em"]) == (
        0.0,
        0.0,
        1.0,
    )


def test_verifier_yes_turn1_is_the_turn_1_verdict_only():
    # yes before any search: 1 (then the answer ends it)
    assert _three([YES, _answer("Prenia")])["verifier_yes_turn1"] == 1.0
    # no on turn 1, yes on turn 2: 0 (only turn 1 counts)
    assert _three([NO, _search("Kelvor"), YES, _answer("Prenia")])["verifier_yes_turn1"] == 0.0
    # no verdict on turn 1 counts as not yes (it routes to the answerer, but is not a yes), and with
    # malformed_answer="continue" the turn-2 yes after the answer-less turn is not a turn-1 verdict either
    m = _three(["maybe", "no tags", YES, _answer("Prenia")], malformed_answer="continue")
    assert (m["verifier_yes_turn1"], m["verifier_yes_rate"], m["turns/answerer"]) == (0.0, 1.0, 2.0)
    # the verifier not asked on turn 1: absent (the trainer's mean is over the episodes that report it)
    m = _three([_search("Kelvor"), YES, _answer("Prenia")], first_turn="search")
    assert "verifier_yes_turn1" not in m and m["verifier_yes_rate"] == 1.0


def test_one_agent_metrics():
    env = SearchOneAgentEnv(retriever=KeywordRetriever(PASSAGES), topk=1, max_turns=4)
    env.reset(options={"task": TWO_HOP})
    for a in (_search("Tolu Marsk"), "no tags", _search("Kelvor"), _answer("Kelvor")):
        env.step(a)
    assert env.infos["agent"]["episode_metrics"] == {
        "searches": 2.0,
        "retrieval_errors": 0.0,
        "evidence_hit": 1.0,  # c0 says Prenia; the agent answered the city instead
        "answer_em": 0.0,
        "answer_f1": 0.0,
        "turns/agent": 4.0,
    }


def test_contains_answer_is_whole_word_and_normalised():
    p = [Passage("x", "X", '"X"\nThe Kelvorian army met in Kelvor-Ost.')]
    assert not contains_answer(p, ["Kelvo"])  # a word prefix is not the answer
    assert contains_answer(p, ["kelvorian army"])  # case-insensitive phrase
    assert contains_answer(p, ["Kelvorost"])  # SQuAD normalisation drops the hyphen on both sides
    assert not contains_answer(p, ["  ", "the"])  # blank after normalisation: never contained
    assert not contains_answer([], ["Kelvor"])

"""Role scores of the search envs (docs/envs.md "Role rewards"), hand-computed on scripted episodes: the
verifier's verdict against the evidence in context, the searcher's query by the new gold / answer passages it
found, the answerer's EM; the returns never see them."""

from __future__ import annotations

import pytest

from mas_envs.envs.search import KeywordRetriever, Passage
from mas_envs.envs.search.common import search_found_evidence
from mas_envs.envs.search.multihop import multihop_tasks, world_of
from mas_envs.envs.search.search_1agent import SearchOneAgentEnv
from mas_envs.envs.search.search_3agent import SearchThreeAgentEnv

PASSAGES = [
    Passage("c0", "Kelvor", '"Kelvor"\nKelvor is a city in Prenia.'),
    Passage("c1", "Dulmar", '"Dulmar"\nDulmar is a city in Ostavia.'),
    Passage("p0", "Tolu Marsk", '"Tolu Marsk"\nTolu Marsk was born in Kelvor. Tolu Marsk works as a cook.'),
]  # KeywordRetriever (topk=1) breaks ties by list order: "Kelvor" finds the city c0, not the person p0
# 2-hop: the bridge passage p0 names the city but not the answer; c0 holds the answer
TWO_HOP = {
    "id": "t2",
    "question": "In which country was Tolu Marsk born?",
    "golden_answers": ["Prenia"],
    "supporting_ids": ["p0", "c0"],
}
THINK = "<think>t</think>"
NO, YES = "<verify>no</verify>", "<verify>yes</verify>"


def _search(q):
    return f"{THINK}<search>{q}</search>"


def _answer(a):
    return f"{THINK}<answer>{a}</answer>"


def _play(env, task, actions):
    """Play the script; return (who acted per turn, the role scores, each agent's return, the final info)."""
    env.reset(options={"task": task})
    actors, returns = [], dict.fromkeys(env.possible_agents, 0.0)
    for a in actions:
        actors.append(env.agent_selection)
        env.step(a)
        for agent in env.agents:
            returns[agent] += env.rewards[agent]
    assert all(env.terminations.values()) or all(env.truncations.values())
    info = env.infos[env.possible_agents[0]]
    assert all(env.infos[a]["role_rewards"] == info["role_rewards"] for a in env.possible_agents)
    return actors, info["role_rewards"], returns, info


def _three(actions, task=TWO_HOP, retriever=None, **kw):
    env = SearchThreeAgentEnv(retriever=retriever or KeywordRetriever(PASSAGES), topk=1, **kw)
    return _play(env, task, actions)


V, S, A = "verifier", "searcher", "answerer"


def test_two_hop_every_turn_right_scores_one_and_the_returns_are_the_team_reward():
    # t0 no (no evidence: right); t1 "Tolu Marsk" -> p0, a gold passage without the answer (1); t2 no (the
    # evidence p0 lacks the answer: right); t3 "Kelvor" -> c0, new and holds "Prenia" (1); t4 yes (right); t5 EM 1
    actors, role, returns, info = _three(
        [NO, _search("Tolu Marsk"), NO, _search("Kelvor"), YES, _answer("the Prenia")]
    )
    assert actors == [V, S, V, S, V, A]
    assert role == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}
    assert returns == {V: 1.0, S: 1.0, A: 1.0}
    assert info["episode_metrics"]["verifier_accuracy"] == 1.0


def test_the_bridge_passage_counts_only_through_supporting_ids():
    task = {k: v for k, v in TWO_HOP.items() if k != "supporting_ids"}
    _, role, _, _ = _three([NO, _search("Tolu Marsk"), NO, _search("Kelvor"), YES, _answer("Prenia")], task)
    # p0 holds no answer and is not known to be gold
    assert role == {0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}
    # supporting_titles guard the ids: the id p0 under another title is not the gold passage
    other = {**TWO_HOP, "supporting_titles": ["Someone Else", "Kelvor"]}
    _, role, _, _ = _three([NO, _search("Tolu Marsk"), YES, _answer("Prenia")], other)
    assert role[1] == 0.0
    same = {**TWO_HOP, "supporting_titles": ["Tolu Marsk", "Kelvor"]}
    _, role, _, _ = _three([NO, _search("Tolu Marsk"), YES, _answer("Prenia")], same)
    assert role[1] == 1.0


@pytest.mark.parametrize(
    ("actions", "turn", "score"),
    [
        ([NO, _search("Dulmar"), NO, _search("Kelvor"), YES, _answer("Prenia")], 0, 1.0),  # no, no evidence
        ([YES, _answer("Prenia")], 0, 0.0),  # yes without evidence
        ([NO, _search("Kelvor"), NO, _search("Dulmar"), YES, _answer("Prenia")], 2, 0.0),  # no with evidence
        ([NO, _search("Kelvor"), YES, _answer("Prenia")], 2, 1.0),  # yes with evidence
        (["<verify>maybe</verify>", _answer("Prenia")], 0, 0.0),  # no verdict: invalid, 0
        (["I think so.", _answer("Prenia")], 0, 0.0),  # no verify tag at all
    ],
)
def test_verifier_role_score_is_its_verdict_against_the_evidence_in_context(actions, turn, score):
    actors, role, _, _ = _three(actions)
    assert actors[turn] == V and role[turn] == score


def test_searcher_hit_miss_repeat_error_and_no_search():
    # t1 "Dulmar" -> c1: no answer, not gold (0); t3 "Kelvor" -> c0 (1); t5 "Kelvor" again -> c0, not new (0)
    _, role, _, _ = _three(
        [NO, _search("Dulmar"), NO, _search("Kelvor"), NO, _search("Kelvor"), YES, _answer("Prenia")],
        max_turns=5,
    )
    assert [role[t] for t in (1, 3, 5)] == [0.0, 1.0, 0.0]
    # a search that ran despite a format fault (no <think>) is scored by what it found; the format costs c
    _, role, returns, _ = _three([NO, "<search>Kelvor</search>", YES, _answer("Prenia")])
    assert role[1] == 1.0 and returns[S] == pytest.approx(1.0 - 0.01)
    # an empty query runs no search: 0; the answerer's reply without an answer tag: 0 (R = 0 too)
    actions = [NO, f"{THINK}<search></search>", NO, _search("Dulmar"), "no tags"]
    actors, role, returns, _ = _three(actions, max_turns=3)
    assert actors == [V, S, V, S, A]
    assert role == {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 0.0}
    assert returns == {V: 0.0, S: -0.01, A: -0.01}

    class Broken:
        def search(self, queries, topk):
            raise ConnectionError("down")

    _, role, _, _ = _three([NO, _search("Kelvor"), YES, _answer("Prenia")], retriever=Broken())
    assert role == {0: 1.0, 1: 0.0, 2: 0.0, 3: 1.0}  # the failed search found nothing; yes without evidence


def test_answerer_role_score_is_its_em_and_a_late_no_leaves_no_answer_turn():
    _, role, _, info = _three([YES, _answer("Prenia Ostavia")])
    assert role[1] == 0.0 and info["f1"] == pytest.approx(2 / 3)  # partial F1 is not EM
    _, role, _, _ = _three([YES, "<answer>the prenia</answer>"])  # no <think>: invalid, but EM 1 (as R)
    assert role[1] == 1.0
    # last_turn="verify": no on the last turn ends without an answer; that no (no evidence) is right
    actors, role, returns, _ = _three([NO, _search("Dulmar"), NO], max_turns=2, last_turn="verify")
    assert actors == [V, S, V]
    assert role == {0: 1.0, 1: 0.0, 2: 1.0}
    assert returns == {V: 0.0, S: 0.0, A: 0.0}


def test_verifier_role_scores_average_to_the_verifier_accuracy_metric():
    actions = [NO, _search("Kelvor"), NO, _search("Dulmar"), "<verify>?</verify>", _answer("Prenia")]
    actors, role, _, info = _three(actions)
    valid = [role[t] for t, who in enumerate(actors) if who == V and "?" not in actions[t]]
    assert valid == [1.0, 0.0]
    assert info["episode_metrics"]["verifier_accuracy"] == sum(valid) / len(valid) == 0.5


def test_search_1agent_scores_searches_by_the_searcher_rule_and_the_answer_by_em():
    env = SearchOneAgentEnv(retriever=KeywordRetriever(PASSAGES), topk=1, max_turns=4)
    _, role, returns, _ = _play(env, TWO_HOP, [_search("Tolu Marsk"), _search("Kelvor"), _answer("Prenia")])
    assert role == {0: 1.0, 1: 1.0, 2: 1.0} and returns == {"agent": 1.0}
    _, role, returns, _ = _play(
        env, TWO_HOP, ["just text", _search("Kelvor"), _search("Kelvor"), _answer("x")]
    )
    assert role == {0: 0.0, 1: 1.0, 2: 0.0, 3: 0.0}
    assert returns == {"agent": pytest.approx(-0.01)}


def test_multihop_world_rows_score_the_bridge_and_the_answer_search():
    spec = "multihop?seed=0&split=train"
    world = world_of(spec)
    passages = [Passage(r["id"], r["title"], r["contents"]) for r in world.passages()]
    rows = multihop_tasks(spec)
    two = next(r for r in rows if r["hops"] == 2)
    one = next(r for r in rows if r["hops"] == 1)
    for row in (two, one):
        person, city = world.people[int(row["id"].rsplit("/", 1)[1])]
        city_name = world.cities[city][0]
        actions = [NO, _search(person), NO, _search(f"{city_name} is a city in"), YES]
        actions.append(_answer(row["golden_answers"][0]))
        actors, role, returns, _ = _three(actions, row, KeywordRetriever(passages), max_turns=4)
        assert actors == [V, S, V, S, V, A]
        if row["hops"] == 2:  # the person's passage is the bridge (gold, no answer); the city's holds it
            assert role == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}
        else:  # the person's passage holds the answer (the city): no after it is wrong; the city's passage
            # names the city too, so it is new evidence holding the answer
            assert role == {0: 1.0, 1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0, 5: 1.0}
        assert returns == {V: 1.0, S: 1.0, A: 1.0}


def test_search_found_evidence_rule():
    gold, city = PASSAGES[2], PASSAGES[0]
    assert search_found_evidence([gold], [], TWO_HOP)
    assert not search_found_evidence([gold], [gold], TWO_HOP)
    assert search_found_evidence([gold, city], [gold], TWO_HOP)  # one new useful passage is enough
    assert not search_found_evidence([], [], TWO_HOP)
    assert not search_found_evidence([PASSAGES[1]], [], TWO_HOP)


@pytest.mark.parametrize(
    ("actions", "team", "role"),
    [
        (
            [NO, _search("Tolu Marsk"), NO, _search("Kelvor"), YES, _answer("Prenia")],
            1.0,
            {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0},
        ),
        ([NO, _search("Dulmar"), YES, _answer("Prenia Ostavia")], 0.0, {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}),
        (
            [NO, _search("Kelvor"), NO, _search("Kelvor"), YES, _answer("Prenia")],
            1.0,
            {0: 1.0, 1: 1.0, 2: 0.0, 3: 0.0, 4: 1.0, 5: 1.0},
        ),
        (["maybe", _answer("Prenia")], 1.0, {0: 0.0, 1: 1.0}),
    ],
)
def test_the_docs_table_of_search_role_scores(actions, team, role):
    """The rows of docs/envs.md's search role-score table, as written there."""
    _, got, _, info = _three(actions)
    assert (info["team_reward"], got) == (team, role)

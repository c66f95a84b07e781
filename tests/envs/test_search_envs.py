"""search-3agent and search-1agent with small in-memory retrievers: conformance, rules, prompts, errors."""

from __future__ import annotations

import pickle
from functools import partial

import pytest

import mas_envs
from mas_envs.envs.search import KeywordRetriever, Passage
from mas_envs.envs.search.search_1agent import SearchOneAgentEnv
from mas_envs.envs.search.search_3agent import SearchThreeAgentEnv
from mas_envs.testing import check_env

PASSAGES = [
    Passage("p1", "Ulaanbaatar", '"Ulaanbaatar"\nUlaanbaatar is the capital of Mongolia.'),
    Passage("p2", "Paris", '"Paris"\nParis is the capital of France.'),
]
TASK = {
    "id": "t1",
    "question": "What is the capital of Mongolia?",
    "golden_answers": ["Ulaanbaatar"],
    "data_source": "test",
}
THINK = "<think>reasoning</think>"


class RecordingRetriever(KeywordRetriever):
    def __init__(self):
        super().__init__(PASSAGES)
        self.queries: list[str] = []

    def search(self, queries, topk):
        self.queries.extend(queries)
        return super().search(queries, topk)


class BrokenRetriever:
    def search(self, queries, topk):
        raise ConnectionError("retriever down")


def play(env, actions):
    """Step the scripted actions; return the agents that acted and each agent's summed rewards."""
    actors, returns = [], dict.fromkeys(env.possible_agents, 0.0)
    for action in actions:
        actors.append(env.agent_selection)
        env.step(action)
        for a in env.agents:
            returns[a] += env.rewards[a]
    return actors, returns


@pytest.mark.parametrize("env_id", ["search-3agent", "search-1agent"])
def test_check_env_with_keyword_retriever(env_id):
    report = check_env(
        partial(mas_envs.make, env_id, retriever=KeywordRetriever(PASSAGES)), fuzz_episodes=100
    )
    assert report.random_episodes == 100 and report.random_actions > 100
    assert len(report.golden_episodes) >= 2


def test_registered_and_newest_version():
    env = mas_envs.make("search-3agent")
    assert isinstance(env.unwrapped, SearchThreeAgentEnv)
    assert env.unwrapped.invalid_action_penalty == 0.01
    assert env.unwrapped.stop_strings == {
        "verifier": ("</verify>",),
        "searcher": ("</search>",),
        "answerer": ("</answer>",),
    }
    assert isinstance(mas_envs.make("search-1agent").unwrapped, SearchOneAgentEnv)


def test_searcher_first_action_tag_wins():
    retriever = RecordingRetriever()
    env = SearchThreeAgentEnv(retriever=retriever)
    env.reset(options={"task": TASK})
    actors, returns = play(
        env, ["<verify>no</verify>", f"{THINK}<search>q capital Mongolia</search> <answer>x</answer>"]
    )
    assert actors == ["verifier", "searcher"]
    assert retriever.queries == ["q capital Mongolia"]
    assert env.infos["searcher"]["invalid_action"] is True  # two different action tags
    assert returns["searcher"] == pytest.approx(-0.01)
    assert env.agent_selection == "verifier"
    assert (
        "Turn 1: <search>q capital Mongolia</search>\n<information>Doc 1(Title: Ulaanbaatar)"
        in env.observe("verifier")
    )


@pytest.mark.parametrize(
    ("answer", "reward", "f1"),
    [
        (f"{THINK}<answer>Paris</answer> no wait <answer>Ulaanbaatar</answer>", 1.0, 1.0),
        (f"{THINK}<answer>Ulaanbaatar</answer> no wait <answer>Ulaanbaatar, Mongolia</answer>", 0.0, 2 / 3),
    ],
)
def test_two_answer_blocks_last_counts(answer, reward, f1):
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES))
    env.reset(options={"task": TASK})
    play(env, ["<verify>yes</verify>", answer])
    info = env.infos["answerer"]
    assert (info["team_reward"], info["success"], info["invalid_action"]) == (reward, reward == 1.0, False)
    assert info["f1"] == pytest.approx(f1)
    assert env.terminations == dict.fromkeys(env.possible_agents, True)


def test_last_turn_answer_mode_skips_the_verifier():
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), max_turns=2)
    env.reset(options={"task": TASK})
    actors, returns = play(
        env,
        [
            "<verify>no</verify>",
            f"{THINK}<search>Mongolia capital</search>",
            f"{THINK}<answer>Ulaanbaatar</answer>",
        ],
    )
    assert actors == ["verifier", "searcher", "answerer"]
    assert returns == {"verifier": 1.0, "searcher": 1.0, "answerer": 1.0}
    assert env.infos["answerer"]["num_searches"] == 1
    # with max_turns=1 the answerer opens the episode
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), max_turns=1)
    env.reset(options={"task": TASK})
    assert env.agent_selection == "answerer"


def test_first_turn_search_mode_starts_with_the_searcher():
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), max_turns=3, first_turn="search")
    env.reset(options={"task": TASK})
    assert env.agent_selection == "searcher"
    actors, returns = play(
        env,
        [
            f"{THINK}<search>Paris</search>",
            "Doc 1 is about Paris. <verify>no</verify>",
            f"{THINK}<search>Mongolia capital</search>",
            f"{THINK}<answer>Ulaanbaatar</answer>",
        ],
    )
    # turn 1: search (no verdict before evidence); turn 2: no -> search; turn 3 is the last: the answerer
    assert actors == ["searcher", "verifier", "searcher", "answerer"]
    assert returns == {"verifier": 1.0, "searcher": 1.0, "answerer": 1.0}
    assert env.infos["answerer"]["num_searches"] == 2
    assert env.infos["answerer"]["episode_metrics"]["turns/verifier"] == 1
    # a yes after the first search answers at once
    env.reset(options={"task": TASK})
    actors, _ = play(
        env,
        [f"{THINK}<search>Mongolia</search>", "<verify>yes</verify>", f"{THINK}<answer>Ulaanbaatar</answer>"],
    )
    assert actors == ["searcher", "verifier", "answerer"]
    with pytest.raises(ValueError, match="first_turn must be 'verify' or 'search'"):
        SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), first_turn="answer")


def test_last_turn_verify_mode_late_no_is_worth_zero():
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), max_turns=2, last_turn="verify")
    env.reset(options={"task": TASK})
    actors, returns = play(
        env, ["<verify>no</verify>", f"{THINK}<search>Mongolia</search>", "Still unsure. <verify>no</verify>"]
    )
    assert actors == ["verifier", "searcher", "verifier"]
    assert returns == {"verifier": 0.0, "searcher": 0.0, "answerer": 0.0}
    assert env.terminations["answerer"] and env.infos["answerer"]["answer"] is None


def test_malformed_answer_end_or_continue():
    # the default ends the episode on an answer-less reply, R = 0
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES))
    env.reset(options={"task": TASK})
    actors, returns = play(env, ["<verify>yes</verify>", "Ulaanbaatar"])
    assert actors == ["verifier", "answerer"] and all(env.terminations.values())
    assert returns == {"verifier": 0.0, "searcher": 0.0, "answerer": -0.01}
    # continue: the next turn starts with the verifier, and the searched evidence answers
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), max_turns=3, malformed_answer="continue")
    env.reset(options={"task": TASK})
    turn_1 = env.observe("verifier")
    play(env, ["<verify>yes</verify>", f"{THINK}<search>Mongolia</search>"])  # a search is not an answer
    assert env.agent_selection == "verifier" and not any(env.terminations.values())
    assert env.infos["answerer"]["invalid_action"] is True
    # the verifier sees what it saw on turn 1, one turn later: the answer-less turn adds nothing to the history
    assert "Search history: none yet." in turn_1
    assert env.observe("verifier") == turn_1.replace("This is turn 1 of 3.", "This is turn 2 of 3.")
    # turn 2: no -> search; turn 3 is the last (last_turn="answer"): the answerer answers
    actors, returns = play(
        env,
        [
            "<verify>no</verify>",
            f"{THINK}<search>capital of Mongolia</search>",
            f"{THINK}<answer>Ulaanbaatar</answer>",
        ],
    )
    assert actors == ["verifier", "searcher", "answerer"]
    assert returns == {
        "verifier": 1.0,
        "searcher": 1.0,
        "answerer": 1.0,
    }  # the turn-1 -c came in an earlier step
    assert env.infos["answerer"]["num_searches"] == 1  # the answer-less turn is no search
    # on the last turn an answer-less reply ends the episode (no turn left), R = 0, even with continue
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), max_turns=1, malformed_answer="continue")
    env.reset(options={"task": TASK})
    actors, returns = play(env, ["no tags"])
    assert actors == ["answerer"] and all(env.terminations.values())
    assert env.infos["answerer"]["team_reward"] == 0.0 and env.infos["answerer"]["answer"] is None
    with pytest.raises(ValueError, match="malformed_answer must be 'end' or 'continue', got 'retry'"):
        SearchThreeAgentEnv(malformed_answer="retry")


def test_verify_mode_prompt_warns_on_the_last_turn():
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES), max_turns=2, last_turn="verify")
    env.reset(options={"task": TASK})
    assert "If you answer no now" not in env.observe("verifier")
    play(env, ["<verify>no</verify>", f"{THINK}<search>Mongolia</search>"])
    assert "This is turn 2 of 2. If you answer no now, the team gives no answer." in env.observe("verifier")


def test_retriever_error_is_an_observation_and_the_episode_goes_on():
    env = SearchThreeAgentEnv(retriever=BrokenRetriever())
    env.reset(options={"task": TASK})
    play(env, ["<verify>no</verify>", f"{THINK}<search>Mongolia</search>"])
    assert env.infos["searcher"]["invalid_action"] is False  # the searcher did nothing wrong
    assert "<information>Search error: ConnectionError: retriever down</information>" in env.observe(
        "verifier"
    )
    play(env, ["<verify>yes</verify>", f"{THINK}<answer>Ulaanbaatar</answer>"])
    assert env.infos["verifier"]["team_reward"] == 1.0


def test_remote_retriever_to_a_dead_server_becomes_an_error_observation():
    import socket

    from retrieval_index.client import RemoteRetriever

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/retrieve"
    env = SearchOneAgentEnv(retriever=RemoteRetriever(url, timeout=2, max_retries=1, backoff=0.01))
    env.reset(options={"task": TASK})
    env.step(f"{THINK}<search>Mongolia</search>")
    obs = env.observe("agent")
    assert "<information>Search error: RetrieverUnavailableError: retrieval failed after 2 attempts" in obs
    assert env.agent_selection == "agent" and not env.truncations["agent"]
    copy = pickle.loads(pickle.dumps(env))  # the HTTP client is rebuilt on unpickling
    copy.retriever.close()
    env.retriever.close()


def test_prompts_what_each_agent_sees():
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES))
    env.reset(options={"task": TASK})
    verifier_msgs = env.infos["verifier"]["messages"]
    assert [m["role"] for m in verifier_msgs] == ["system", "user"]
    assert (
        "Question: What is the capital of Mongolia?\n\nSearch history: none yet."
        in verifier_msgs[1]["content"]
    )
    assert "This is turn 1 of 4." in env.observe("verifier")
    play(env, ["I lack evidence about Mongolia. <verify>no</verify>"])
    assert "The Verifier's assessment this turn:\nI lack evidence about Mongolia." in env.observe("searcher")
    play(env, [f"{THINK}<search>capital of Mongolia</search>", "<verify>yes</verify>"])
    answerer_obs = env.observe("answerer")
    assert "<information>Doc 1(Title: Ulaanbaatar) Ulaanbaatar is the capital of Mongolia.\n" in answerer_obs
    assert "I lack evidence" not in answerer_obs  # the answerer does not see the verifier's reasoning
    assert env.infos["verifier"]["messages"][1]["content"].count("<information>") == 1


def test_searcher_without_a_query_runs_no_search():
    retriever = RecordingRetriever()
    env = SearchThreeAgentEnv(retriever=retriever)
    env.reset(options={"task": TASK})
    play(env, ["<verify>no</verify>", f"{THINK}<answer>Ulaanbaatar</answer>"])
    assert retriever.queries == [] and env.infos["searcher"]["invalid_action"] is True
    assert "No search was run: <answer> is not this agent's action." in env.observe("verifier")
    play(env, ["<verify>yes</verify>", f"{THINK}<answer>Ulaanbaatar</answer>"])
    assert env.infos["answerer"]["num_searches"] == 0


def test_one_agent_format_reminder_truncation_and_transcript_order():
    env = SearchOneAgentEnv(retriever=KeywordRetriever(PASSAGES), max_turns=3, render_mode="ansi")
    env.reset(options={"task": TASK})
    actors, returns = play(env, ["just text", f"{THINK}<search>capital of Mongolia</search>"])
    assert "My previous action is invalid." in env.observe("agent")
    assert "This is turn 3 of 3. It is your last turn: answer now" in env.observe("agent")
    play(env, [f"{THINK}<search>again</search>"])
    assert env.truncations["agent"] and env.infos["agent"]["team_reward"] == 0.0
    text = env.render()
    # the passages come after the search that retrieved them
    assert text.index("<search>capital of Mongolia</search>") < text.index(
        "<information>Doc 1(Title: Ulaanbaatar)"
    )


def test_one_agent_answer_after_search():
    env = SearchOneAgentEnv(retriever=KeywordRetriever(PASSAGES))
    env.reset(options={"task": TASK})
    play(env, [f"{THINK}<search>capital of Mongolia</search>", f"{THINK}<answer>ulaanbaatar.</answer>"])
    info = env.infos["agent"]
    assert (info["team_reward"], info["success"], info["num_searches"], info["answer"]) == (
        1.0,
        True,
        1,
        "ulaanbaatar.",
    )


def test_constructor_errors():
    with pytest.raises(ValueError, match="last_turn must be 'answer' or 'verify'"):
        SearchThreeAgentEnv(last_turn="never")
    with pytest.raises(ValueError, match="topk must be >= 1"):
        SearchOneAgentEnv(topk=0)
    with pytest.raises(TypeError, match="search\\(queries, topk\\)"):
        SearchThreeAgentEnv(retriever=42)


def test_answer_field_instead_of_golden_answers():
    env = SearchThreeAgentEnv(retriever=KeywordRetriever(PASSAGES))
    env.reset(options={"task": {"question": "Capital of France?", "answer": "Paris"}})
    play(env, ["<verify>yes</verify>", f"{THINK}<answer>paris</answer>"])
    assert env.infos["answerer"]["team_reward"] == 1.0


@pytest.mark.parametrize(
    ("gold_fields", "answer", "golds"),
    [
        ({"answer": 5}, "5", ["5"]),
        ({"answer": 5.0}, "5", ["5"]),
        ({"golden_answers": [1912, "nineteen twelve"]}, "nineteen twelve", ["1912", "nineteen twelve"]),
        ({"golden_answers": ("Paris",)}, "Paris", ["Paris"]),
        ({"golden_answers": [], "answer": "Paris"}, "Paris", ["Paris"]),  # empty list: fall back to answer
        (
            {"golden_answers": None, "answer": ["Paris", "City of Light"]},
            "city of light",
            ["Paris", "City of Light"],
        ),
    ],
)
@pytest.mark.parametrize("env_cls", [SearchOneAgentEnv, SearchThreeAgentEnv])
def test_gold_answer_shapes_are_graded(env_cls, gold_fields, answer, golds):
    from mas_envs.envs.search.common import golden_answers_of

    task = {"id": "g", "question": "Q?", **gold_fields}
    assert golden_answers_of(task) == golds
    env = env_cls(retriever=KeywordRetriever(PASSAGES), max_turns=1)
    env.reset(options={"task": task})  # max_turns=1: the 3-agent env goes straight to the answerer
    env.step(f"{THINK}<answer>{answer}</answer>")
    info = env.infos[env.possible_agents[-1]]
    assert (info["team_reward"], info["success"], info["f1"]) == (1.0, True, 1.0)


def test_gold_answers_from_a_numpy_array():
    import numpy as np

    from mas_envs.envs.search.common import golden_answers_of

    assert golden_answers_of({"golden_answers": np.array(["Paris", "Lyon"], dtype=object)}) == [
        "Paris",
        "Lyon",
    ]
    assert golden_answers_of({"golden_answers": np.array([3, 4])}) == ["3", "4"]


@pytest.mark.parametrize(
    "gold_fields",
    [
        {},
        {"golden_answers": []},
        {"answer": None},
        {"answer": "  "},
        {"golden_answers": [None, ""]},
        {"answer": True},
    ],
)
@pytest.mark.parametrize("env_cls", [SearchOneAgentEnv, SearchThreeAgentEnv])
def test_task_without_a_usable_gold_answer_fails_at_reset(env_cls, gold_fields):
    env = env_cls(retriever=KeywordRetriever(PASSAGES))
    with pytest.raises(ValueError, match=r"task 'bad' has no usable gold answer: give it a non-empty"):
        env.reset(options={"task": {"id": "bad", "question": "Q?", **gold_fields}})


MB = 1 << 20


@pytest.mark.timeout(20)  # before the linear tag scan this step took ~25 min
def test_megabyte_replies_step_quickly_and_queries_are_capped():
    from mas_envs.envs.search.common import MAX_QUERY_CHARS

    assert MAX_QUERY_CHARS == 512
    retriever = RecordingRetriever()
    env = SearchThreeAgentEnv(retriever=retriever)
    env.reset(options={"task": TASK})
    word = "Mongolia "  # 9 characters
    play(env, ["<verify>no</verify>", f"{THINK}<search>{word * (MB // 9)}</search>"])
    # the query is cut to its first 512 characters: 56 words with their spaces (504) + "Mongolia" (8)
    expected = word * 56 + "Mongolia"
    assert len(expected) == 512
    assert retriever.queries == [expected]
    assert env.history[0][0] == expected  # what the agents see is what was searched
    assert env.infos["searcher"]["invalid_action"] is False
    env.step("<verify>" * (MB // 8))  # no complete verdict: invalid, routed to the answerer
    assert env.agent_selection == "answerer"
    env.step(THINK + "<answer>" * (MB // 8))
    info = env.infos["answerer"]
    assert (info["answer"], info["team_reward"], info["invalid_action"]) == (None, 0.0, True)

    one = SearchOneAgentEnv(retriever=retriever)
    one.reset(options={"task": TASK})
    one.step(f"{THINK}<search>{'x' * MB}</search>")
    assert retriever.queries[-1] == "x" * 512
    assert one.infos["agent"]["invalid_action"] is False

"""Retriever failures are counted per episode as the `retrieval_errors` env metric (issue 9, item 12).

Before: a failed search became an observation and nothing else, so a dead retriever showed only in
transcripts; `infos[agent]["episode_metrics"]` of the search envs was empty.
"""

from __future__ import annotations

import pytest

from mas_envs.envs.search import KeywordRetriever, Passage
from mas_envs.envs.search.search_1agent import SearchOneAgentEnv
from mas_envs.envs.search.search_3agent import SearchThreeAgentEnv

PASSAGES = [Passage("p1", "Ulaanbaatar", '"Ulaanbaatar"\nUlaanbaatar is the capital of Mongolia.')]
TASK = {"id": "t1", "question": "What is the capital of Mongolia?", "golden_answers": ["Ulaanbaatar"]}
THINK = "<think>r</think>"


class FlakyRetriever(KeywordRetriever):
    """Fails the calls whose 0-based number is in `fail_calls`, answers the others."""

    def __init__(self, fail_calls):
        super().__init__(PASSAGES)
        self.fail_calls, self.calls = set(fail_calls), 0

    def search(self, queries, topk):
        self.calls += 1
        if self.calls - 1 in self.fail_calls:
            raise ConnectionError("retriever down")
        return super().search(queries, topk)


def _play(env, actions):
    for action in actions:
        env.step(action)


def test_three_agent_episode_counts_its_failed_searches_and_the_next_starts_at_zero():
    env = SearchThreeAgentEnv(retriever=FlakyRetriever({0, 2}), max_turns=5)
    env.reset(options={"task": TASK})
    search = f"{THINK}<search>Mongolia</search>"
    no = "<verify>no</verify>"
    _play(env, [no, search, no, search, no, search])  # calls 0 (fails), 1 (answers), 2 (fails)
    assert "episode_metrics" not in env.infos["verifier"]  # only at the end
    _play(env, ["<verify>yes</verify>", f"{THINK}<answer>Ulaanbaatar</answer>"])
    for agent in ("verifier", "searcher", "answerer"):
        assert env.infos[agent]["episode_metrics"]["retrieval_errors"] == 2.0
    assert env.infos["verifier"]["team_reward"] == 1.0  # the failures cost nothing by themselves

    env.reset(options={"task": TASK})
    _play(env, [no, search, "<verify>yes</verify>", f"{THINK}<answer>x</answer>"])  # call 3 answers
    assert env.infos["answerer"]["episode_metrics"]["retrieval_errors"] == 0.0


@pytest.mark.parametrize("truncated", [False, True])
def test_one_agent_counts_failed_searches_whether_it_answers_or_runs_out(truncated):
    env = SearchOneAgentEnv(retriever=FlakyRetriever({0, 1, 2}), max_turns=3)
    env.reset(options={"task": TASK})
    search = f"{THINK}<search>Mongolia</search>"
    last = search if truncated else f"{THINK}<answer>Ulaanbaatar</answer>"
    _play(env, [search, search, last])
    assert env.truncations["agent"] is truncated
    assert env.infos["agent"]["episode_metrics"]["retrieval_errors"] == (3.0 if truncated else 2.0)


def test_a_dead_server_url_is_counted():
    import socket

    from retrieval_index.client import RemoteRetriever

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/retrieve"
    with RemoteRetriever(url, timeout=2, max_retries=0, backoff=0) as remote:
        env = SearchOneAgentEnv(retriever=remote)
        env.reset(options={"task": TASK})
        _play(env, [f"{THINK}<search>Mongolia</search>", f"{THINK}<answer>Ulaanbaatar</answer>"])
    assert env.infos["agent"]["episode_metrics"]["retrieval_errors"] == 1.0

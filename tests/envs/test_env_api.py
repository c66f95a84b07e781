"""The public env hooks and the one default-task mechanism."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import mas_envs
from mas_envs.core import Outcome, TextAECEnv, Transition
from mas_envs.envs.math.math_1agent import MathOneAgentEnv
from mas_envs.envs.math.math_2agent import MathTwoAgentEnv
from mas_envs.envs.search.search_1agent import SearchOneAgentEnv
from mas_envs.envs.search.search_3agent import SearchThreeAgentEnv

TASK = {"question": "say 3", "answer": "3", "id": "t/0"}


def _play(env, actions):
    returns, it = dict.fromkeys(env.possible_agents, 0.0), iter(actions)
    env.reset(options={"task": TASK})
    for agent in env.agent_iter():
        _, r, term, trunc, _ = env.last()
        returns[agent] += r
        env.step(None if term or trunc else next(it))
    return returns


class NewEnv(TextAECEnv):
    """One agent says a number once; R = 1 when it is the answer. Uses only the public hooks."""

    metadata = {"name": "say-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("a",)

    def start_episode(self, task: dict[str, Any]) -> str:
        self.said = None
        return "a"

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.task["question"]}]

    def apply_action(self, agent: str, action: str) -> Transition:
        self.said = action.strip()
        self.add_note(f"heard {self.said}")
        return Transition(invalid=not self.said.isdecimal(), next_agent=None)

    def episode_outcome(self) -> Outcome:
        return Outcome(float(self.said == self.task["answer"]), self.said == self.task["answer"])


def test_public_hooks_define_an_env_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = NewEnv()
        assert _play(env, ["3"]) == {"a": 1.0}
        assert [(e.speaker, e.text) for e in env.transcript] == [("env", "heard 3"), ("a", "3")]
        assert env.observe("a") == "say 3"


def test_a_missing_hook_is_a_clear_error():
    class NoHooks(TextAECEnv):
        possible_agents = ("a",)

    with pytest.raises(NotImplementedError, match="NoHooks must implement start_episode"):
        NoHooks().reset(options={"task": TASK})


def test_default_task_mechanism_of_the_built_in_envs():
    assert MathTwoAgentEnv.default_tasks == MathOneAgentEnv.default_tasks == "gsm8k-train"
    assert MathTwoAgentEnv.eval_task_source() == MathOneAgentEnv.eval_task_source() == "gsm8k-test"
    assert SearchOneAgentEnv.default_tasks == SearchThreeAgentEnv.default_tasks == "hotpotqa"
    assert SearchOneAgentEnv.eval_task_source() == SearchThreeAgentEnv.eval_task_source() == "hotpotqa-dev"
    # the search envs' own task list is the bundled HotpotQA train split, loaded lazily by name
    env = mas_envs.make("search-1agent", **SearchOneAgentEnv.conformance_kwargs())
    assert len(env.unwrapped.tasks) == 100
    assert env.unwrapped.tasks[0]["data_source"] == "hotpotqa"


def test_eval_task_source_prefers_default_eval_tasks_and_is_none_without_a_twin():
    class WithEval(NewEnv):
        default_tasks = "rg:basic_arithmetic?seed=1"
        default_eval_tasks = "rg:basic_arithmetic?seed=2"

    class NoTwin(NewEnv):
        default_tasks = "my_tasks-train"  # not bundled: no test twin to guess

    assert WithEval.eval_task_source() == "rg:basic_arithmetic?seed=2"
    assert NoTwin.eval_task_source() is None
    assert NewEnv.eval_task_source() is None


def test_math_helpers_have_their_own_module():
    from mas_envs.envs.math import common

    assert common.solver_action_is_valid("so \\boxed{4}") is True
    assert common.solver_action_is_valid("<think>\\boxed{4}</think> four") is False
    assert common.gold_of({"golden_answers": ["7"]}) == ["7"]
    with pytest.raises(ValueError, match="has no gold answer"):
        common.require_gold({"question": "q", "answer": "  "})
    assert common.grade_solution("\\boxed{18}", {"answer": "18"}) is True
    assert common.grade_solution(None, {"answer": "18"}) is False


class InfMetric(NewEnv):
    def episode_outcome(self) -> Outcome:
        return Outcome(0.0, False, metrics={"score": float("inf")})


def test_check_env_checks_the_episode_metrics_contract():
    from mas_envs.testing import check_env

    with pytest.raises(AssertionError, match=r"\['episode_metrics'\] must be a dict of str -> finite float"):
        check_env(lambda **kw: InfMetric(**{"tasks": [TASK], **kw}), fuzz_episodes=5)

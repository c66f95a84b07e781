"""Role rewards in the env contract: `Outcome.role_rewards` reaches infos and the transcript, never the returns;
the base class and `check_env` refuse malformed ones; math-2agent scores each turn by its role."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mas_envs.core import Outcome, TextAECEnv, Transition
from mas_envs.envs.math.math_2agent import MathTwoAgentEnv
from mas_envs.testing import check_env, play_golden_episode

TASK = {"question": "say 3", "answer": "3", "id": "t/0"}


class SayEnv(TextAECEnv):
    """Agent a says a number, then agent b says one; R = 1 when a said the answer. b's role score: 0.25 if
    it repeated a, else 0 (whatever R)."""

    metadata = {"name": "say2-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("a", "b")
    role_reward_agents = ("b",)
    role_override: dict[int, Any] | None = None

    def start_episode(self, task: dict[str, Any]) -> str:
        self.said: list[str] = []
        return "a"

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.task["question"]}]

    def apply_action(self, agent: str, action: str) -> Transition:
        self.said.append(action.strip())
        self.add_note(f"heard {action.strip()}")
        return Transition(invalid=not action.strip().isdecimal(), next_agent="b" if agent == "a" else None)

    def episode_outcome(self) -> Outcome:
        ok = self.said[0] == self.task["answer"]
        role = {1: 0.25 if self.said[1] == self.said[0] else 0.0}
        if self.role_override is not None:
            role = self.role_override
        return Outcome(float(ok), ok, role_rewards=role)


def _play(env, actions):
    returns, it, ends = dict.fromkeys(env.possible_agents, 0.0), iter(actions), {}
    env.reset(options={"task": TASK})
    for agent in env.agent_iter():
        _, r, term, trunc, info = env.last()
        returns[agent] += r
        if term or trunc:
            ends[agent] = dict(info)
        env.step(None if term or trunc else next(it))
    return returns, ends


def test_role_rewards_reach_infos_and_transcript_but_not_the_returns():
    env = SayEnv()
    returns, ends = _play(env, ["3", "3"])
    assert returns == {"a": 1.0, "b": 1.0}  # R only: the role score 0.25 is side information
    assert ends["a"]["role_rewards"] == ends["b"]["role_rewards"] == {1: 0.25}
    assert [(e.speaker, e.turn, e.role_reward) for e in env.transcript] == [
        ("env", 0, None),
        ("a", 0, None),
        ("env", 1, None),
        ("b", 1, 0.25),
    ]
    assert "--- turn 1 | b (role reward 0.25) ---" in env.state()
    returns, ends = _play(env, ["4", "x"])
    assert returns == {"a": 0.0, "b": -0.1}
    assert ends["b"]["role_rewards"] == {1: 0.0}


def test_an_env_without_role_scores_gives_an_empty_dict():
    class NoRole(SayEnv):
        role_reward_agents = ()
        role_override = {}

    _, ends = _play(NoRole(), ["3", "3"])
    assert ends["a"]["role_rewards"] == {}


@pytest.mark.parametrize(
    ("override", "agents", "match"),
    [
        (
            {5: 1.0},
            ("b",),
            r"role reward for turn 5, which is no action of this episode \(action turns: \[0, 1\]\)",
        ),
        ({0: 1.0}, ("b",), r"gave a role reward to 'a' \(turn 0\), which is not in its role_reward_agents"),
        ({1: float("nan")}, ("b",), r"gave turn 1 the role reward nan; it must be a finite number"),
        ({1: True}, ("b",), r"gave turn 1 the role reward True; it must be a finite number"),
        ({1: 1.0}, (), r"gave a role reward to 'b' \(turn 1\), which is not in its role_reward_agents \(\)"),
    ],
)
def test_the_base_class_refuses_malformed_role_rewards(override, agents, match):
    cls = type("Bad", (SayEnv,), {"role_override": override, "role_reward_agents": agents})
    with pytest.raises(RuntimeError, match=match):
        _play(cls(), ["3", "3"])


def test_check_env_passes_a_role_env_and_refuses_unknown_role_agents():
    report = check_env(lambda **kw: SayEnv(**{"tasks": [TASK], **kw}), fuzz_episodes=20)
    assert report.random_episodes == 20
    bad = type("BadAgents", (SayEnv,), {"role_reward_agents": ("c",)})
    with pytest.raises(AssertionError, match="role_reward_agents must be a tuple of possible agents"):
        check_env(lambda **kw: bad(**{"tasks": [TASK], **kw}), fuzz_episodes=1)


def test_a_golden_episode_with_the_wrong_role_rewards_fails():
    g = next(g for g in MathTwoAgentEnv.golden_episodes() if g.name == "wrong, reject, right")
    assert g.role_rewards == {0: 0.0, 1: 1.0, 2: 1.0}
    play_golden_episode(MathTwoAgentEnv, g)
    wrong = dataclasses.replace(g, role_rewards={0: 0.0, 1: 0.0, 2: 1.0})
    with pytest.raises(AssertionError, match=r"role_rewards \{0: 0.0, 1: 1.0, 2: 1.0\}, expected"):
        play_golden_episode(MathTwoAgentEnv, wrong)


def _math(actions, **kw):
    env = MathTwoAgentEnv(**kw)
    task = {"question": "What is 2 + 3?", "answer": "5", "id": "m/0"}
    env.reset(options={"task": task})
    it, ends = iter(actions), {}
    for agent in env.agent_iter():
        *_, term, trunc, info = env.last()
        if term or trunc:
            ends[agent] = dict(info)
        env.step(None if term or trunc else next(it))
    return ends["solver"]


@pytest.mark.parametrize(
    ("actions", "role", "accuracy", "team"),
    [
        # a wrong attempt rejected (right verdict), then a right one: every turn scores 1 except attempt 0
        (("\\boxed{6}", "<verify>reject</verify>", "\\boxed{5}"), {0: 0.0, 1: 1.0, 2: 1.0}, 1.0, 1.0),
        # a right attempt rejected (wrong verdict), then a wrong one
        (("\\boxed{5}", "<verify>reject</verify>", "\\boxed{7}"), {0: 1.0, 1: 0.0, 2: 0.0}, 0.0, 0.0),
        # a wrong attempt approved: the verdict was wrong
        (("\\boxed{6}", "<verify> APPROVE </verify>"), {0: 0.0, 1: 0.0}, 0.0, 0.0),
        # no verdict tag: invalid, scores 0 even though the attempt was right; routed as reject
        (("\\boxed{5}", "fine", "\\boxed{5}"), {0: 1.0, 1: 0.0, 2: 1.0}, None, 1.0),
        # three loops: wrong, reject, wrong, reject (right both times), right
        (
            ("\\boxed{1}", "<verify>reject</verify>", "\\boxed{2}", "<verify>reject</verify>", "\\boxed{5}"),
            {0: 0.0, 1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0},
            1.0,
            1.0,
        ),
    ],
)
def test_math_2agent_role_scores_by_hand(actions, role, accuracy, team):
    info = _math(actions, max_loops=max(2, (len(actions) + 1) // 2))
    assert info["role_rewards"] == role
    assert info["team_reward"] == team
    # the verifier's role scores over its valid verdicts are exactly its verdict accuracy metric
    assert info["episode_metrics"].get("verifier_accuracy") == accuracy

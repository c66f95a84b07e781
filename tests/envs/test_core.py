"""TextAECEnv bookkeeping, checked on a tiny env defined here (independent of the math envs)."""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import pytest

from mas_envs.core import (
    Outcome,
    TextAECEnv,
    Transition,
    UnicodeText,
    messages_to_text,
    task_id_of,
    text_env,
    wrap,
)

TASKS = [{"question": f"say {i}", "answer": str(i), "data_source": "toy", "id": f"toy/{i}"} for i in range(5)]


class RelayEnv(TextAECEnv):
    """alice and bob alternate; an action is valid when it is a decimal number; "done" by bob ends it.

    Team reward: 1 when the last number said equals the task answer.
    """

    metadata = {"name": "relay-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("alice", "bob")
    stop_strings = {"bob": ("done",)}

    def start_episode(self, task: dict[str, Any]) -> str:
        self.said: list[str] = []
        return "alice"

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": f"You are {agent}."},
            {"role": "user", "content": f"{self.task['question']} | so far: {' '.join(self.said)}"},
        ]

    def apply_action(self, agent: str, action: str) -> Transition:
        if agent == "bob" and action == "done":
            return Transition(invalid=False, next_agent=None)
        valid = action.strip().isdecimal()
        if valid:
            self.said.append(action.strip())
        return Transition(invalid=not valid, next_agent="bob" if agent == "alice" else "alice")

    def episode_outcome(self) -> Outcome:
        ok = bool(self.said) and self.said[-1] == self.task["answer"]
        return Outcome(1.0 if ok else 0.0, ok)


def play(env, actions: list[str]) -> tuple[dict[str, float], list[str]]:
    """Standard AEC loop with scripted actions; returns (per-agent return, acting agents)."""
    returns, actors, it = dict.fromkeys(env.possible_agents, 0.0), [], iter(actions)
    for agent in env.agent_iter():
        assert agent in env.agents
        _, r, term, trunc, _ = env.last()
        returns[agent] += r
        if term or trunc:
            env.step(None)
        else:
            actors.append(agent)
            env.step(next(it))
    assert env.agents == []
    return returns, actors


def test_rewards_penalty_and_team_reward_bookkeeping():
    env = wrap(RelayEnv(tasks=TASKS, invalid_action_penalty=0.25))
    env.reset(options={"task_index": 3})
    env.step("x")  # alice invalid: -0.25 to alice only
    assert env.rewards == {"alice": -0.25, "bob": 0.0}
    assert env.infos["alice"]["invalid_action"] is True and env.infos["bob"]["invalid_action"] is False
    env.step("3")  # bob valid
    assert env.rewards == {"alice": 0.0, "bob": 0.0}
    assert env.last()[1] == -0.25  # alice's accumulated reward since her last action
    env.step("2")  # alice valid
    env.step("done")  # bob ends: last number "2" != "3" -> R = 0
    assert all(env.terminations.values()) and not any(env.truncations.values())
    assert {a: i["team_reward"] for a, i in env.infos.items()} == {"alice": 0.0, "bob": 0.0}
    assert {a: i["success"] for a, i in env.infos.items()} == {"alice": False, "bob": False}


def test_returns_and_turns_of_a_successful_episode():
    env = wrap(RelayEnv(tasks=TASKS, invalid_action_penalty=0.1))
    env.reset(options={"task_index": 3})
    returns, actors = play(env, ["??", "3", "1", "done"])
    # R = 0 (last said "1"); alice had one invalid turn
    assert actors == ["alice", "bob", "alice", "bob"]
    assert returns == pytest.approx({"alice": -0.1, "bob": 0.0})
    env.reset(options={"task_index": 3})
    returns, _ = play(env, ["bad", "7", "3", "done"])
    assert returns == pytest.approx({"alice": 1.0 - 0.1, "bob": 1.0})
    assert env.unwrapped.turn == 4


def test_infos_hold_messages_turn_task_id():
    env = wrap(RelayEnv(tasks=TASKS))
    env.reset(options={"task_index": 1})
    for a in env.agents:
        info = env.infos[a]
        assert info["messages"][0] == {"role": "system", "content": f"You are {a}."}
        assert info["turn"] == 0 and info["task_id"] == "toy/1" and info["invalid_action"] is False
        assert env.observe(a) == messages_to_text(info["messages"])
    env.step("5")
    assert env.infos["bob"]["turn"] == 1
    assert env.infos["bob"]["messages"][1]["content"] == "say 1 | so far: 5"
    assert env.observe("bob") == "You are bob.\n\nsay 1 | so far: 5"


def test_max_turns_truncates_with_team_reward():
    env = wrap(RelayEnv(tasks=TASKS, max_turns=3))
    env.reset(options={"task_index": 2})
    returns, actors = play(env, ["1", "2", "2"])
    assert actors == ["alice", "bob", "alice"]
    assert returns == {"alice": 1.0, "bob": 1.0}
    assert env.unwrapped.truncated and "truncated" in env.unwrapped.state()


def test_task_choice_from_task_index_and_seed_never_touches_global_rng():
    env = RelayEnv(tasks=TASKS)
    py_state, np_state = random.getstate(), np.random.get_state()
    picked = []
    for seed in range(20):
        env.reset(seed=seed)
        picked.append(env.task_id)
    assert random.getstate() == py_state
    assert all(
        a == b for a, b in zip(np.random.get_state(), np_state, strict=True) if not isinstance(a, np.ndarray)
    )
    assert (np.random.get_state()[1] == np_state[1]).all()
    # a seed picks task rng.integers(5) of default_rng(seed)
    assert picked == [f"toy/{np.random.default_rng(s).integers(5)}" for s in range(20)]
    assert len(set(picked)) > 1
    env.reset(seed=7)
    first = env.task_id
    env.reset(seed=7)
    assert env.task_id == first


def test_options_task_and_unknown_options():
    env = RelayEnv(tasks=TASKS)
    env.reset(options={"task": {"question": "say 9", "answer": "9"}, "unrelated": 1})
    assert env.task["answer"] == "9"
    assert env.task_id == task_id_of({"question": "say 9", "answer": "9"}) and len(env.task_id) == 16
    env.reset(seed=0, options={"options": 1})  # what PettingZoo's api_test passes
    with pytest.raises(ValueError, match="question"):
        env.reset(options={"task": {"answer": "1"}})
    with pytest.raises(IndexError, match="out of range for 5 tasks"):
        env.reset(options={"task_index": 5})


def test_current_task_is_the_live_row_and_a_clear_error_before_reset():
    env = RelayEnv(tasks=TASKS)
    with pytest.raises(RuntimeError, match=r"RelayEnv has no task yet: call reset\(\) first"):
        _ = env.current_task
    env.reset(options={"task_index": 3})
    assert env.current_task == TASKS[3] and env.current_task is env.task
    assert env.current_task is not TASKS[3]  # reset copies the row


def test_no_task_list_is_a_clear_error():
    env = RelayEnv()
    with pytest.raises(ValueError, match="tasks="):
        env.reset(seed=0)


def test_non_text_action_of_a_live_agent_is_an_invalid_action_not_a_crash():
    # None (a failed generation), bytes, numbers: the rollout goes on, the acting agent pays -c.
    env = wrap(RelayEnv(tasks=TASKS, invalid_action_penalty=0.5, render_mode="ansi"))
    env.reset(options={"task_index": 0})
    env.step(None)  # alice
    assert env.rewards == {"alice": -0.5, "bob": 0.0} and env.infos["alice"]["invalid_action"] is True
    assert env.agent_selection == "bob"  # routed as if alice had written ""
    env.step(b"0")  # bob
    assert env.rewards == {"alice": 0.0, "bob": -0.5} and env.agent_selection == "alice"
    env.step(0)  # alice: the int 0 is not the text "0", so nothing was said
    assert env.rewards == {"alice": -0.5, "bob": 0.0} and env.unwrapped.said == []
    env.step("done")  # bob ends; R = 0 (nobody said a number)
    assert "--- turn 0 | alice (invalid) ---" in env.render()
    env.reset(options={"task_index": 0})
    returns, actors = play(env, [None, b"0", 0, "done"])
    assert actors == ["alice", "bob", "alice", "bob"]
    assert returns == {"alice": -1.0, "bob": -0.5}


def test_dead_step_rules():
    env = wrap(RelayEnv(tasks=TASKS))
    env.reset(options={"task_index": 0})
    env.step("0")
    env.step("done")
    with pytest.raises(ValueError, match="only valid action is None"):
        env.step("more text")


def test_task_options_errors_are_clear():
    env = RelayEnv(tasks=TASKS)
    for bad in ("3", 1.5, None.__class__, True):
        with pytest.raises(TypeError, match=r'options\["task_index"\] must be an int'):
            env.reset(options={"task_index": bad})
    env.reset(options={"task_index": np.int64(2)})
    assert env.task_id == "toy/2"
    with pytest.raises(ValueError, match='"question" must be a str'):
        env.reset(options={"task": {"question": None, "answer": "1"}})
    with pytest.raises(ValueError, match="task list is empty"):
        RelayEnv(tasks=[]).reset(seed=0)


def test_a_failed_reset_leaves_no_live_agents():
    class Picky(RelayEnv):
        def start_episode(self, task):
            if task.get("answer") is None:
                raise ValueError("no answer")
            return super().start_episode(task)

    env = Picky(tasks=TASKS)
    env.reset(options={"task_index": 0})
    with pytest.raises(ValueError, match="no answer"):
        env.reset(options={"task": {"question": "q"}})
    assert env.agents == []


def test_constructor_validation():
    with pytest.raises(ValueError, match="invalid_action_penalty"):
        RelayEnv(invalid_action_penalty=-1)
    with pytest.raises(ValueError, match="max_turns"):
        RelayEnv(max_turns=0)
    with pytest.raises(ValueError, match="render_mode"):
        RelayEnv(render_mode="human")
    with pytest.raises(TypeError, match="invalid_action_penalty must be a number"):
        RelayEnv(invalid_action_penalty="0.1")
    with pytest.raises(TypeError, match="max_turns must be an int"):
        RelayEnv(max_turns=2.5)

    class NoAgents(TextAECEnv):
        pass

    with pytest.raises(TypeError, match="possible_agents"):
        NoAgents()


def test_spaces_hold_any_unicode_and_are_cached():
    env = RelayEnv(tasks=TASKS)
    space = env.action_space("alice")
    assert space is env.action_space("alice") and env.observation_space("bob") is env.observation_space("bob")
    for text in ["", "数学 答案 \\boxed{½} 😀", "\x00\ud800", "a" * 100_000]:
        assert space.contains(text)
    assert not space.contains(b"bytes") and not space.contains(None)
    assert not UnicodeText(max_length=3).contains("abcd")
    s1, s2 = UnicodeText(fragments=("<x>",), seed=3), UnicodeText(fragments=("<x>",), seed=3)
    samples = [s1.sample() for _ in range(50)]
    assert samples == [s2.sample() for _ in range(50)]
    assert any("<x>" in s for s in samples) and any("<x>" not in s for s in samples)
    assert env.action_space("bob").fragments == ("done",)  # stop strings are fuzzed too
    with pytest.raises(ValueError, match="no mask"):
        s1.sample(mask=(3, None))


def test_pickle_after_reset_plays_on_identically():
    env = wrap(RelayEnv(tasks=TASKS, render_mode="ansi"))
    env.reset(options={"task_index": 4})
    env.step("4")
    copy = pickle.loads(pickle.dumps(env))
    for e in (env, copy):
        e.step("bad")
        e.step("4")
        e.step("done")
    assert env.render() == copy.render()
    assert "--- turn 1 | bob (invalid) ---" in env.render()
    assert env.render().endswith("=== terminated: team reward 1, success True ===")


def test_render_none_without_ansi_mode():
    env = RelayEnv(tasks=TASKS)
    env.reset(options={"task_index": 0})
    assert env.render() is None


def test_named_task_sets_are_loaded_once_per_process_and_not_pickled():
    a, b = RelayEnv(tasks="gsm8k-test"), RelayEnv(tasks="gsm8k-test")
    a.reset(seed=0)
    b.reset(seed=0)
    assert a.tasks is b.tasks and len(a.tasks) == 1319
    blob = pickle.dumps(a)
    assert len(blob) < 50_000  # the 1319 rows (~780 kB) are reloaded from the cache, not pickled
    c = pickle.loads(blob)
    assert c.task_id == a.task_id and c.tasks is a.tasks
    given = list(TASKS)
    d = RelayEnv(tasks=given)
    d.reset(options={"task_index": 0})
    d.task["question"] = "changed"
    assert given[0]["question"] == "say 0"  # the episode's row is a copy


def test_text_env_reaches_the_declared_contract_through_wrappers_with_its_defaults():
    env = wrap(RelayEnv(tasks=[{"question": "q", "answer": "1"}]))
    inner = text_env(env)
    assert inner is env.unwrapped and isinstance(inner, RelayEnv)
    # what a trainer reads, declared on TextAECEnv with defaults (this env overrides only stop_strings)
    assert inner.stop_strings == {"alice": (), "bob": ("done",)}
    assert inner.role_reward_agents == () and inner.startup_warnings() == []
    assert inner.eval_task_source() is None and inner.invalid_action_penalty == 0.1
    env.reset(seed=0)
    play(env, ["3", "done"])
    assert [(e.speaker, e.text) for e in inner.transcript if e.speaker != "env"][:2] == [
        ("alice", "3"),
        ("bob", "done"),
    ]


def test_text_env_refuses_an_env_that_is_not_a_text_env():
    class Plain:
        unwrapped = object()

    with pytest.raises(TypeError, match="is not a mas_envs.TextAECEnv"):
        text_env(Plain())  # type: ignore[arg-type]

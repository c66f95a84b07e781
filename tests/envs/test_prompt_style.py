"""prompt_style: the paper prompts stay the default; "fewshot" gives small models worked examples as chat turns."""

from __future__ import annotations

import pytest

import mas_envs
from mas_envs.envs.math import prompts
from mas_envs.testing import check_env

TASK = {"question": "Calculate 5 + -4.", "answer": "1", "id": "t/0", "data_source": "toy"}
EXAMPLES = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5. \\boxed{5}"},
    {"role": "user", "content": "What is 4 - 7?"},
    {"role": "assistant", "content": "4 - 7 = -3. \\boxed{-3}"},
]


def started(env_id, **kwargs):
    env = mas_envs.make(env_id, **kwargs)
    env.reset(options={"task": TASK})
    return env


def test_the_default_is_the_paper_prompt():
    msgs = started("math-2agent").unwrapped.infos["solver"]["messages"]
    assert msgs[0] == {"role": "system", "content": prompts.SOLVER_SYSTEM_2AGENT}
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[1]["content"].startswith(
        "# Problem\nCalculate 5 + -4.\n\n# Your task\nSolve the problem step by step."
    )
    assert (
        started("math-1agent").unwrapped.infos["solver"]["messages"][0]["content"]
        == prompts.SOLVER_SYSTEM_1AGENT
    )


@pytest.mark.parametrize("env_id", ["math-1agent", "math-2agent"])
def test_fewshot_solver_gets_worked_examples_as_earlier_chat_turns(env_id):
    env = started(env_id, prompt_style="fewshot")
    assert env.unwrapped.infos["solver"]["messages"] == [
        *EXAMPLES,
        {"role": "user", "content": "Calculate 5 + -4."},
    ]
    assert env.observe("solver").endswith("\\boxed{-3}\n\nCalculate 5 + -4.")


def test_fewshot_verifier_sees_the_problem_and_only_the_latest_answer():
    env = started("math-2agent", prompt_style="fewshot", max_loops=3)
    env.step("<think>hmm</think>5 - 4 = 2. \\boxed{2}")
    msgs = env.unwrapped.infos["verifier"]["messages"]
    n = len(prompts.FEWSHOT_VERIFIER_EXAMPLES)
    assert msgs[0] == {"role": "system", "content": "Check the answer."}
    assert len(msgs) == 2 + 2 * n
    assert [m["role"] for m in msgs[1:-1]] == ["user", "assistant"] * n
    verdicts = [m["content"].split("<verify>")[1] for m in msgs[2:-1:2]]
    a, r = "approve</verify>", "reject</verify>"
    assert verdicts == [a, r, r, a]  # alternating, so no verdict is merely "the last example's"
    assert msgs[1] == {"role": "user", "content": "What is 2 + 3?\n2 + 3 = 5. \\boxed{5}"}
    # the live turn: the problem and the latest answer, its think block dropped
    assert msgs[-1] == {"role": "user", "content": "Calculate 5 + -4.\n5 - 4 = 2. \\boxed{2}"}
    env.step("5 - 4 = 1, so 2 is wrong. <verify>reject</verify>")
    # the solver answers again in the same conversation
    assert env.unwrapped.infos["solver"]["messages"] == [
        *EXAMPLES,
        {"role": "user", "content": "Calculate 5 + -4."},
        {"role": "assistant", "content": "<think>hmm</think>5 - 4 = 2. \\boxed{2}"},
        {"role": "user", "content": "That answer is wrong. Try again: Calculate 5 + -4."},
    ]
    long = "x" * 1000 + " \\boxed{1}"
    env.step(long)
    last = env.unwrapped.infos["verifier"]["messages"][-1]["content"]
    assert last == "Calculate 5 + -4.\n..." + long[-400:]  # only the latest attempt, and only its end
    env.step("<verify>approve</verify>")
    assert env.unwrapped.infos["solver"]["team_reward"] == 1.0  # same rewards in both styles


def test_an_unknown_prompt_style_is_refused():
    with pytest.raises(ValueError, match=r"prompt_style must be one of \('paper', 'fewshot'\), got 'tiny'"):
        mas_envs.make("math-2agent", prompt_style="tiny")


@pytest.mark.parametrize("env_id", ["math-1agent", "math-2agent"])
def test_fewshot_envs_pass_the_conformance_checks(env_id):
    report = check_env(
        lambda **kw: mas_envs.make(env_id, **{"prompt_style": "fewshot", **kw}), fuzz_episodes=200
    )
    assert len(report.golden_episodes) >= 3

"""math-fixer on a real GSM8K problem with scripted policies: turn order, exact returns, metrics and prompts."""

from __future__ import annotations

import pytest

import mas_envs
from mas_envs.data import load_tasks
from mas_envs.testing import check_env

TASK = load_tasks("gsm8k-test", limit=1)[0]  # gold 18
RIGHT, WRONG, WRONG2, NO_BOX = "9 eggs at $2: \\boxed{18}", "\\boxed{26}", "\\boxed{13}", "It is 18."


def play(actions, **kwargs):
    """The standard AEC loop with scripted actions: (returns per agent, acting agents, final infos, env)."""
    env = mas_envs.make("math-fixer", render_mode="ansi", **kwargs)
    env.reset(options={"task": TASK})
    returns, actors, infos, it = dict.fromkeys(env.possible_agents, 0.0), [], {}, iter(actions)
    for agent in env.agent_iter():
        _, r, term, trunc, info = env.last()
        returns[agent] += r
        if term or trunc:
            infos[agent] = dict(info)
            env.step(None)
        else:
            actors.append(agent)
            env.step(next(it))
    with pytest.raises(StopIteration):
        next(it)  # every scripted action was used: the episode ended exactly where the script says
    return returns, actors, infos, env


def test_passes_check_env_with_its_golden_episodes():
    rep = check_env(lambda **kw: mas_envs.make("math-fixer", **kw))
    assert len(rep.golden_episodes) == 6 and rep.random_episodes > 0


@pytest.mark.parametrize(
    ("actions", "kwargs", "actors", "reward", "metrics"),
    [
        # the proposer is right: the fixer never acts
        (
            (RIGHT,),
            {},
            ["proposer"],
            1.0,
            {"proposer_accuracy": 1, "fixes_attempted": 0, "fixes_succeeded": 0},
        ),
        # wrong, fixed on the first try
        (
            (WRONG, RIGHT),
            {},
            ["proposer", "fixer"],
            1.0,
            {"proposer_accuracy": 0, "fixes_attempted": 1, "fixes_succeeded": 1, "fix_rate": 1},
        ),
        # wrong, then the fixer needs all three tries
        (
            (WRONG, WRONG2, WRONG, RIGHT),
            {},
            ["proposer", "fixer", "fixer", "fixer"],
            1.0,
            {"proposer_accuracy": 0, "fixes_attempted": 3, "fixes_succeeded": 1, "fix_rate": 1},
        ),
        # wrong, and three failed fixes: the episode ends, R = 0
        (
            (WRONG, WRONG, WRONG2, WRONG),
            {},
            ["proposer", "fixer", "fixer", "fixer"],
            0.0,
            {"proposer_accuracy": 0, "fixes_attempted": 3, "fixes_succeeded": 0, "fix_rate": 0},
        ),
        # max_fixes = 2: at most two fixer turns
        (
            (WRONG, WRONG, WRONG),
            {"max_fixes": 2},
            ["proposer", "fixer", "fixer"],
            0.0,
            {"proposer_accuracy": 0, "fixes_attempted": 2, "fixes_succeeded": 0, "fix_rate": 0},
        ),
    ],
)
def test_scripted_episodes(actions, kwargs, actors, reward, metrics):
    returns, acted, infos, _ = play(actions, **kwargs)
    assert acted == actors
    assert returns == {"proposer": reward, "fixer": reward}  # no invalid action: each return is R
    for info in infos.values():
        assert info["team_reward"] == reward and info["success"] is (reward == 1.0)
        assert info["episode_metrics"] == {k: float(v) for k, v in metrics.items()}
        assert info["turn"] == len(actors)


def test_malformed_output_is_an_invalid_wrong_answer_never_a_crash():
    # the proposer writes no box: penalty 0.1 and graded wrong, so the fixer acts; the fixer's first reply is not
    # text at all (a failed generation): invalid again, and the episode goes on to its second try, which is right
    env = mas_envs.make("math-fixer")
    env.reset(options={"task": TASK})
    env.step(NO_BOX)
    assert env.agent_selection == "fixer" and env.unwrapped.infos["proposer"]["invalid_action"] is True
    assert env.rewards["proposer"] == pytest.approx(-0.1)
    env.step(None)  # a live agent's None: invalid, routed as ""
    assert env.agent_selection == "fixer" and env.unwrapped.infos["fixer"]["invalid_action"] is True
    env.step(RIGHT)
    # the last step's rewards: R = 1 to both (the fixer's earlier -0.1 was paid on its own step)
    assert env.rewards == pytest.approx({"proposer": 1.0, "fixer": 1.0})
    assert env.unwrapped.outcome.team_reward == 1.0 and all(env.unwrapped.terminations.values())


def test_penalised_returns():
    returns, acted, infos, _ = play((NO_BOX, NO_BOX, RIGHT))
    # proposer: -0.1 + R 1 = 0.9; fixer: one invalid try (-0.1) and a right one: 0.9
    assert acted == ["proposer", "fixer", "fixer"]
    assert returns == pytest.approx({"proposer": 0.9, "fixer": 0.9})
    assert infos["fixer"]["episode_metrics"]["fixes_attempted"] == 2.0


@pytest.mark.parametrize("style", ["paper", "fewshot"])
def test_the_fixer_sees_every_earlier_attempt_and_the_verdict(style):
    env = mas_envs.make("math-fixer", prompt_style=style)
    env.reset(options={"task": TASK})
    first = env.unwrapped.prompt_messages("proposer")
    env.step(WRONG)
    env.step(WRONG2)
    msgs = env.unwrapped.infos["fixer"]["messages"]
    text = "\n".join(m["content"] for m in msgs)
    assert TASK["question"] in text and WRONG in text and WRONG2 in text
    assert text.index(WRONG) < text.index(WRONG2)
    if style == "paper":
        assert text.count("Grader: incorrect.") == 2
        assert (
            "## Proposer" in text
            and "## Fixer, try 1" in text
            and msgs[0]["content"].startswith("You are the fixer")
        )
        assert first[0]["content"].startswith("You are the proposer") and WRONG not in first[1]["content"]
    else:
        # math-2agent's fewshot solver prompt: the attempts as assistant turns, each followed by the retry turn
        assistant = [m["content"] for m in msgs if m["role"] == "assistant"]
        assert assistant[-2:] == [WRONG, WRONG2]
        assert msgs[-1]["role"] == "user" and msgs[-1]["content"].startswith(
            "That answer is wrong. Try again:"
        )
        assert [m["role"] for m in first][-1] == "user" and first[-1]["content"] == TASK["question"]
        # the proposer's prompt is math-1agent's fewshot solver prompt; the fixer's adds one worked repair
        one = mas_envs.make("math-1agent", prompt_style="fewshot")
        one.reset(options={"task": TASK})
        assert first == one.unwrapped.prompt_messages("solver")
        assert [m["content"] for m in msgs[4:8]] == [
            "What is 6 - 9?",
            "6 - 9 = 3. \\boxed{3}",
            "That answer is wrong. Try again: What is 6 - 9?",
            "6 - 9 = -3. \\boxed{-3}",
        ]
        assert msgs[:4] == first[:4] and msgs[8] == first[4]


def test_arguments_are_checked():
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="max_fixes must be an int >= 1"):
            mas_envs.make("math-fixer", max_fixes=bad)
    with pytest.raises(ValueError, match="prompt_style"):
        mas_envs.make("math-fixer", prompt_style="chatty")
    with pytest.raises(ValueError, match="no gold answer"):
        mas_envs.make("math-fixer").reset(options={"task": {"question": "1 + 1?"}})

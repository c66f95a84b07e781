"""math-2agent and math-1agent on real GSM8K problems: golden episodes with exact rewards and turn counts."""

from __future__ import annotations

import time

import pytest

import mas_envs
from mas_envs.data import load_tasks
from mas_envs.envs.math.math_2agent import parse_verdict

GSM8K_TEST = load_tasks("gsm8k-test", limit=3)  # real problems; golds "18", "3", "70000"


def play(env, actions):
    """The standard AEC loop with scripted actions. Returns (returns per agent, acting agents, final infos)."""
    returns, actors, infos, it = dict.fromkeys(env.possible_agents, 0.0), [], {}, iter(actions)
    for agent in env.agent_iter():
        assert agent in env.agents
        _, r, term, trunc, info = env.last()
        returns[agent] += r
        if term or trunc:
            infos[agent] = dict(info)
            env.step(None)
        else:
            actors.append(agent)
            env.step(next(it))
    assert env.agents == []
    return returns, actors, infos


@pytest.fixture
def env():
    return mas_envs.make("math-2agent", render_mode="ansi")


@pytest.mark.parametrize("task", GSM8K_TEST, ids=lambda t: t["id"])
def test_right_answer_then_approve(env, task):
    env.reset(options={"task": task})
    returns, actors, infos = play(
        env, [f"... so \\boxed{{{task['answer']}}}", "Checked. <verify>approve</verify>"]
    )
    assert actors == ["solver", "verifier"]
    assert returns == {"solver": 1.0, "verifier": 1.0}
    assert all(i["team_reward"] == 1.0 and i["success"] is True and i["turn"] == 2 for i in infos.values())


def test_wrong_then_reject_then_right(env):
    task = GSM8K_TEST[1]  # gold "3"
    env.reset(options={"task": task})
    returns, actors, infos = play(env, ["\\boxed{4}", "Step 2 is off. <verify>reject</verify>", "\\boxed{3}"])
    assert actors == ["solver", "verifier", "solver"]
    assert returns == {"solver": 1.0, "verifier": 1.0}
    assert infos["solver"]["turn"] == 3


def test_no_box_gets_penalty_and_zero_team_reward(env):
    env.reset(options={"task": GSM8K_TEST[0]})
    env.step("The answer is 18.")  # no \boxed{}
    assert env.rewards == {"solver": -0.1, "verifier": 0.0}
    assert env.infos["solver"]["invalid_action"] is True
    returns, actors, infos = play(env, ["<verify>approve</verify>"])
    assert actors == ["verifier"]
    assert returns == {"solver": -0.1, "verifier": 0.0}
    assert infos["verifier"]["team_reward"] == 0.0 and infos["verifier"]["success"] is False


def test_no_verifier_turn_after_the_last_solver_turn(env):
    env.reset(options={"task": GSM8K_TEST[0]})
    _, actors, infos = play(env, ["\\boxed{1}", "<verify>reject</verify>", "\\boxed{2}"])
    assert actors == ["solver", "verifier", "solver"]
    assert infos["solver"]["team_reward"] == 0.0
    env3 = mas_envs.make("math-2agent", max_loops=3)
    env3.reset(options={"task": GSM8K_TEST[0]})
    acts = ["\\boxed{1}", "<verify>reject</verify>", "\\boxed{2}", "<verify>reject</verify>", "\\boxed{18}"]
    returns, actors, _ = play(env3, acts)
    assert actors == ["solver", "verifier"] * 2 + ["solver"] and returns == {"solver": 1.0, "verifier": 1.0}


def test_missing_verdict_is_invalid_and_routed_as_reject(env):
    env.reset(options={"task": GSM8K_TEST[0]})
    returns, actors, _ = play(env, ["\\boxed{18}", "Looks right.", "\\boxed{18}"])
    assert actors == ["solver", "verifier", "solver"]
    assert returns == pytest.approx({"solver": 1.0, "verifier": 0.9})


def test_missing_verdict_as_approve_reproduces_the_reference():
    env = mas_envs.make("math-2agent", missing_verdict="approve")
    env.reset(options={"task": GSM8K_TEST[0]})
    returns, actors, _ = play(env, ["\\boxed{17}", "Looks right."])
    assert actors == ["solver", "verifier"]
    assert returns == pytest.approx({"solver": 0.0, "verifier": -0.1})


def test_verifier_prompt_shows_the_latest_solution_and_solver_sees_the_review(env):
    env.reset(options={"task": GSM8K_TEST[0]})
    assert "Team history" not in env.observe("solver")
    env.step("first try \\boxed{26}")
    v = env.observe("verifier")
    assert GSM8K_TEST[0]["question"] in v and "## Solver, attempt 1\nfirst try \\boxed{26}" in v
    assert "<verify>approve</verify>" in v and "<verify>reject</verify>" in v
    env.step("She bakes 4 too. <verify>reject</verify>")
    s = env.observe("solver")
    assert "## Verifier, review 1\nShe bakes 4 too. <verify>reject</verify>" in s and "\\boxed{}" in s
    assert env.infos["solver"]["messages"][0]["role"] == "system"
    assert env.observe("solver") == "\n\n".join(m["content"] for m in env.infos["solver"]["messages"])


def test_stop_strings_and_penalty_default():
    env = mas_envs.make("math-2agent")
    assert env.unwrapped.stop_strings == {"solver": (), "verifier": ("</verify>",)}
    assert env.unwrapped.invalid_action_penalty == 0.1
    assert mas_envs.make("math-1agent").unwrapped.stop_strings == {"solver": ()}


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("fine <verify>approve</verify>", "approve"),
        ("<verify>reject</verify>", "reject"),
        ("<verify> Approve </verify>", "approve"),
        ("<verify>approve</verify> wait, no: <verify>reject</verify>", "reject"),
        ("<verify>maybe</verify>", None),
        ("approve", None),
        ("", None),
    ],
)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) == verdict


def test_same_seed_identical_transcript():
    def transcript(seed):
        env = mas_envs.make("math-2agent", render_mode="ansi")
        env.reset(seed=seed)
        play(env, ["\\boxed{5}", "<verify>reject</verify>", "\\boxed{6}"])
        return env.render()

    assert transcript(11) == transcript(11)
    assert transcript(11) != transcript(12)  # a different seed picks a different GSM8K problem


def test_default_tasks_are_gsm8k_train():
    env = mas_envs.make("math-2agent")
    env.reset(options={"task_index": 0})
    assert env.unwrapped.task_id == "gsm8k/train/0" and env.unwrapped.task["answer"] == "72"


def test_math_1agent_golden():
    env = mas_envs.make("math-1agent")
    task = load_tasks("math500", limit=1)[0]  # gold \left( 3, \frac{\pi}{2} \right)
    env.reset(options={"task": task})
    returns, actors, infos = play(env, ["So $(r,\\theta)=\\boxed{(3, \\frac{\\pi}{2})}$."])
    assert actors == ["solver"] and returns == {"solver": 1.0} and infos["solver"]["success"] is True
    env.reset(options={"task": task})
    returns, _, infos = play(env, ["(3, pi/2)"])
    assert returns == pytest.approx({"solver": -0.1}) and infos["solver"]["team_reward"] == 0.0


@pytest.mark.parametrize(
    "policy",
    [
        lambda obs, agent: "",
        lambda obs, agent: "\\boxed{18}" if agent == "solver" else "<verify>reject</verify>",
        lambda obs, agent: "数学 \\boxed{" if agent == "solver" else "<verify>",
        lambda obs, agent: obs,  # echo the whole prompt back
    ],
    ids=["empty", "always-reject", "broken-tags", "echo"],
)
@pytest.mark.parametrize("env_id", ["math-2agent", "math-1agent"])
def test_standard_loop_ends_for_any_policy(env_id, policy):
    env = mas_envs.make(env_id)
    env.reset(seed=3)
    steps = 0
    for a in env.agent_iter():
        obs, r, term, trunc, info = env.last()
        assert a in env.agents
        env.step(None if term or trunc else policy(obs, a))
        steps += 1
    assert env.agents == [] and steps <= 3 + 2


@pytest.mark.parametrize("env_id", ["math-2agent", "math-1agent"])
@pytest.mark.parametrize(
    "task",
    [
        {"question": "1+1?"},
        {"question": "1+1?", "answer": None},
        {"question": "1+1?", "answer": "  "},
        {"question": "1+1?", "golden_answers": []},
    ],
    ids=["missing", "none", "blank", "empty-list"],
)
def test_a_task_without_a_gold_answer_is_a_clear_error(env_id, task):
    # It used to start an episode whose reward is 0 whatever the agents write: silent poison for training.
    env = mas_envs.make(env_id)
    with pytest.raises(ValueError, match="no gold answer"):
        env.reset(options={"task": task})
    assert env.unwrapped.agents == []


@pytest.mark.parametrize(
    ("task", "answer", "ret"),
    [
        ({"question": "1+1?", "answer": 2}, "\\boxed{2}", 1.0),
        ({"question": "1+1?", "answer": 2.0, "extra": [1, {"x": 2}]}, "\\boxed{2}", 1.0),
        ({"question": "1+1?", "golden_answers": ["2", "two"]}, "\\boxed{\\text{two}}", 1.0),
        ({"question": "1+1?", "answer": "2"}, "\\boxed{3}", 0.0),
    ],
)
def test_odd_but_valid_tasks(task, answer, ret):
    env = mas_envs.make("math-1agent")
    env.reset(options={"task": task})
    returns, _, _ = play(env, [answer])
    assert returns == {"solver": ret}


GOLD_18 = GSM8K_TEST[0]


@pytest.mark.parametrize(
    ("action", "ret"),
    [
        ("\\boxed{" * 150_000, -0.1),  # a megabyte of degenerate repetition, no balanced box
        ("\\boxed{18}" * 100_000, 1.0),
        ("\\boxed{18}\x00", 1.0),
        ("\ud800 \\boxed{18} \udfff", 1.0),  # lone surrogates
        ("\u202e\u05d0\u05d1 \\boxed{18}", 1.0),  # RTL override and Hebrew
        ("<think>\\boxed{18}</think>", -0.1),  # the box is inside the thinking
        ("<think>\\boxed{18}</think> so \\boxed{17}", 0.0),
        ("</think>\\boxed{18}", 1.0),
        ("\\boxed{\\boxed{18}}", 1.0),
        ("\\boxed{18} \\boxed{", 1.0),  # an unclosed trailing box falls back to the balanced one
        ("\\boxed{}", 0.0),  # a box, but an empty answer
        (None, -0.1),
        (b"\\boxed{18}", -0.1),
        (18, -0.1),
    ],
    ids=[
        "1MB-unclosed",
        "100k-boxes",
        "nul",
        "surrogates",
        "rtl",
        "box-in-think",
        "think-then-wrong",
        "close-only",
        "nested",
        "trailing-unclosed",
        "empty-box",
        "None",
        "bytes",
        "int",
    ],
)
def test_hostile_solver_output_never_crashes(action, ret):
    env = mas_envs.make("math-1agent")
    env.reset(options={"task": GOLD_18})
    t0 = time.monotonic()
    returns, actors, _ = play(env, [action])
    assert time.monotonic() - t0 < 5.0
    assert actors == ["solver"] and returns == pytest.approx({"solver": ret})


@pytest.mark.parametrize(
    ("review", "actors", "verifier_return"),
    [
        ("<VERIFY> Approve </VERIFY>", ["solver", "verifier"], 1.0),
        ("<verify>\napprove\n</verify>", ["solver", "verifier"], 1.0),
        ("<verify>approve</verify> hmm <verify>reject</verify>", ["solver", "verifier", "solver"], 1.0),
        ("<verify>reject</verify> on reflection <verify>approve</verify>", ["solver", "verifier"], 1.0),
        ("<verify>approve", ["solver", "verifier", "solver"], 0.9),  # unclosed: no verdict
        ("< verify>approve</verify>", ["solver", "verifier", "solver"], 0.9),
        ("<verify>yes</verify>", ["solver", "verifier", "solver"], 0.9),
        (None, ["solver", "verifier", "solver"], 0.9),
    ],
)
def test_verdict_parsing_and_routing(review, actors, verifier_return):
    env = mas_envs.make("math-2agent")
    env.reset(options={"task": GOLD_18})
    returns, acted, _ = play(env, ["\\boxed{18}", review, "\\boxed{18}"][: len(actors)])
    assert acted == actors
    assert returns == pytest.approx({"solver": 1.0, "verifier": verifier_return})

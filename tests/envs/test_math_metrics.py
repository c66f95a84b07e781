"""math-2agent's per-episode metrics (verifier accuracy, approve rate, rejection fixed, solver turns), exact."""

from __future__ import annotations

import pytest

import mas_envs
from mas_envs.data import load_tasks

TASK = load_tasks("gsm8k-test", limit=1)[0]  # gold 18
RIGHT, WRONG, NO_BOX = "9 eggs at $2: \\boxed{18}", "13 eggs at $2: \\boxed{26}", "It is 18."
OK, NO, MUMBLE = "<verify>approve</verify>", "<verify>reject</verify>", "Looks fine."


def final_infos(env_id, actions, **kwargs):
    env = mas_envs.make(env_id, **kwargs)
    env.reset(options={"task": TASK})
    it, infos = iter(actions), {}
    for agent in env.agent_iter():
        *_, term, trunc, info = env.last()
        if term or trunc:
            infos[agent] = info
            env.step(None)
        else:
            env.step(next(it))
    with pytest.raises(StopIteration):
        next(it)  # every scripted action was used
    return infos


@pytest.mark.parametrize(
    ("actions", "max_loops", "metrics"),
    [
        ((RIGHT, OK), 2, {"solver_turns": 1, "verifier_accuracy": 1, "verifier_approve_rate": 1}),
        (
            (WRONG, NO, RIGHT),
            2,
            {"solver_turns": 2, "verifier_accuracy": 1, "verifier_approve_rate": 0, "rejection_fixed": 1},
        ),
        (
            (WRONG, NO, WRONG),
            2,
            {"solver_turns": 2, "verifier_accuracy": 1, "verifier_approve_rate": 0, "rejection_fixed": 0},
        ),
        ((WRONG, OK), 2, {"solver_turns": 1, "verifier_accuracy": 0, "verifier_approve_rate": 1}),
        # rejecting a correct attempt is a wrong verdict and no "rejection of a wrong attempt"
        ((RIGHT, NO, RIGHT), 2, {"solver_turns": 2, "verifier_accuracy": 0, "verifier_approve_rate": 0}),
        # a box-less attempt is a wrong one: rejecting it is right
        (
            (NO_BOX, NO, RIGHT),
            2,
            {"solver_turns": 2, "verifier_accuracy": 1, "verifier_approve_rate": 0, "rejection_fixed": 1},
        ),
        # two reviews: the first right (wrong attempt rejected), the second wrong (right attempt rejected)
        (
            (WRONG, NO, RIGHT, NO, WRONG),
            3,
            {"solver_turns": 3, "verifier_accuracy": 0.5, "verifier_approve_rate": 0, "rejection_fixed": 0},
        ),
        # a reply without a verdict is no verdict: it counts in neither rate, and is no rejection
        (
            (WRONG, MUMBLE, WRONG, OK),
            3,
            {"solver_turns": 2, "verifier_accuracy": 0, "verifier_approve_rate": 1},
        ),
        ((WRONG, MUMBLE, RIGHT), 2, {"solver_turns": 2}),
        ((WRONG,), 1, {"solver_turns": 1}),
    ],
)
def test_math_2agent_episode_metrics(actions, max_loops, metrics):
    infos = final_infos("math-2agent", actions, max_loops=max_loops)
    assert set(infos) == {"solver", "verifier"}
    for info in infos.values():
        assert info["episode_metrics"] == {k: float(v) for k, v in metrics.items()}


def test_math_1agent_reports_solver_turns():
    assert final_infos("math-1agent", (RIGHT,))["solver"]["episode_metrics"] == {"solver_turns": 1.0}

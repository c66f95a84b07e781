"""Per-agent diversity (mas_train.metrics.diversity_metrics): distinct first turns and distinct final answers
among a task group's samples, on hand-built samples and through the collector (Transition.answer → Sample)."""

from __future__ import annotations

import itertools
import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _train_fakes import ScriptEnv, ScriptGenerator  # noqa: E402

from mas_envs.core import Transition, wrap  # noqa: E402
from mas_train.backends.base import SamplingParams  # noqa: E402
from mas_train.metrics import diversity_metrics  # noqa: E402
from mas_train.rollout import RolloutCollector  # noqa: E402
from mas_train.samples import Sample  # noqa: E402


def _s(task, traj, agent, turn, ids, answer=None):
    return Sample(
        task, traj, agent, "g", turn, [9, 9], list(ids), [-0.1] * len(ids), False, 1.0, True, 0, "stop", "x",
        None, answer,
    )  # fmt: skip


def test_g4_first_turns_three_distinct():
    # G = 4 first-turn completions [1,2], [1,2], [3], [4]: 3 distinct, 3/4 of the samples
    got = diversity_metrics(
        [_s("A", f"A/{i}", "solver", 0, ids) for i, ids in enumerate([[1, 2], [1, 2], [3], [4]])]
    )
    assert got == {"diversity/distinct/solver": 3.0, "diversity/distinct_frac/solver": 0.75}


def test_only_the_first_turn_of_an_agent_in_a_trajectory_counts():
    # trajectory A/1's solver acts twice; its retry (turn 2, listed first) differs but is not compared
    samples = [
        _s("A", "A/1", "solver", 2, [7]),
        _s("A", "A/0", "solver", 0, [5]),
        _s("A", "A/1", "solver", 0, [5]),
        _s("A", "A/0", "verifier", 1, [8]),
        _s("A", "A/1", "verifier", 1, [8]),
        _s("A", "A/1", "verifier", 3, [6]),
    ]
    got = diversity_metrics(samples)
    assert got == {
        "diversity/distinct/solver": 1.0,
        "diversity/distinct_frac/solver": 0.5,
        "diversity/distinct/verifier": 1.0,
        "diversity/distinct_frac/verifier": 0.5,
    }


def test_groups_where_the_agent_acted_once_are_skipped_and_the_rest_averaged():
    samples = [
        # group A: solver 3 distinct of 4; the verifier acted in one trajectory only -> A skipped for it
        *[_s("A", f"A/{i}", "solver", 0, ids) for i, ids in enumerate([[1], [1], [2], [3]])],
        _s("A", "A/0", "verifier", 1, [4]),
        # group B: solver collapsed (1 of 4); the verifier 2 distinct of 2
        *[_s("B", f"B/{i}", "solver", 0, [1]) for i in range(4)],
        _s("B", "B/0", "verifier", 1, [4]),
        _s("B", "B/2", "verifier", 1, [5]),
    ]
    got = diversity_metrics(samples)
    assert got == {
        "diversity/distinct/solver": (3 + 1) / 2,
        "diversity/distinct_frac/solver": (0.75 + 0.25) / 2,
        "diversity/distinct/verifier": 2.0,
        "diversity/distinct_frac/verifier": 1.0,
    }
    # an agent that never acted twice in a group gets no key at all
    assert diversity_metrics([_s("A", "A/0", "verifier", 1, [4]), _s("B", "B/0", "verifier", 1, [4])]) == {}


def test_distinct_final_answers_use_the_last_turn_and_count_none_once():
    samples = [
        # group A: final answers "42" (A/0's retry replaces its first "7"), "42", None, None -> 2 distinct
        _s("A", "A/0", "solver", 0, [1], "7"),
        _s("A", "A/0", "solver", 2, [2], "42"),
        _s("A", "A/1", "solver", 0, [3], "42"),
        _s("A", "A/2", "solver", 0, [4], None),
        _s("A", "A/3", "solver", 0, [5], None),
        # group B: every final answer None -> 1; still averaged in, because group A has answers
        _s("B", "B/0", "solver", 0, [1], None),
        _s("B", "B/1", "solver", 0, [1], None),
    ]
    got = diversity_metrics(samples)
    assert got["diversity/distinct_answers/solver"] == (2 + 1) / 2
    assert got["diversity/distinct/solver"] == (4 + 1) / 2
    # a step where no final answer is given (or an env that reports none): no answer key
    assert "diversity/distinct_answers/solver" not in diversity_metrics(samples[5:])


class AnswerEnv(ScriptEnv):
    """The script env whose solver turns report their ``<answer>`` text, stripped, as ``Transition.answer``."""

    def apply_action(self, agent, action):
        t = super().apply_action(agent, action)
        m = re.search(r"<answer>(.*?)</answer>", action) if agent == "solver" else None
        return Transition(t.invalid, t.next_agent, answer=m.group(1).strip() if m else None)


@pytest.fixture(scope="module")
def tok():
    from mas_train.models import build_qwen_tokenizer

    return build_qwen_tokenizer()


def test_the_collector_records_the_env_answer_on_each_sample(tok):
    replies = itertools.cycle(
        ["<answer>42</answer>", "<answer>42</answer>", "<answer> 42 </answer>", "<answer>7</answer>"]
    )

    def reply(text, sp):
        return "<verify>approve</verify>" if "Verify." in text else next(replies)

    col = RolloutCollector(
        lambda: wrap(AnswerEnv()),
        {"g": ScriptGenerator(tok, reply)},
        {"g": tok},
        {"solver": "g", "verifier": "g"},
        {a: SamplingParams(max_new_tokens=8) for a in ("solver", "verifier")},
    )
    batch = col.collect([{"id": "t0", "question": "What is 6*7?", "answer": "42", "data_source": "toy"}], 4)
    solver = sorted((s for s in batch.samples if s.agent == "solver"), key=lambda s: s.traj_uid)
    assert [s.answer for s in solver] == ["42", "42", "42", "7"]
    assert all(s.answer is None for s in batch.samples if s.agent == "verifier")
    # three different texts, two different answers; the verifiers all wrote the same approval
    assert diversity_metrics(batch.samples) == {
        "diversity/distinct/solver": 3.0,
        "diversity/distinct_frac/solver": 0.75,
        "diversity/distinct_answers/solver": 2.0,
        "diversity/distinct/verifier": 1.0,
        "diversity/distinct_frac/verifier": 0.25,
    }

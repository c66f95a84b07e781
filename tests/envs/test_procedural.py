"""reasoning-gym task sources: spec parsing, row schema, train/eval overlap, grading with the generator's scorer."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("reasoning_gym")

import mas_envs  # noqa: E402
from mas_envs.data import drop_overlap, load_tasks  # noqa: E402
from mas_envs.envs.math.common import grade_solution  # noqa: E402
from mas_envs.procedural import parse_rg_spec, score_with_generator  # noqa: E402

ONE_DIGIT = "rg:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=1&operators=+,-"


def test_spec_values_are_typed_by_the_generators_config():
    name, params = parse_rg_spec(
        "rg:basic_arithmetic?size=20&seed=7&max_digits=2&operators=+,-&allow_parentheses=false"
        "&format_style=natural"
    )
    assert name == "basic_arithmetic"
    # `+` stays a plus sign (not a space, as in form encoding); lists split on commas
    assert params == {
        "size": 20,
        "seed": 7,
        "max_digits": 2,
        "operators": ("+", "-"),  # the config default is a tuple
        "allow_parentheses": False,
        "format_style": "natural",
    }
    assert parse_rg_spec("rg:letter_jumble") == ("letter_jumble", {"size": 500, "seed": 0})
    assert parse_rg_spec("rg:chain_sum?seed=%31")[1]["seed"] == 1  # percent-decoded


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("rg:", "name a generator"),
        ("rg:no_such_gen", "unknown reasoning-gym generator 'no_such_gen'"),
        ("rg:basic_arithmetic?digits=2", "has no parameter 'digits'; its parameters: allow_negation"),
        ("rg:basic_arithmetic?max_digits=two", "bad value for max_digits"),
        ("rg:basic_arithmetic?allow_negation=maybe", "expected true/false"),
        ("rg:basic_arithmetic?seed=1&seed=2", "given twice"),
        ("rg:basic_arithmetic?seed", "has no value"),
        ("rg:basic_arithmetic?min_digits=3&max_digits=1", "refused the parameters"),
    ],
)
def test_bad_specs_are_one_clear_error(spec, match):
    with pytest.raises(ValueError, match=match):
        load_tasks(spec)


def test_rows_schema_ids_and_determinism():
    rows = load_tasks(ONE_DIGIT + "&size=5&seed=1")
    assert [(r["question"], r["answer"]) for r in rows[:2]] == [
        ("Calculate 5 - 3.", "2"),
        ("Calculate 2 + -1.", "1"),
    ]
    r = rows[0]
    assert r["id"] == "rg/basic_arithmetic/1/0"
    assert r["data_source"] == "reasoning_gym/basic_arithmetic"
    assert r["grader"] == "math"
    assert r["reasoning_gym"]["name"] == "basic_arithmetic"
    assert r["reasoning_gym"]["params"]["seed"] == 1
    assert r["reasoning_gym"]["metadata"]["expression"] == "5 - 3"
    assert pickle.loads(pickle.dumps(rows)) == rows
    assert load_tasks(ONE_DIGIT + "&size=5&seed=1") == rows  # same spec, same rows
    assert load_tasks(ONE_DIGIT + "&size=5&seed=2") != rows
    assert len(load_tasks(ONE_DIGIT + "&size=5&seed=1", limit=2)) == 2
    for row in rows:  # every answer is right by the formula in its own metadata
        assert int(row["answer"]) == eval(row["reasoning_gym"]["metadata"]["expression"])


def test_drop_overlap_removes_shared_questions_and_says_how_many():
    train = [{"question": q, "answer": "0"} for q in ("What is 1+1?", "what is  2+2?", "What is 3+3?")]
    held = [{"question": "What is 2+2?", "answer": "4"}]  # same question, other case and spacing
    with pytest.warns(UserWarning, match="dropped 1 of 3 train rows"):
        kept = drop_overlap(train, held)
    assert [r["question"] for r in kept] == ["What is 1+1?", "What is 3+3?"]
    with pytest.raises(ValueError, match="all 1 train questions also appear"):
        drop_overlap(held, held)


def test_two_seeds_of_a_small_generator_overlap_and_drop_overlap_makes_them_disjoint():
    train = load_tasks(ONE_DIGIT + "&size=200&seed=1")
    held = load_tasks(ONE_DIGIT + "&size=50&seed=2")
    shared = {r["question"] for r in train} & {r["question"] for r in held}
    assert shared  # one-digit a ± b has only a few hundred questions: seeds alone do not separate sets
    with pytest.warns(UserWarning, match="dropped"):
        kept = drop_overlap(train, held)
    assert not {r["question"] for r in kept} & {r["question"] for r in held}
    assert len(kept) == len([r for r in train if r["question"] not in shared])


def test_word_tasks_are_graded_by_the_generators_own_scorer():
    rows = load_tasks("rg:letter_jumble?size=3&seed=1")
    row = rows[0]
    assert row["answer"] == "Fritz Napoleon Smith s system a system"
    assert row["grader"] == "reasoning_gym"
    assert score_with_generator(row["answer"], row) == 1.0
    assert score_with_generator("Fritz", row) < 1.0
    assert score_with_generator(None, row) == 0.0
    assert grade_solution(f"Unscrambled: \\boxed{{{row['answer']}}}", row) is True
    assert grade_solution("\\boxed{irFzt oapNlneo tmihS s esymst a mystse}", row) is False
    assert grade_solution(row["answer"], row) is False  # no \boxed{}: nothing to score


def test_an_rg_spec_works_as_an_env_task_list_and_grades_in_an_episode():
    env = mas_envs.make("math-2agent", tasks=ONE_DIGIT + "&size=10&seed=3")
    env.reset(seed=0)
    task = env.unwrapped.task
    assert task["data_source"] == "reasoning_gym/basic_arithmetic"
    gold = task["answer"]
    for action in (f"\\boxed{{{gold}}}", "<verify>approve</verify>"):
        env.step(action)
    assert env.unwrapped.infos["solver"]["success"] is True
    assert env.unwrapped.infos["verifier"]["episode_metrics"]["verifier_accuracy"] == 1.0


def test_word_task_episode_in_math_1agent():
    row = load_tasks("rg:letter_jumble?size=1&seed=1")[0]
    env = mas_envs.make("math-1agent")
    env.reset(options={"task": row})
    env.step(f"\\boxed{{{row['answer']}}}")
    assert env.unwrapped.infos["solver"]["team_reward"] == 1.0

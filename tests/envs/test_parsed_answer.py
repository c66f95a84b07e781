"""The optional env contract ``Transition.answer`` → ``infos[agent]["parsed_answer"]``: what the bundled math and
search envs report as a turn's parsed answer (normalised as they compare answers), and None elsewhere."""

from __future__ import annotations

import mas_envs
from mas_envs.envs.search import KeywordRetriever, Passage

TASK = {"id": "t", "question": "What is 999+1?", "answer": "1000", "data_source": "toy"}
THINK = "<think>reasoning</think>"
SEARCH_TASK = {
    "id": "s",
    "question": "Capital of Mongolia?",
    "golden_answers": ["Ulaanbaatar"],
    "data_source": "x",
}
PASSAGES = [Passage("p1", "Ulaanbaatar", "Ulaanbaatar is the capital of Mongolia.")]


def test_math_2agent_solver_reports_its_normalised_boxed_answer():
    env = mas_envs.make("math-2agent")
    env.reset(options={"task": TASK})
    assert env.infos["solver"]["parsed_answer"] is None  # nothing said yet
    env.step(
        "<think>\\boxed{7}</think> so \\boxed{1,000.}"
    )  # after </think>, thousands comma and dot dropped
    assert env.infos["solver"]["parsed_answer"] == "1000"
    env.step("<verify>reject</verify>")
    assert env.infos["verifier"]["parsed_answer"] is None  # a verdict is no answer
    env.step("I am not sure.")  # no box: invalid, and no answer (the earlier one is not kept)
    assert env.infos["solver"]["parsed_answer"] is None and env.infos["solver"]["invalid_action"] is True


def test_math_1agent_and_fixer_report_answers():
    env = mas_envs.make("math-1agent")
    env.reset(options={"task": TASK})
    env.step("\\boxed{ 1000 }")
    assert env.infos["solver"]["parsed_answer"] == "1000"
    env = mas_envs.make("math-fixer")
    env.reset(options={"task": TASK})
    env.step("\\boxed{$999$}")
    assert env.infos["proposer"]["parsed_answer"] == "999"
    env.step("\\boxed{\\text{1000}}")
    assert env.infos["fixer"]["parsed_answer"] == "1000"


def test_search_envs_report_the_squad_normalised_answer_of_the_answer_turn():
    env = mas_envs.make("search-3agent", retriever=KeywordRetriever(PASSAGES))
    env.reset(options={"task": SEARCH_TASK})
    env.step("<verify>no</verify>")
    env.step(f"{THINK}<search>Mongolia capital</search>")
    assert env.infos["verifier"]["parsed_answer"] is None and env.infos["searcher"]["parsed_answer"] is None
    env.step("<verify>yes</verify>")
    env.step(f"{THINK}<answer>The  Ulaanbaatar!</answer>")
    assert env.infos["answerer"]["parsed_answer"] == "ulaanbaatar"
    env = mas_envs.make("search-1agent", retriever=KeywordRetriever(PASSAGES))
    env.reset(options={"task": SEARCH_TASK})
    env.step(f"{THINK}<search>Mongolia</search>")
    assert env.infos["agent"]["parsed_answer"] is None
    env.step(f"{THINK}<answer>Ulaanbaatar.</answer>")
    assert env.infos["agent"]["parsed_answer"] == "ulaanbaatar"

"""The search envs' "fewshot" prompt style: examples as chat turns, then the live state in their shape, with
the paper's passage rendering; "paper" stays the default and unchanged; an unknown style is refused."""

from __future__ import annotations

import pytest

from mas_envs.envs.search import KeywordRetriever, Passage
from mas_envs.envs.search.prompts import FEWSHOT_EXAMPLES_3AGENT, FEWSHOT_SYSTEM
from mas_envs.envs.search.search_1agent import SYSTEM_PROMPT, SearchOneAgentEnv
from mas_envs.envs.search.search_3agent import SYSTEM_PROMPTS, SearchThreeAgentEnv

P = Passage("p0", "Tolu Marsk", '"Tolu Marsk"\nTolu Marsk was born in Kelvor.')
TASK = {"id": "t", "question": "Where was Tolu Marsk born?", "golden_answers": ["Kelvor"]}
INFO = "<information>Doc 1(Title: Tolu Marsk) Tolu Marsk was born in Kelvor.</information>"


def test_three_agent_fewshot_prompts():
    env = SearchThreeAgentEnv(retriever=KeywordRetriever([P]), topk=1, prompt_style="fewshot")
    env.reset(options={"task": TASK})
    msgs = env.prompt_messages("verifier")
    n = len(FEWSHOT_EXAMPLES_3AGENT["verifier"]) + 1  # first_turn="verify": the no-search-yet example too
    assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant"] * n + ["user"]
    assert msgs[0]["content"] == FEWSHOT_SYSTEM["verifier"]
    # verdicts of the examples: nothing searched yet (first), a 1-hop yes, a 2-hop yes after two searches, a
    # 2-hop no after one (last)
    verdicts = [m["content"].rsplit("<verify>", 1)[1] for m in msgs[2:-1:2]]
    assert verdicts == ["no</verify>", "yes</verify>", "yes</verify>", "no</verify>"]
    assert msgs[1:3] == [
        {"role": "user", "content": "Question: Where was Tolu Marsk born?\nNo search yet."},
        {"role": "assistant", "content": "Nothing is searched yet. <verify>no</verify>"},
    ]
    assert msgs[-2]["content"] == "Dulmar is not a country. <verify>no</verify>"
    assert msgs[-1]["content"] == "Question: Where was Tolu Marsk born?\nNo search yet."
    env.step("<verify>no</verify>")
    env.step("<think>t</think><search>Tolu Marsk</search>")
    for agent in ("verifier", "searcher", "answerer"):
        # the live turn has the example turns' shape: the question, then each search's information block
        assert env.prompt_messages(agent)[-1]["content"] == f"Question: {TASK['question']}\n{INFO}"
    assert env.prompt_messages("answerer")[-2]["content"].endswith("<answer>Prenia</answer>")


def test_search_first_fewshot_verifier_prompt_has_no_turn_1_example():
    # first_turn="search" (the laptop default): the verifier never sees the turn-1 state, and its prompt is the
    # one the default setting's numbers were measured with: the three examples, yes, yes, no
    verify_first = SearchThreeAgentEnv(retriever=KeywordRetriever([P]), topk=1, prompt_style="fewshot")
    search_first = SearchThreeAgentEnv(
        retriever=KeywordRetriever([P]), topk=1, prompt_style="fewshot", first_turn="search"
    )
    verify_first.reset(options={"task": TASK})
    search_first.reset(options={"task": TASK})
    verify_first.step("<verify>no</verify>")
    for env in (verify_first, search_first):
        env.step("<think>t</think><search>Tolu Marsk</search>")
    msgs = search_first.prompt_messages("verifier")
    assert [m["content"].rsplit("<verify>", 1)[1] for m in msgs[2:-1:2]] == [
        "yes</verify>",
        "yes</verify>",
        "no</verify>",
    ]
    assert verify_first.prompt_messages("verifier") == msgs[:1] + [
        {"role": "user", "content": "Question: Where was Tolu Marsk born?\nNo search yet."},
        {"role": "assistant", "content": "Nothing is searched yet. <verify>no</verify>"},
        *msgs[1:],
    ]
    for agent in ("searcher", "answerer"):  # only the verifier's examples depend on first_turn
        assert verify_first.prompt_messages(agent) == search_first.prompt_messages(agent)


def test_one_agent_fewshot_prompt_is_one_conversation():
    env = SearchOneAgentEnv(retriever=KeywordRetriever([P]), topk=1, max_turns=2, prompt_style="fewshot")
    env.reset(options={"task": TASK})
    first = env.prompt_messages("agent")
    assert first[-1] == {"role": "user", "content": "Question: Where was Tolu Marsk born?"}
    env.step("<think>t</think><search>Tolu Marsk</search>")
    msgs = env.prompt_messages("agent")
    assert msgs[: len(first)] == first  # the live conversation only grows
    assert msgs[len(first) :] == [
        {"role": "assistant", "content": "<think>t</think><search>Tolu Marsk</search>"},
        {"role": "user", "content": INFO + "\nAnswer now."},  # turn 2 of 2 is the last
    ]


def test_paper_style_is_the_default_and_unknown_styles_are_refused():
    env = SearchThreeAgentEnv(retriever=KeywordRetriever([P]))
    env.reset(options={"task": TASK})
    assert env.prompt_messages("searcher")[0]["content"] == SYSTEM_PROMPTS["searcher"]
    one = SearchOneAgentEnv(retriever=KeywordRetriever([P]))
    one.reset(options={"task": TASK})
    assert one.prompt_messages("agent")[0]["content"] == SYSTEM_PROMPT
    for cls in (SearchThreeAgentEnv, SearchOneAgentEnv):
        with pytest.raises(ValueError, match=r"prompt_style must be one of \('paper', 'fewshot'\)"):
            cls(prompt_style="tiny")

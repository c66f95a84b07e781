"""The "fewshot" prompt style of the search envs, for small models (~100M parameters).

A small model copies a format it has seen far better than it follows an instruction, and it has little context
to spare. So each agent gets a one-line system turn and worked examples as earlier chat turns (user shows the
state, assistant acts in the exact format), then the live state in the same shape. The tags, the parsing, the
passage rendering (``<information>Doc i(Title: ...) ...</information>``) and the rewards are those of the paper
style; only the text around them differs. The example names are made up (not in any generated world).

Changing any text here changes what models see: bump the env versions.
"""

from __future__ import annotations

from collections.abc import Sequence

from .common import information_block

__all__ = [
    "PROMPT_STYLES",
    "check_prompt_style",
    "fewshot_1agent_messages",
    "fewshot_3agent_messages",
    "render_history",
]

PROMPT_STYLES = ("paper", "fewshot")


def check_prompt_style(style: object) -> str:
    """Return ``style`` when it is one of :data:`PROMPT_STYLES`, else raise ``ValueError`` naming them."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {style!r}")
    return str(style)


def render_history(history: Sequence[tuple[str, str]]) -> str:
    """Past searches as the agents see them: ``Turn n: <search>q</search>`` then the information block."""
    if not history:
        return "Search history: none yet."
    lines = ["Search history:"]
    for n, (query, info) in enumerate(history, start=1):
        lines.append(f"Turn {n}: <search>{query}</search>\n{info}")
    return "\n".join(lines)


def _doc(title: str, text: str) -> str:
    return information_block(f"Doc 1(Title: {title}) {text}")


_Q1 = "Where was Tolu Marsk born?"
_Q2 = "In which country was Rina Fosk born?"
_H_TOLU = (("Tolu Marsk", _doc("Tolu Marsk", "Tolu Marsk was born in Kelvor.")),)
_H_RINA = (("Rina Fosk", _doc("Rina Fosk", "Rina Fosk was born in Dulmar.")),)
_H_RINA2 = (*_H_RINA, ("Dulmar", _doc("Dulmar", "Dulmar is a city in Prenia.")))

FEWSHOT_SYSTEM = {
    "verifier": "Say yes if the search results answer the question, else no.",
    "searcher": "Write a search query for what is still missing.",
    "answerer": "Answer the question from the search results.",
}
# (question, history, reply). Prefill of the examples is most of a turn's cost on a CPU, so each agent has the
# fewest examples that show its format: two per agent, three for the verifier: a 1-hop yes, a 2-hop yes after two
# searches and a 2-hop no after one. A small model copies the last example's verdict most: with a yes last it said
# yes 87 % of the time (accuracy 0.40), with "nothing searched → no" first and a no last it never said yes; this
# order gave 21 % yes, accuracy 0.70 (16 dev questions × 4, SmolLM2-135M, first_turn="search").
FEWSHOT_EXAMPLES_3AGENT: dict[str, tuple[tuple[str, tuple[tuple[str, str], ...], str], ...]] = {
    "verifier": (
        (_Q1, _H_TOLU, "Doc 1 says Kelvor. <verify>yes</verify>"),
        (_Q2, _H_RINA2, "Doc 2 says Prenia. <verify>yes</verify>"),
        (_Q2, _H_RINA, "Dulmar is not a country. <verify>no</verify>"),
    ),
    "searcher": (
        (_Q1, (), "<think>I need Tolu Marsk.</think><search>Tolu Marsk</search>"),
        (_Q2, _H_RINA, "<think>I need Dulmar.</think><search>Dulmar</search>"),
    ),
    "answerer": (
        (_Q1, _H_TOLU, "<think>Doc 1 says Kelvor.</think><answer>Kelvor</answer>"),
        (_Q2, _H_RINA2, "<think>Dulmar is in Prenia.</think><answer>Prenia</answer>"),
    ),
}


# The verifier's state before any search, shown only when the verifier opens turn 1 (first_turn="verify", the
# reference's order): with first_turn="search" it never sees that state, so the default setting's prompts stay
# byte-identical to the ones its measured numbers were taken with. Placed first, so the live turn-1 state matches
# an example that says no, while the last example (the one a small model copies most) stays the 2-hop no.
# Measured in the reference order (max_turns 4, first_turn/last_turn "verify", malformed_answer "continue"; 8 dev
# questions x 4, SmolLM2-135M, T = 0.6): without it the turn-1 reply had no valid verdict 94 % of the time (the
# model wrote "No search yet." with no tags; 65 % of all verdicts invalid, routed to an answerer with no evidence)
# and avg@4 was 0.03; with it turn-1 invalid 19 %, turn-1 yes 3 %, all verdicts invalid 8 %, avg@4 0.16.
FEWSHOT_VERIFIER_NO_SEARCH_YET = (_Q1, (), "Nothing is searched yet. <verify>no</verify>")


def _state(question: str, history: Sequence[tuple[str, str]]) -> str:
    """The question and the information blocks so far (the queries are left out: the blocks name their
    titles, and every token of a prompt is prefilled on each turn)."""
    if not history:
        return f"Question: {question}\nNo search yet."
    return f"Question: {question}\n" + "\n".join(info for _, info in history)


def fewshot_3agent_messages(
    agent: str, question: str, history: Sequence[tuple[str, str]], *, verify_first: bool = False
) -> list[dict[str, str]]:
    """The "fewshot" prompt of a search-3agent agent: its system line, its examples as chat turns, then the
    question and the information blocks so far in the examples' shape. The searcher does not see the
    verifier's reply (the paper style shows it): the examples show what to search without it, and it costs
    context.

    Args:
        agent: ``"verifier"``, ``"searcher"`` or ``"answerer"``.
        question: the task question.
        history: ``(query, information block)`` per search so far.
        verify_first: the verifier opens turn 1, before any search (``first_turn="verify"``): its examples
            start with :data:`FEWSHOT_VERIFIER_NO_SEARCH_YET` (no search yet → no). No effect on the other agents.
    """
    msgs = [{"role": "system", "content": FEWSHOT_SYSTEM[agent]}]
    examples = FEWSHOT_EXAMPLES_3AGENT[agent]
    if verify_first and agent == "verifier":
        examples = (FEWSHOT_VERIFIER_NO_SEARCH_YET, *examples)
    for q, h, reply in examples:
        msgs += [{"role": "user", "content": _state(q, h)}, {"role": "assistant", "content": reply}]
    msgs.append({"role": "user", "content": _state(question, history)})
    return msgs


FEWSHOT_SYSTEM_1AGENT = "Search for what you need, then answer the question."
# One example conversation per hop count: assistant acts, the env's reply is the next user turn.
# One example conversation, a 2-hop one (it shows a search, a second search and an answer): assistant acts,
# the env's reply is the next user turn.
FEWSHOT_EXAMPLES_1AGENT: tuple[tuple[str, ...], ...] = (
    (
        _Q2,
        "<think>I need Rina Fosk.</think><search>Rina Fosk</search>",
        _H_RINA2[0][1],
        "<think>I need Dulmar.</think><search>Dulmar</search>",
        _H_RINA2[1][1],
        "<think>Dulmar is in Prenia.</think><answer>Prenia</answer>",
    ),
)
FEWSHOT_LAST_TURN_1AGENT = "Answer now."


def fewshot_1agent_messages(question: str, steps: Sequence[str], last: bool) -> list[dict[str, str]]:
    """The "fewshot" prompt of search-1agent: a system line, the example conversations, then the live one
    (the question, and each earlier action as an assistant turn followed by the env's reply as a user turn).

    Args:
        question: the task question.
        steps: the agent's earlier actions and the env's replies, alternating (action first).
        last: this is the last turn: ``Answer now.`` is added to the live turn.
    """
    msgs = [{"role": "system", "content": FEWSHOT_SYSTEM_1AGENT}]
    for conv in FEWSHOT_EXAMPLES_1AGENT:
        msgs.append({"role": "user", "content": f"Question: {conv[0]}"})
        for i, text in enumerate(conv[1:]):
            msgs.append({"role": "assistant" if i % 2 == 0 else "user", "content": text})
    msgs.append({"role": "user", "content": f"Question: {question}"})
    for i, text in enumerate(steps):
        msgs.append({"role": "assistant" if i % 2 == 0 else "user", "content": text})
    if last:
        msgs[-1] = {**msgs[-1], "content": msgs[-1]["content"] + "\n" + FEWSHOT_LAST_TURN_1AGENT}
    return msgs

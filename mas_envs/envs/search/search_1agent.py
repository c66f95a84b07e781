"""search-1agent: one agent thinks, then searches or answers, turn after turn (Search-R1 style baseline).

| | |
|---|---|
| Creation | `mas_envs.make("search-1agent", retriever=None, topk=3, max_turns=4, prompt_style="paper")` |
| Agents | `agent` |
| Turn order | `agent` every turn |
| Observation | the prompt: instructions, question, and the agent's earlier turns with their `<information>` blocks |
| Action | `<think>…</think>` then `<search>query</search>` or `<answer>…</answer>` |
| Reward | R = exact match (SQuAD normalisation) of the answer against `golden_answers`; `-c` (default 0.01) on an invalid turn |
| Termination | the agent answered |
| Truncation | `max_turns` turns without an answer (R = 0) |
| infos at the end | `team_reward`, `success`, `f1`, `answer`, `num_searches`, `episode_metrics`: `searches`, `retrieval_errors`, `evidence_hit`, `answer_em`, `answer_f1`, `turns/agent` (as in `search-3agent`); `role_rewards` (below) |

Each turn the first action tag decides: a search runs the retriever and appends the query and an
`<information>` block to the transcript the agent sees next turn; an answer ends the episode (the last
`<answer>` block is graded). A turn with no complete action tag is invalid and the env adds a reminder of the
format (as Search-R1 does). The prompt of the last turn tells the agent to answer now; a search on the last
turn is still run, but the episode then ends by truncation with R = 0, as in Search-R1. Parsing rules are in
`mas_envs.envs.search.common`; arguments as in `search-3agent` (a query is cut to its first 512
characters before it is searched; a task without a usable gold answer makes `reset` raise `ValueError`).

**Role rewards** (`infos["agent"]["role_rewards"]` at the end, turn -> score, never in the returns; the rules
of `search-3agent`, docs/envs.md "Role rewards"): a search turn scores 1 if its query returned a passage not
retrieved earlier that contains a golden answer or is a gold passage (`supporting_ids`), else 0; the answer
turn scores its EM; a turn with neither action (or an empty query) scores 0. A format fault of an action still
carried out costs c and does not zero the score.

`prompt_style="fewshot"` (small models, `mas_envs.envs.search.prompts`): a one-line system turn, two example
conversations (a 1-hop and a 2-hop one: search, passages as the next user turn, answer), then the live
conversation in that shape, each action an assistant turn and each `<information>` block or format reminder
a user turn; `Answer now.` on the last turn.

**Version history.** v0: first version; `prompt_style`, the episode metrics besides `retrieval_errors` and
the role scores (side information) added later (the default, `"paper"`, is the v0 prompt unchanged;
observations and returns did not change).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from mas_envs.core import GoldenEpisode, Outcome, Transition, wrap

from .base import SearchEnv
from .common import (
    answer_key,
    golden_answers_of,
    information_block,
    parse_action,
    score_answer,
)
from .prompts import fewshot_1agent_messages
from .retriever import KeywordRetriever, Passage, Retriever

__all__ = ["SearchOneAgentEnv", "env", "raw_env"]

AGENT = "agent"

SYSTEM_PROMPT = (
    "Answer the given question. First reason step by step inside <think> </think> every time you receive new "
    "information. If you lack knowledge, call the search engine with <search> query </search>; the results come "
    "back between <information> and </information>. You may search several times. When you know the answer, give "
    "only the short answer inside <answer> </answer> (a name, a date, a number, or yes/no) without explanation, "
    "e.g. <answer> Beijing </answer>. Each turn ends with exactly one <search> or one <answer>."
)
_FORMAT_REMINDER = (
    "My previous action is invalid. To search, I should put the query between <search> and </search>; "
    "to answer, I should put the answer between <answer> and </answer>."
)


class SearchOneAgentEnv(SearchEnv):
    """Single-agent think → search | answer loop (see the module docstring)."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "search_1agent_v0",
        "render_modes": ["ansi"],
        "is_parallelizable": False,
    }
    possible_agents = (AGENT,)
    stop_strings: ClassVar[dict[str, tuple[str, ...]]] = {AGENT: ("</search>", "</answer>")}
    fuzz_fragments: ClassVar[dict[str, tuple[str, ...]]] = {
        AGENT: ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "Paris")
    }
    default_invalid_action_penalty: ClassVar[float] = 0.01
    role_reward_agents: ClassVar[tuple[str, ...]] = (AGENT,)
    default_tasks: ClassVar[str | None] = "hotpotqa"  # the bundled train split (100 questions)
    default_eval_tasks: ClassVar[str] = (
        "hotpotqa-dev"  # the other 50: no question shared with the train split
    )

    def __init__(
        self,
        *,
        retriever: Retriever | str | Sequence[str] | None = None,
        topk: int = 3,
        max_turns: int = 4,
        prompt_style: str = "paper",
        tasks: Sequence[dict[str, Any]] | str | None = None,
        invalid_action_penalty: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            retriever=retriever,
            topk=topk,
            prompt_style=prompt_style,
            max_turns=max_turns,  # one agent action per turn, so the base's cap is the turn cap
            tasks=tasks,
            invalid_action_penalty=invalid_action_penalty,
            render_mode=render_mode,
        )

    def start_episode(self, task: dict[str, Any]) -> str:
        golden_answers_of(task)  # a task without a usable gold answer fails here, not at episode end
        self.steps: list[str] = []  # the agent's turns and the env's replies, in order
        self.answer: str | None = None
        self.num_searches = 0
        return AGENT

    def apply_action(self, agent: str, action: str) -> Transition:
        parsed = parse_action(action, allowed=("search", "answer"))
        self.steps.append(action)
        self.role_scores[self.turn] = 0.0  # a turn that neither searches nor answers; the rest overwrite it
        if parsed.kind == "answer":
            self.answer = parsed.content
            self.role_scores[self.turn] = score_answer(self.answer, self.current_task)[0]
            return Transition(invalid=parsed.invalid, next_agent=None, answer=answer_key(self.answer))
        if parsed.kind == "search" and parsed.content:
            body = self._search(parsed.content)
            self.num_searches += 1
            reply = information_block(body)
        else:
            reply = _FORMAT_REMINDER
        self.steps.append(reply)
        self._note_after(reply)
        return Transition(invalid=parsed.invalid, next_agent=AGENT)

    def episode_outcome(self) -> Outcome:
        em, f1 = score_answer(self.answer, self.current_task)
        self.infos[AGENT].update({"f1": f1, "answer": self.answer, "num_searches": self.num_searches})
        return Outcome(
            team_reward=em,
            success=em == 1.0,
            metrics=self.search_metrics(self.answer),
            role_rewards=dict(self.role_scores),
        )

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        turn = len(self.steps) // 2 + 1
        last = self.max_turns is not None and turn >= self.max_turns
        if self.prompt_style == "fewshot":
            return fewshot_1agent_messages(self.current_task["question"], self.steps, last)
        parts = [f"Question: {self.current_task['question']}"]
        if self.steps:
            parts.append("Your turns so far:\n" + "\n".join(self.steps))
        parts.append(
            f"This is turn {turn} of {self.max_turns}."
            + (" It is your last turn: answer now with <answer>...</answer>." if last else "")
        )
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]

    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        passages = [Passage("p1", "Ulaanbaatar", '"Ulaanbaatar"\nUlaanbaatar is the capital of Mongolia.')]
        kwargs = {"retriever": KeywordRetriever(passages)}
        task = {
            "id": "golden-1",
            "question": "What is the capital of Mongolia?",
            "golden_answers": ["Ulaanbaatar"],
            "data_source": "golden",
        }
        c = cls.default_invalid_action_penalty
        return [
            GoldenEpisode(
                name="search then correct answer",
                task=task,
                actions=(
                    "<think>look it up</think><search>capital of Mongolia</search>",
                    "<think>doc 1 says it</think><answer>Ulaanbaatar</answer>",
                ),
                agents=(AGENT, AGENT),
                returns={AGENT: 1.0},
                team_reward=1.0,
                success=True,
                env_kwargs=kwargs,
                role_rewards={0: 1.0, 1: 1.0},  # the search finds the answer; EM 1
            ),
            GoldenEpisode(
                name="malformed turn, then max_turns=2 runs out on a search",
                task=task,
                actions=("just text", "<think>t</think><search>Mongolia</search>"),
                agents=(AGENT, AGENT),
                returns={AGENT: -c},
                team_reward=0.0,
                success=False,
                env_kwargs={**kwargs, "max_turns": 2},
                truncated=True,
                role_rewards={0: 0.0, 1: 1.0},  # no action scores 0; the last-turn search still found it
            ),
        ]


def raw_env(**kwargs: Any) -> SearchOneAgentEnv:
    """The env without wrappers."""
    return SearchOneAgentEnv(**kwargs)


def env(**kwargs: Any):
    """The env with PettingZoo's order-enforcing wrapper (what `mas_envs.make` returns)."""
    return wrap(SearchOneAgentEnv(**kwargs))

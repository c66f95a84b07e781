"""search-3agent: a verifier routes each turn to a searcher or an answerer (Dr. MAS search task).

| | |
|---|---|
| Creation | `mas_envs.make("search-3agent", retriever=None, topk=3, max_turns=4, first_turn="verify", last_turn="answer", malformed_answer="end", prompt_style="paper")` |
| Agents | `verifier`, `searcher`, `answerer` |
| Turn order | each turn: `verifier` → (`no`) `searcher` → next turn, or (`yes`) `answerer` → end (with `malformed_answer="continue"`, an answerer reply without an answer → next turn) |
| Observation | the agent's prompt: question, every past query with its `<information>` block, role instructions |
| Action | any text. verifier: reasoning ending in `<verify>yes</verify>` or `<verify>no</verify>`; searcher: `<think>…</think><search>query</search>`; answerer: `<think>…</think><answer>…</answer>` |
| Reward | R = exact match of the answer against `golden_answers` after SQuAD normalisation (0 without an answer), to every agent at the end; `-c` (default c = 0.01) to an agent on an invalid action |
| Termination | the answerer acted (with `malformed_answer="continue"`: gave an answer, or acted on the last turn), or, with `last_turn="verify"`, the verifier said no on the last turn |
| Truncation | never: the last turn always ends in a termination |
| infos at the end | `team_reward`, `success` (EM = 1), `f1` (token F1, SQuAD), `answer` (graded text or `None`), `num_searches`, `episode_metrics` and `role_rewards` (below) |

**Turns.** A turn is one verifier decision plus the action it routes to, as in the reference
(`env.max_steps`); `infos[a]["turn"]` still counts single agent actions, as in every `mas_envs` env.
Turn `t` of `max_turns`:

* `t < max_turns`: the verifier decides. `no` → the searcher writes a query; the env runs the retriever
  (top-`topk`) and appends the query and an `<information>` block to the history every agent sees; then turn
  `t + 1`. `yes` → the answerer answers and the episode ends.
* `t == 1`, `first_turn="search"`: nothing has been searched, so there is nothing to verify; the verifier is
  not asked and the searcher writes the first query (the verifier's first verdict comes after the first search).
  `first_turn="verify"` (default, the reference) asks the verifier on turn 1 too.
* `t == max_turns`, `last_turn="answer"` (default): there is nothing left to decide, so the verifier is not
  asked; the answerer answers from the evidence gathered. Every episode therefore ends with an answer.
* `t == max_turns`, `last_turn="verify"` (the reference's behaviour): the verifier is asked; `yes` → the
  answerer answers, `no` → the episode ends with no answer and R = 0. The reference makes a late `no` worth
  nothing; this option reproduces it exactly for comparison with the paper.
* An answerer reply that gives no answer (no complete `<answer>…</answer>` block, or a `<search>` tag before
  it: the parse yields no graded answer; a graded answer without `<think>` still ends the episode, penalised).
  `malformed_answer="end"` (default): the episode ends with R = 0. `malformed_answer="continue"` (the
  reference's behaviour: its answer agent's reply without an answer becomes the empty env action, and its env
  ends an episode only on an `<answer>` action or at the turn limit): the answerer gets the penalty c and turn
  `t + 1` starts, as if the answerer had not been asked: the search history is unchanged (so in the paper style
  its "Turn n" labels then count searches, not turns); on turn `max_turns` the episode ends with R = 0. So the
  answerer can act more than once per episode. (A history note "No answer was given" was tried: SmolLM2-135M's
  verifier, answerer and searcher copied it into their replies.)

**Parsing** (see `mas_envs.envs.search.common`). Verifier: the verdict is the first complete
`<verify>…</verify>` block (generation stops at `</verify>`), lower-cased; anything but `yes`/`no` is
invalid and routes to the answerer (the reference's default). Searcher and answerer: the first action tag
decides the action type, the last `<answer>` block is the graded answer, `<think>` is required once; a
searcher that answers instead is invalid and no search happens. A retriever failure becomes
`<information>Search error: …</information>` and the episode goes on.

**What each agent sees.** All three see the question and the whole search history. The searcher also sees
the verifier's reply of this turn (its teammate's reasoning, as in the reference); the answerer does not.

**Episode metrics** (`infos[agent]["episode_metrics"]`, logged as `env/<name>` and `eval/env/<name>`):
`searches` (retriever calls), `retrieval_errors` (failed ones), `evidence_hit` (1 if a retrieved passage
contains a golden answer, SQuAD-normalised, whole words), `answer_em`, `answer_f1`, `turns/verifier`,
`turns/searcher`, `turns/answerer` (actions per agent), over the episode's valid verdicts
`verifier_accuracy` (a verdict is right when it says yes exactly when the passages retrieved so far contain the
answer) and `verifier_yes_rate` (both absent without a valid verdict), and `verifier_yes_turn1`: 1 if the
verifier's turn-1 reply is a `yes` verdict (before any search), 0 if it is `no` or no verdict; absent when the
verifier is not asked on turn 1 (`first_turn="search"`, or `max_turns=1` with `last_turn="answer"`). Its mean
is the fraction of episodes whose verifier said yes before any search.

**Role rewards** (`Outcome.role_rewards`, `infos[agent]["role_rewards"]` at the end, turn -> score; they
never enter the returns, a trainer weighs them in with `agents.<agent>.reward_weights`; docs/envs.md "Role
rewards"). Every action turn of all three agents gets one:

* verifier: 1 if its verdict is right (`yes` exactly when the passages retrieved so far contain a golden
  answer: the `verifier_accuracy` rule, computed once per verdict for both), else 0; no `yes`/`no` verdict: 0;
* searcher: 1 if its query returned a passage not retrieved earlier in the episode that contains a golden
  answer or is a gold passage (id in the task's `supporting_ids`, title in its `supporting_titles` when
  given; `common.search_found_evidence`), else 0; no search run (or a failed one): 0. On a 2-hop question
  the search for the bridge passage and the one for the answer passage both score; a repeat does not;
* answerer: EM of the graded answer (R itself); 0 without an answer.

A format fault of an action that was still carried out (a search or answer without `<think>`) costs the
penalty c, as in the returns, and does not zero the score.

**Prompt styles.** `prompt_style="paper"` (default): the prompts above, right for 4B+ models and the paper's
runs. `"fewshot"`, for ~100M models (`mas_envs.envs.search.prompts`): a one-line system turn and worked
examples as earlier chat turns (question and search history → the reply in the exact format), then the live
question and search history in the same shape; the searcher does not see the verifier's reply. With
`first_turn="verify"` the verifier's examples start with the turn-1 state ("No search yet." → no); with
`first_turn="search"` it never sees that state and its prompt is unchanged. Tags, parsing,
passage rendering, rewards and turn order are the same in both.

**Arguments.** `retriever`: an object with `search(queries, topk)`, a URL or list of URLs of a
`mas-index serve` / Search-R1 server, an index directory, a `multihop?seed=N` spec (FAISS over the generated
world's corpus, `mas_envs.envs.search.multihop`), or `None` for the bundled HotpotQA index (built on
first use from shipped embeddings; needs the `search` extra). `topk` passages per search. `max_turns` turns.
`first_turn`, `last_turn` and `malformed_answer` as above. A query is cut to its first 512 characters (`MAX_QUERY_CHARS`) before it is
searched, without penalty; the history shows the cut query. A task needs a usable gold answer (`golden_answers`
or `answer`: a string, a number or a list of them), else `reset` raises `ValueError`. `tasks`, `invalid_action_penalty`, `render_mode` as in `TextAECEnv`.

**Version history.** v0: first version; `prompt_style`, the episode metrics besides `retrieval_errors` and
the role scores (`infos[agent]["role_rewards"]`, side information), `first_turn`, `malformed_answer` and
`verifier_yes_turn1` added later; the fewshot verifier's turn-1 example (only with `first_turn="verify"`) too (the default, `"paper"`, is the
v0 prompt unchanged, and parsing, observations and returns did not change).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from mas_envs.core import GoldenEpisode, Outcome, Transition, wrap

from .base import SearchEnv
from .common import (
    answer_key,
    clip_query,
    first_block,
    golden_answers_of,
    information_block,
    parse_action,
    score_answer,
)
from .prompts import fewshot_3agent_messages, render_history
from .retriever import KeywordRetriever, Passage, Retriever

__all__ = ["SearchThreeAgentEnv", "env", "raw_env"]

VERIFIER, SEARCHER, ANSWERER = "verifier", "searcher", "answerer"

_TEAM = (
    "You are the {role} of a three-agent team (Verifier, Searcher, Answerer) that answers questions with the "
    "help of a search engine. The team works in turns: each turn the Verifier decides whether the information "
    "gathered so far is enough; if not, the Searcher issues one search query and the results are added to the "
    "shared history; if it is, the Answerer gives the final answer."
)
SYSTEM_PROMPTS = {
    VERIFIER: _TEAM.format(role="Verifier")
    + " Review the past queries (in <search> tags) and the retrieved passages (in <information> tags): were the"
    " queries precise and on target, were any repeated, vague or off-topic, and does the information contain"
    " everything the answer needs? Reason step by step, then end your reply with <verify>yes</verify> if the"
    " information is sufficient to answer, or <verify>no</verify> if the team must search again.",
    SEARCHER: _TEAM.format(role="Searcher")
    + " Your job is to write the next search query. Think step by step inside <think> </think> about what is"
    " still missing, using the question, the previous queries and results, and the Verifier's assessment. Then"
    " give exactly one query inside <search> </search>, e.g. <think>...</think><search>capital of"
    " Mongolia</search>. Do not answer the question yourself.",
    ANSWERER: _TEAM.format(role="Answerer")
    + " Your job is to give the final answer. Think step by step inside <think> </think>, combining the"
    " retrieved information with your own knowledge. Then give only the short answer inside <answer> </answer>"
    " (a name, a date, a number, or yes/no), e.g. <think>...</think><answer>Ulaanbaatar</answer>. The answer is"
    " graded by exact match, so write no explanation inside the answer tags.",
}


class SearchThreeAgentEnv(SearchEnv):
    """Verifier → searcher | answerer multi-turn search QA (see the module docstring)."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "search_3agent_v0",
        "render_modes": ["ansi"],
        "is_parallelizable": False,
    }
    possible_agents = (VERIFIER, SEARCHER, ANSWERER)
    stop_strings: ClassVar[dict[str, tuple[str, ...]]] = {
        VERIFIER: ("</verify>",),
        SEARCHER: ("</search>",),
        ANSWERER: ("</answer>",),
    }
    fuzz_fragments: ClassVar[dict[str, tuple[str, ...]]] = {
        VERIFIER: ("<verify>yes</verify>", "<verify>no</verify>", "<verify>", "maybe"),
        SEARCHER: ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "Paris"),
        ANSWERER: ("<think>", "</think>", "<answer>", "</answer>", "<search>", "yes"),
    }
    default_invalid_action_penalty: ClassVar[float] = 0.01
    role_reward_agents: ClassVar[tuple[str, ...]] = (VERIFIER, SEARCHER, ANSWERER)
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
        first_turn: str = "verify",
        last_turn: str = "answer",
        malformed_answer: str = "end",
        prompt_style: str = "paper",
        tasks: Sequence[dict[str, Any]] | str | None = None,
        invalid_action_penalty: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if first_turn not in ("verify", "search"):
            raise ValueError(f"first_turn must be 'verify' or 'search', got {first_turn!r}")
        if last_turn not in ("answer", "verify"):
            raise ValueError(f"last_turn must be 'answer' or 'verify', got {last_turn!r}")
        if malformed_answer not in ("end", "continue"):
            raise ValueError(f"malformed_answer must be 'end' or 'continue', got {malformed_answer!r}")
        super().__init__(
            retriever=retriever,
            topk=topk,
            prompt_style=prompt_style,
            max_turns=None,  # the turn cap counts verifier turns, handled here; the base counts agent actions
            tasks=tasks,
            invalid_action_penalty=invalid_action_penalty,
            render_mode=render_mode,
        )
        self.turn_limit = max_turns
        self.first_turn = first_turn
        self.last_turn = last_turn
        self.malformed_answer = malformed_answer

    # --- episode logic -----------------------------------------------------------------------------------
    def start_episode(self, task: dict[str, Any]) -> str:
        golden_answers_of(task)  # a task without a usable gold answer fails here, not at episode end
        self.search_turn = 1  # 1-based turn in the reference's sense
        self.history: list[tuple[str, str]] = []
        self.verifier_reply: str | None = None
        self.answer: str | None = None
        self.verdicts: list[tuple[bool, bool]] = []  # (said yes, right: yes exactly when the evidence has it)
        self.yes_turn1: bool | None = None  # the verifier's turn-1 reply was a yes verdict; None: not asked
        return self._turn_opener()

    def _turn_opener(self) -> str:
        last = self.search_turn >= self.turn_limit
        if last and self.last_turn == "answer":
            return ANSWERER
        if self.search_turn == 1 and self.first_turn == "search":
            return SEARCHER
        return VERIFIER

    def apply_action(self, agent: str, action: str) -> Transition:
        if agent == VERIFIER:
            self.verifier_reply = action
            verdict = first_block(action, "verify")
            verdict = verdict.lower() if verdict is not None else None
            invalid = verdict not in ("yes", "no")
            right = not invalid and (verdict == "yes") == self.evidence_has_answer()
            if not invalid:  # one rule for the metric and the role score; a reply without a verdict scores 0
                self.verdicts.append((verdict == "yes", right))
            if self.search_turn == 1:
                self.yes_turn1 = verdict == "yes"
            self.role_scores[self.turn] = float(right)
            if verdict == "no":
                if self.search_turn >= self.turn_limit:
                    return Transition(invalid=False, next_agent=None)  # last_turn="verify": no answer
                return Transition(invalid=False, next_agent=SEARCHER)
            return Transition(invalid=invalid, next_agent=ANSWERER)
        if agent == SEARCHER:
            parsed = parse_action(action, allowed=("search",))
            if parsed.kind == "search" and parsed.content:
                query = clip_query(parsed.content)
                body = self._search(query)
                info = information_block(body)
                self.history.append((query, info))
                self._note_after(info)
            else:
                info = information_block(f"No search was run: {parsed.reason}.")
                self.history.append(("", info))
                self._note_after(info)
                self.role_scores[self.turn] = 0.0
            self.search_turn += 1
            self.verifier_reply = None
            return Transition(invalid=parsed.invalid, next_agent=self._turn_opener())
        parsed = parse_action(action, allowed=("answer",))
        self.answer = parsed.content if parsed.kind == "answer" else None
        self.role_scores[self.turn] = score_answer(self.answer, self.current_task)[0]
        if self.answer is None and self.malformed_answer == "continue" and self.search_turn < self.turn_limit:
            # the reference: no answer is the empty action, the episode goes on to the next turn; nothing is
            # added to the history (a note there was copied by the 135M agents into their replies)
            self.search_turn += 1
            self.verifier_reply = None
            return Transition(invalid=True, next_agent=self._turn_opener())
        return Transition(invalid=parsed.invalid, next_agent=None, answer=answer_key(self.answer))

    def episode_outcome(self) -> Outcome:
        em, f1 = score_answer(self.answer, self.current_task)
        for a in self.agents:
            self.infos[a].update(
                {"f1": f1, "answer": self.answer, "num_searches": sum(1 for q, _ in self.history if q)}
            )
        metrics = self.search_metrics(self.answer)
        if self.verdicts:
            metrics["verifier_accuracy"] = sum(right for _, right in self.verdicts) / len(self.verdicts)
            metrics["verifier_yes_rate"] = sum(y for y, _ in self.verdicts) / len(self.verdicts)
        if self.yes_turn1 is not None:
            metrics["verifier_yes_turn1"] = float(self.yes_turn1)
        return Outcome(
            team_reward=em, success=em == 1.0, metrics=metrics, role_rewards=dict(self.role_scores)
        )

    # --- prompts -----------------------------------------------------------------------------------------
    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        if self.prompt_style == "fewshot":
            return fewshot_3agent_messages(
                agent, self.current_task["question"], self.history, verify_first=self.first_turn == "verify"
            )
        parts = [f"Question: {self.current_task['question']}", render_history(self.history)]
        if agent == SEARCHER and self.verifier_reply is not None:
            parts.append(f"The Verifier's assessment this turn:\n{self.verifier_reply}")
        turn = f"This is turn {self.search_turn} of {self.turn_limit}."
        last = self.search_turn >= self.turn_limit
        if agent == VERIFIER:
            tail = " If you answer no now, the team gives no answer." if last else ""
            parts.append(f"{turn}{tail} Decide: <verify>yes</verify> or <verify>no</verify>.")
        elif agent == SEARCHER:
            parts.append(f"{turn} Write the next query: <think>...</think><search>query</search>.")
        else:
            parts.append(f"{turn} Give the final answer: <think>...</think><answer>short answer</answer>.")
        return [
            {"role": "system", "content": SYSTEM_PROMPTS[agent]},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    # --- scripted episodes for mas_envs.testing.check_env ------------------------------------------------
    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        passages = [
            Passage("p1", "Ulaanbaatar", '"Ulaanbaatar"\nUlaanbaatar is the capital of Mongolia.'),
            Passage("p2", "Paris", '"Paris"\nParis is the capital of France.'),
        ]
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
                name="no -> search -> yes -> correct answer",
                task=task,
                actions=(
                    "Nothing known yet. <verify>no</verify>",
                    "<think>need the capital</think><search>capital of Mongolia</search>",
                    "The passage names it. <verify>yes</verify>",
                    "<think>from doc 1</think><answer>Ulaanbaatar</answer>",
                ),
                agents=(VERIFIER, SEARCHER, VERIFIER, ANSWERER),
                returns={VERIFIER: 1.0, SEARCHER: 1.0, ANSWERER: 1.0},
                team_reward=1.0,
                success=True,
                env_kwargs=kwargs,
                # no before any evidence (right), the query finds the answer, yes with it (right), EM 1
                role_rewards={0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0},
            ),
            GoldenEpisode(
                name="invalid verdict routes to the answerer, wrong answer",
                task=task,
                actions=("I think so.", "<think>guess</think><answer>Paris</answer>"),
                agents=(VERIFIER, ANSWERER),
                returns={VERIFIER: -c, SEARCHER: 0.0, ANSWERER: 0.0},
                team_reward=0.0,
                success=False,
                env_kwargs=kwargs,
                role_rewards={0: 0.0, 1: 0.0},  # no verdict scores 0; EM 0
            ),
            GoldenEpisode(
                name="max_turns=2: no, search without think, forced answer on the last turn",
                task=task,
                actions=(
                    "<verify>no</verify>",
                    "<search>Mongolia capital</search>",
                    "<think>ok</think><answer>the Ulaanbaatar</answer>",
                ),
                agents=(VERIFIER, SEARCHER, ANSWERER),
                returns={VERIFIER: 1.0, SEARCHER: 1.0 - c, ANSWERER: 1.0},
                team_reward=1.0,
                success=True,
                env_kwargs={**kwargs, "max_turns": 2},
                # the search without <think> is penalised by c but still ran and found the answer: scored 1
                role_rewards={0: 1.0, 1: 1.0, 2: 1.0},
            ),
            GoldenEpisode(
                name="malformed_answer=continue: yes before evidence, no answer, the next turn searches, answer",
                task=task,
                actions=(
                    "<verify>yes</verify>",
                    "I do not know.",
                    "<verify>no</verify>",
                    "<think>need the capital</think><search>capital of Mongolia</search>",
                    "<verify>yes</verify>",
                    "<think>from doc 1</think><answer>Ulaanbaatar</answer>",
                ),
                agents=(VERIFIER, ANSWERER, VERIFIER, SEARCHER, VERIFIER, ANSWERER),
                # the answer-less reply costs the answerer c and one turn (turn 1), not the episode
                returns={VERIFIER: 1.0, SEARCHER: 1.0, ANSWERER: 1.0 - c},
                team_reward=1.0,
                success=True,
                env_kwargs={**kwargs, "malformed_answer": "continue"},
                # yes with nothing retrieved: wrong (0); no answer: 0; then no (right), a finding search, yes, EM 1
                role_rewards={0: 0.0, 1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0},
            ),
            GoldenEpisode(
                name="reference order (max_turns=2, last_turn=verify, continue): no answer twice, R = 0",
                task=task,
                actions=(
                    "I think so.",
                    "<think>hm</think>",
                    "<verify>yes</verify>",
                    "Ulaanbaatar",
                ),
                agents=(VERIFIER, ANSWERER, VERIFIER, ANSWERER),
                # the invalid verdict routes to the answerer; its answer-less reply on turn 1 goes on to turn 2,
                # on the last turn it ends the episode with no answer
                returns={VERIFIER: -c, SEARCHER: 0.0, ANSWERER: -2 * c},
                team_reward=0.0,
                success=False,
                env_kwargs={
                    **kwargs,
                    "max_turns": 2,
                    "first_turn": "verify",
                    "last_turn": "verify",
                    "malformed_answer": "continue",
                },
                role_rewards={0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0},
            ),
        ]


def raw_env(**kwargs: Any) -> SearchThreeAgentEnv:
    """The env without wrappers."""
    return SearchThreeAgentEnv(**kwargs)


def env(**kwargs: Any):
    """The env with PettingZoo's order-enforcing wrapper (what `mas_envs.make` returns)."""
    return wrap(SearchThreeAgentEnv(**kwargs))

r"""# Math, two agents (`mas/math-2agent-v0`)

A solver and a verifier solve a math problem together (the Dr. MAS math setting).

| | |
|---|---|
| Creation | `mas_envs.make("math-2agent")` |
| Agents | `solver`, `verifier` |
| Turn order | solver → verifier → (on reject) solver → ... ; at most `max_loops` solver turns, and no verifier turn follows the last one, so with `max_loops=2` an episode is *solver, verifier(approve)* or *solver, verifier(reject), solver* (at most `2·max_loops − 1` turns) |
| Observation | the agent's prompt (`str`): the problem, the team history (every earlier solver attempt and verifier review) and its role; `infos[agent]["messages"]` holds it as chat messages |
| Action | any `str`. Solver: valid when a balanced `\boxed{...}` stands after its last `</think>`. Verifier: valid when it contains `<verify>approve</verify>` or `<verify>reject</verify>` (case and spaces inside the tag ignored; the last verdict counts) |
| Reward | team reward R = 1 if the last solver answer is correct (`mas_envs.rewards.grade_math`), else 0, to both agents at the end; an invalid action gets `-c` on that turn (default c = 0.1) |
| Termination | verifier approves, or the solver used its `max_loops` turns |
| Truncation | never |
| Stop strings | verifier: `</verify>`; solver: none |
| Default tasks | `gsm8k-train` (bundled) |

## A missing verdict
A verifier reply with no verdict tag is an invalid action (penalised with `-c`) and is routed as **reject**:
the solver gets another turn while it has turns left. A verifier that did not finish its review has not
vouched for the answer, and re-checking costs one solver turn at most. The reference implementation treats a
missing verdict as approve; pass `missing_verdict="approve"` to reproduce it.

## Episode metrics
Reported at the end in `infos[agent]["episode_metrics"]` (logged as `env/<name>`, `eval/env/<name>`):

| name | value |
|---|---|
| `solver_turns` | solver turns in the episode (1 … `max_loops`) |
| `verifier_accuracy` | over the episode's valid verdicts: the fraction that were right, i.e. approve of a correct attempt or reject of a wrong one (each reviewed attempt graded like the final answer). Absent when the verifier gave no valid verdict |
| `verifier_approve_rate` | fraction of the valid verdicts that approve. Absent with no valid verdict |
| `rejection_fixed` | only in episodes where the verifier rejected a wrong attempt: 1 if the final answer is correct, else 0 (its mean is how often a rightful rejection led to a corrected answer) |

## Role rewards
`Outcome.role_rewards` (docs/envs.md "Role rewards") scores every turn of both agents by its role, whatever
the team reward:

| agent | role score of a turn |
|---|---|
| `solver` | 1 if that attempt is correct (graded like the final answer), else 0 — also for an attempt the verifier approved or rejected, not only the last one |
| `verifier` | 1 if its verdict was right (approve of a correct attempt, reject of a wrong one), else 0; a reply with no verdict tag scores 0 |

They change nothing unless a trainer weighs them in (`agents.<agent>.reward_weights` in mas-train).

## Prompt styles
`prompt_style="paper"` (default): the system line names the agent's role; one user turn holds the problem,
the whole team history (every attempt and review) and the role's instructions. Right for Qwen3-4B-scale
models and the paper's runs.

`prompt_style="fewshot"`, for small models (~100M parameters), which copy a format they have seen far better
than they follow instructions and have little context to spare:
* solver: two worked examples as earlier chat turns (`What is 2 + 3?` → `2 + 3 = 5. \boxed{5}`), then the
  bare problem; after a rejection, its earlier attempt as an assistant turn and a user turn
  `That answer is wrong. Try again: <problem>`;
* verifier: a one-line system turn (`Check the answer.`) and four example verdicts as earlier chat turns
  (approve, reject, reject, approve; each a one-line check ending in the tag), then
  `<problem>\n<the solver's latest answer, think block dropped, its last 400 characters>`. It does not see
  older attempts or reviews.

The tags, parsing, rewards and turn order are the same in both styles.

## Arguments
`max_loops` (most solver turns, default 2), `missing_verdict` (`"reject"` or `"approve"`, default
`"reject"`), `prompt_style` (`"paper"` or `"fewshot"`, default `"paper"`), `tasks` (rows, bundled set name or path; default `"gsm8k-train"`), `invalid_action_penalty`
(c, default 0.1), `render_mode` (`None` or `"ansi"`).

## Version history
* v0: initial release; `prompt_style` added later (the default, `"paper"`, is the v0 prompt unchanged).
"""

from __future__ import annotations

import re
from typing import Any

from mas_envs.core import GoldenEpisode, Outcome, TextAECEnv, Transition, wrap
from mas_envs.envs.math import prompts
from mas_envs.envs.math.common import (
    MATH_FUZZ,
    check_prompt_style,
    fewshot_solver_messages,
    fewshot_verifier_messages,
    grade_solution,
    gsm8k_golden_task,
    require_gold,
    solver_action_is_valid,
    solver_answer,
)

__all__ = ["MathTwoAgentEnv", "env", "parse_verdict", "raw_env"]

_VERDICT_RE = re.compile(r"<verify>\s*(approve|reject)\s*</verify>", re.IGNORECASE)


def parse_verdict(text: str) -> str | None:
    """`"approve"`, `"reject"` (the last `<verify>...</verify>` verdict in `text`) or `None` when there is none."""
    verdicts = _VERDICT_RE.findall(text)
    return verdicts[-1].lower() if verdicts else None


class MathTwoAgentEnv(TextAECEnv):
    """Solver ↔ verifier loop on a math problem (see the module docstring).

    Args:
        max_loops: most solver turns (>= 1).
        missing_verdict: routing of a verifier reply without a verdict: `"reject"` or `"approve"`.
        prompt_style: `"paper"` (default) or `"fewshot"` (small models; see the module docstring).
        **kwargs: `TextAECEnv` arguments (`tasks`, `invalid_action_penalty`, `render_mode`).

    Raises:
        ValueError: `max_loops < 1`, an unknown `missing_verdict` or an unknown `prompt_style`.
    """

    metadata = {"name": "math-2agent-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("solver", "verifier")
    stop_strings = {"solver": (), "verifier": ("</verify>",)}
    fuzz_fragments = {
        "solver": MATH_FUZZ,
        "verifier": (
            "<verify>",
            "</verify>",
            "approve",
            "reject",
            "<verify>approve</verify>",
            "<verify>reject</verify>",
        ),
    }
    default_tasks = "gsm8k-train"
    role_reward_agents = ("solver", "verifier")

    def __init__(
        self,
        *,
        max_loops: int = 2,
        missing_verdict: str = "reject",
        prompt_style: str = "paper",
        **kwargs: Any,
    ) -> None:
        if not isinstance(max_loops, int) or max_loops < 1:
            raise ValueError(f"max_loops must be an int >= 1, got {max_loops!r}")
        if missing_verdict not in ("reject", "approve"):
            raise ValueError(f'missing_verdict must be "reject" or "approve", got {missing_verdict!r}')
        self.prompt_style = check_prompt_style(prompt_style)
        super().__init__(**kwargs)
        self.max_loops = max_loops
        self.missing_verdict = missing_verdict

    def start_episode(self, task: dict[str, Any]) -> str:
        require_gold(task)
        self.history: list[tuple[str, str]] = []  # (agent, text) of every turn so far
        self.solver_turns = 0
        self.last_solution: str | None = None
        self._attempts_correct: list[bool | None] = []  # per solver attempt, graded when first needed
        self.verdicts: list[
            tuple[str, bool]
        ] = []  # (valid verdict, whether the reviewed attempt was correct)
        return "solver"

    def _attempt_correct(self, i: int) -> bool:
        if self._attempts_correct[i] is None:
            text = self.history[[k for k, (who, _) in enumerate(self.history) if who == "solver"][i]][1]
            self._attempts_correct[i] = grade_solution(text, self.current_task)
        return bool(self._attempts_correct[i])

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        if self.prompt_style == "fewshot":
            question = self.current_task["question"]
            if agent == "solver":
                return fewshot_solver_messages(question, [t for who, t in self.history if who == "solver"])
            return fewshot_verifier_messages(question, self.last_solution or "")
        parts = [prompts.PROBLEM.format(question=self.current_task["question"])]
        if self.history:
            entries, n = [prompts.HISTORY_HEADER], {"solver": 0, "verifier": 0}
            for who, text in self.history:
                n[who] += 1
                entry = prompts.SOLVER_ENTRY if who == "solver" else prompts.VERIFIER_ENTRY
                entries.append(entry.format(n=n[who], text=text))
            parts.append("\n\n".join(entries))
        if agent == "solver":
            system, task = prompts.SOLVER_SYSTEM_2AGENT, prompts.SOLVER_TASK.format()
        else:
            system, task = prompts.VERIFIER_SYSTEM, prompts.VERIFIER_TASK
        parts.append(task)
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    def apply_action(self, agent: str, action: str) -> Transition:
        self.history.append((agent, action))
        if agent == "solver":
            self.solver_turns += 1
            self.last_solution = action
            self._attempts_correct.append(None)
            done = self.solver_turns >= self.max_loops
            return Transition(
                invalid=not solver_action_is_valid(action),
                next_agent=None if done else "verifier",
                answer=solver_answer(action),
            )
        verdict = parse_verdict(action)
        if verdict is not None:  # the reviewed attempt is the latest one
            self.verdicts.append((verdict, self._attempt_correct(self.solver_turns - 1)))
        routed = verdict or self.missing_verdict
        return Transition(invalid=verdict is None, next_agent=None if routed == "approve" else "solver")

    def episode_outcome(self) -> Outcome:
        correct = self.solver_turns > 0 and self._attempt_correct(self.solver_turns - 1)
        metrics = {"solver_turns": float(self.solver_turns)}
        if self.verdicts:
            right = [(v == "approve") == ok for v, ok in self.verdicts]
            metrics["verifier_accuracy"] = sum(right) / len(right)
            metrics["verifier_approve_rate"] = sum(v == "approve" for v, _ in self.verdicts) / len(
                self.verdicts
            )
        if any(v == "reject" and not ok for v, ok in self.verdicts):
            metrics["rejection_fixed"] = 1.0 if correct else 0.0
        return Outcome(
            team_reward=1.0 if correct else 0.0,
            success=bool(correct),
            metrics=metrics,
            role_rewards=self._role_rewards(),
        )

    def _role_rewards(self) -> dict[int, float]:
        """Turn -> role score (module docstring, "Role rewards"); a turn's index is its place in the history."""
        out: dict[int, float] = {}
        attempt = -1
        for turn, (who, text) in enumerate(self.history):
            if who == "solver":
                attempt += 1
                out[turn] = 1.0 if self._attempt_correct(attempt) else 0.0
            else:
                verdict = parse_verdict(text)
                right = verdict is not None and (verdict == "approve") == self._attempt_correct(attempt)
                out[turn] = 1.0 if right else 0.0
        return out

    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        task = gsm8k_golden_task()  # a real GSM8K test problem; gold answer 18
        right = f"16 - 3 - 4 = 9 eggs, sold at $2 each: \\boxed{{{task['answer']}}}"
        wrong = "16 - 3 = 13 eggs, sold at $2 each: \\boxed{26}"
        approve, reject = (
            "All steps check out. <verify>approve</verify>",
            "She also bakes 4. <verify>reject</verify>",
        )
        s, v = "solver", "verifier"
        return [
            GoldenEpisode(
                "right, approve",
                task,
                (right, approve),
                (s, v),
                {s: 1.0, v: 1.0},
                1.0,
                True,
                role_rewards={0: 1.0, 1: 1.0},
            ),
            GoldenEpisode(
                "wrong, reject, right",
                task,
                (wrong, reject, right),
                (s, v, s),
                {s: 1.0, v: 1.0},
                1.0,
                True,
                role_rewards={0: 0.0, 1: 1.0, 2: 1.0},
            ),
            GoldenEpisode(
                "right, reject (a wrong verdict), right",
                task,
                (right, reject, right),
                (s, v, s),
                {s: 1.0, v: 1.0},
                1.0,
                True,
                role_rewards={0: 1.0, 1: 0.0, 2: 1.0},
            ),
            GoldenEpisode(
                "no box, approve",
                task,
                ("It is 18.", approve),
                (s, v),
                {s: -0.1, v: 0.0},
                0.0,
                False,
                role_rewards={0: 0.0, 1: 0.0},
            ),
            GoldenEpisode(
                "wrong, reject, wrong",
                task,
                (wrong, reject, wrong),
                (s, v, s),
                {s: 0.0, v: 0.0},
                0.0,
                False,
                role_rewards={0: 0.0, 1: 1.0, 2: 0.0},
            ),
            GoldenEpisode(
                "wrong, approve",
                task,
                (wrong, approve),
                (s, v),
                {s: 0.0, v: 0.0},
                0.0,
                False,
                role_rewards={0: 0.0, 1: 0.0},
            ),
            GoldenEpisode(
                "right, no verdict (routed as reject), right",
                task,
                (right, "Looks fine to me.", right),
                (s, v, s),
                {s: 1.0, v: 0.9},
                1.0,
                True,
                role_rewards={0: 1.0, 1: 0.0, 2: 1.0},
            ),
            GoldenEpisode(
                "right, no verdict routed as approve (reference behaviour)",
                task,
                (right, "Looks fine to me."),
                (s, v),
                {s: 1.0, v: 0.9},
                1.0,
                True,
                env_kwargs={"missing_verdict": "approve"},
                role_rewards={0: 1.0, 1: 0.0},
            ),
            GoldenEpisode(
                "one loop: wrong",
                task,
                (wrong,),
                (s,),
                {s: 0.0, v: 0.0},
                0.0,
                False,
                {"max_loops": 1},
                role_rewards={0: 0.0},
            ),
        ]


def env(**kwargs: Any):
    """`MathTwoAgentEnv(**kwargs)` wrapped in PettingZoo's `OrderEnforcingWrapper`."""
    return wrap(MathTwoAgentEnv(**kwargs))


raw_env = MathTwoAgentEnv

r"""# Math, proposer and fixer (`mas/math-fixer-v0`)

A proposer answers a math problem once; a programmatic grader checks it; only when it is wrong, a fixer gets up
to `max_fixes` tries to repair it. The pattern of a repair agent called only on failure (code + test feedback,
Reflexion-style retries) is the one where one global GRPO baseline inflates an agent's advantages (Lemma 4.2 of
Dr. MAS): the fixer acts only, and repeatedly, in the trajectories that went wrong, and when the team mostly
succeeds those are the minority (docs/results.md, "Where the lemma bites").

| | |
|---|---|
| Creation | `mas_envs.make("math-fixer")` |
| Agents | `proposer`, `fixer` |
| Turn order | proposer; if its answer is wrong, fixer → fixer → ... until an answer is correct or the fixer used its `max_fixes` turns (at most `1 + max_fixes` turns) |
| Observation | the agent's prompt (`str`): the problem, every earlier attempt with the grader's verdict ("incorrect"), and the role; `infos[agent]["messages"]` holds it as chat messages |
| Action | any `str`; valid when a balanced `\boxed{...}` stands after its last `</think>` (as `math-2agent`'s solver) |
| Reward | team reward R = 1 if the last attempt is correct (`mas_envs.rewards.grade_math`, or the row's reasoning-gym scorer), else 0, to both agents at the end; an invalid action gets `-c` on that turn (default c = 0.1) and counts as a wrong answer |
| Termination | a correct answer, or the fixer's `max_fixes`-th turn |
| Truncation | never |
| Stop strings | none |
| Default tasks | `gsm8k-train` (bundled) |

The grader is an oracle (the gold answer), not an LLM verifier: who acts next depends only on whether the last
answer was right, so the fixer's rate of acting is set by the proposer's accuracy alone.

## Episode metrics
Reported at the end in `infos[agent]["episode_metrics"]` (logged as `env/<name>`, `eval/env/<name>`):

| name | value |
|---|---|
| `proposer_accuracy` | 1 if the proposer's answer was correct, else 0 (its mean is the proposer's accuracy) |
| `fixes_attempted` | fixer turns in the episode (0 … `max_fixes`) |
| `fixes_succeeded` | 1 if a fixer turn gave the correct answer, else 0 (always 0 when the proposer was right) |
| `fix_rate` | only in episodes where the fixer acted: 1 if it repaired the answer, else 0 (its mean is the share of wrong proposals the fixer repaired) |

## Prompt styles
`prompt_style="paper"` (default): a system line naming the role; one user turn with the problem, the attempts so
far each followed by `Grader: incorrect.`, and the role's instructions.

`prompt_style="fewshot"`, for small models (~100M parameters): `math-2agent`'s fewshot solver prompt for both
agents (two worked examples as earlier chat turns, then the bare problem); the fixer's prompt also holds one
worked repair after the examples (`What is 6 - 9?`, a wrong answer, `That answer is wrong. Try again: ...`, the
right one), and after the problem every earlier attempt as an assistant turn, each followed by
`That answer is wrong. Try again: <problem>`. Without the worked repair SmolLM2-135M mostly repeated the
rejected answer: on 20 one-digit + and − problems × 4 (T = 0.7, same seed) it repaired 2 of the 24 wrong
proposals, with it 6 of 24.

## Arguments
`max_fixes` (most fixer turns, default 3, >= 1), `prompt_style` (`"paper"` or `"fewshot"`, default `"paper"`),
`tasks` (rows, bundled set name or path; default `"gsm8k-train"`), `invalid_action_penalty` (c, default 0.1),
`render_mode` (`None` or `"ansi"`).

## Version history
* v0: initial release.
"""

from __future__ import annotations

from typing import Any

from mas_envs.core import GoldenEpisode, Outcome, TextAECEnv, Transition, wrap
from mas_envs.envs.math import prompts
from mas_envs.envs.math.common import (
    MATH_FUZZ,
    check_prompt_style,
    fewshot_solver_messages,
    grade_solution,
    gsm8k_golden_task,
    require_gold,
    solver_action_is_valid,
    solver_answer,
)

__all__ = ["MathFixerEnv", "env", "raw_env"]


class MathFixerEnv(TextAECEnv):
    """Proposer, then up to `max_fixes` fixer turns while the answer is wrong (see the module docstring).

    Args:
        max_fixes: most fixer turns (>= 1).
        prompt_style: `"paper"` (default) or `"fewshot"` (small models; see the module docstring).
        **kwargs: `TextAECEnv` arguments (`tasks`, `invalid_action_penalty`, `render_mode`).

    Raises:
        ValueError: `max_fixes` not an int >= 1, or an unknown `prompt_style`.
    """

    metadata = {"name": "math-fixer-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("proposer", "fixer")
    stop_strings = {"proposer": (), "fixer": ()}
    fuzz_fragments = {"proposer": MATH_FUZZ, "fixer": MATH_FUZZ}
    default_tasks = "gsm8k-train"

    def __init__(self, *, max_fixes: int = 3, prompt_style: str = "paper", **kwargs: Any) -> None:
        if isinstance(max_fixes, bool) or not isinstance(max_fixes, int) or max_fixes < 1:
            raise ValueError(f"max_fixes must be an int >= 1, got {max_fixes!r}")
        self.prompt_style = check_prompt_style(prompt_style)
        super().__init__(**kwargs)
        self.max_fixes = max_fixes

    def start_episode(self, task: dict[str, Any]) -> str:
        require_gold(task)
        self.attempts: list[tuple[str, bool]] = []  # (text, graded correct) of every turn, proposer first
        return "proposer"

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        question = self.current_task["question"]
        earlier = [text for text, _ in self.attempts] if agent == "fixer" else []
        if self.prompt_style == "fewshot":
            msgs = fewshot_solver_messages(question, earlier)
            if agent == "proposer":
                return msgs
            # the fixer: a worked repair (wrong answer, "That answer is wrong. Try again", a different answer)
            # after the worked examples, before the live problem
            q, wrong, right = prompts.FEWSHOT_REPAIR_EXAMPLE
            retry = prompts.FEWSHOT_RETRY.format(question=q)
            repair = [
                {"role": "user", "content": q},
                {"role": "assistant", "content": wrong},
                {"role": "user", "content": retry},
                {"role": "assistant", "content": right},
            ]
            k = 2 * len(prompts.FEWSHOT_SOLVER_EXAMPLES)
            return msgs[:k] + repair + msgs[k:]
        parts = [prompts.PROBLEM.format(question=question)]
        if earlier:
            entries = [prompts.HISTORY_HEADER]
            for n, text in enumerate(earlier):
                who = "Proposer" if n == 0 else f"Fixer, try {n}"
                entries.append(prompts.FIXER_ENTRY.format(who=who, text=text))
            parts.append("\n\n".join(entries))
        if agent == "proposer":
            system, task = prompts.PROPOSER_SYSTEM, prompts.SOLVER_TASK_1AGENT.format()
        else:
            system, task = prompts.FIXER_SYSTEM, prompts.FIXER_TASK.format()
        parts.append(task)
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    def apply_action(self, agent: str, action: str) -> Transition:
        correct = grade_solution(action, self.current_task)
        self.attempts.append((action, correct))
        fixes = len(self.attempts) - 1
        done = correct or fixes >= self.max_fixes
        return Transition(
            invalid=not solver_action_is_valid(action),
            next_agent=None if done else "fixer",
            answer=solver_answer(action),
        )

    def episode_outcome(self) -> Outcome:
        correct = bool(self.attempts) and self.attempts[-1][1]
        fixes = len(self.attempts) - 1
        metrics = {
            "proposer_accuracy": 1.0 if self.attempts and self.attempts[0][1] else 0.0,
            "fixes_attempted": float(max(fixes, 0)),
            "fixes_succeeded": 1.0 if fixes > 0 and correct else 0.0,
        }
        if fixes > 0:
            metrics["fix_rate"] = 1.0 if correct else 0.0
        return Outcome(team_reward=1.0 if correct else 0.0, success=correct, metrics=metrics)

    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        task = gsm8k_golden_task()  # a real GSM8K test problem; gold answer 18
        right = f"16 - 3 - 4 = 9 eggs, sold at $2 each: \\boxed{{{task['answer']}}}"
        wrong = "16 - 3 = 13 eggs, sold at $2 each: \\boxed{26}"
        p, f = "proposer", "fixer"
        return [
            GoldenEpisode("proposer right", task, (right,), (p,), {p: 1.0, f: 1.0}, 1.0, True),
            GoldenEpisode("wrong, fixed", task, (wrong, right), (p, f), {p: 1.0, f: 1.0}, 1.0, True),
            GoldenEpisode(
                "wrong, wrong, fixed on the second try",
                task,
                (wrong, wrong, right),
                (p, f, f),
                {p: 1.0, f: 1.0},
                1.0,
                True,
            ),
            GoldenEpisode(
                "wrong, three failed fixes",
                task,
                (wrong, wrong, wrong, wrong),
                (p, f, f, f),
                {p: 0.0, f: 0.0},
                0.0,
                False,
            ),
            GoldenEpisode(
                "no box (invalid, graded wrong), no box again, fixed",
                task,
                ("It is 18.", "Still 18.", right),
                (p, f, f),
                {p: 0.9, f: 0.9},
                1.0,
                True,
            ),
            GoldenEpisode(
                "one fix allowed: wrong, wrong",
                task,
                (wrong, wrong),
                (p, f),
                {p: 0.0, f: 0.0},
                0.0,
                False,
                {"max_fixes": 1},
            ),
        ]


def env(**kwargs: Any):
    """`MathFixerEnv(**kwargs)` wrapped in PettingZoo's `OrderEnforcingWrapper`."""
    return wrap(MathFixerEnv(**kwargs))


raw_env = MathFixerEnv

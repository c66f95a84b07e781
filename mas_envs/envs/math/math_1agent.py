r"""# Math, one agent (`mas/math-1agent-v0`)

The single-agent baseline for `math-2agent`: one solver answers once.

| | |
|---|---|
| Creation | `mas_envs.make("math-1agent")` |
| Agents | `solver` |
| Turn order | one solver turn |
| Observation | the solver's prompt (`str`); `infos["solver"]["messages"]` holds it as chat messages |
| Action | any `str`; it is valid when it contains a balanced `\boxed{...}` after its last `</think>` |
| Reward | team reward R = 1 if that last `\boxed{}` answer is correct (`mas_envs.rewards.grade_math`), else 0; an invalid action gets `-c` (default c = 0.1) |
| Termination | after the solver's turn |
| Truncation | never |
| Stop strings | none |
| Default tasks | `gsm8k-train` (bundled) |

## Episode metrics
`solver_turns` (always 1), for comparison with `math-2agent`.

## Arguments
`prompt_style` (`"paper"`, default, or `"fewshot"`: the worked examples of `math-2agent`'s fewshot solver as
earlier chat turns, then the bare problem), `tasks` (rows, bundled set name or path; default `"gsm8k-train"`), `invalid_action_penalty` (c, default 0.1),
`render_mode` (`None` or `"ansi"`).

## Version history
* v0: initial release; `prompt_style` added later (the default, `"paper"`, is the v0 prompt unchanged).
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

__all__ = ["MathOneAgentEnv", "env", "raw_env"]


class MathOneAgentEnv(TextAECEnv):
    """One solver, one turn (see the module docstring)."""

    metadata = {"name": "math-1agent-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("solver",)
    stop_strings = {"solver": ()}
    fuzz_fragments = {"solver": MATH_FUZZ}
    default_tasks = "gsm8k-train"

    def __init__(self, *, prompt_style: str = "paper", **kwargs: Any) -> None:
        self.prompt_style = check_prompt_style(prompt_style)
        super().__init__(**kwargs)

    def start_episode(self, task: dict[str, Any]) -> str:
        require_gold(task)
        self.answer_text: str | None = None
        return "solver"

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        if self.prompt_style == "fewshot":
            return fewshot_solver_messages(self.current_task["question"])
        user = "\n\n".join(
            [
                prompts.PROBLEM.format(question=self.current_task["question"]),
                prompts.SOLVER_TASK_1AGENT.format(),
            ]
        )
        return [
            {"role": "system", "content": prompts.SOLVER_SYSTEM_1AGENT},
            {"role": "user", "content": user},
        ]

    def apply_action(self, agent: str, action: str) -> Transition:
        self.answer_text = action
        return Transition(
            invalid=not solver_action_is_valid(action), next_agent=None, answer=solver_answer(action)
        )

    def episode_outcome(self) -> Outcome:
        correct = grade_solution(self.answer_text, self.current_task)
        return Outcome(
            team_reward=1.0 if correct else 0.0, success=bool(correct), metrics={"solver_turns": 1.0}
        )

    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        task = gsm8k_golden_task()
        gold = task["answer"]
        return [
            GoldenEpisode(
                "right answer",
                task,
                (f"So the answer is \\boxed{{{gold}}}.",),
                ("solver",),
                {"solver": 1.0},
                1.0,
                True,
            ),
            GoldenEpisode(
                "no box", task, (f"The answer is {gold}.",), ("solver",), {"solver": -0.1}, 0.0, False
            ),
            GoldenEpisode("wrong box", task, ("\\boxed{-1}",), ("solver",), {"solver": 0.0}, 0.0, False),
        ]


def env(**kwargs: Any):
    """`MathOneAgentEnv(**kwargs)` wrapped in PettingZoo's `OrderEnforcingWrapper`."""
    return wrap(MathOneAgentEnv(**kwargs))


raw_env = MathOneAgentEnv

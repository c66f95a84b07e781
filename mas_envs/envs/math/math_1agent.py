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

## Arguments
`tasks` (rows, bundled set name or path; default `"gsm8k-train"`), `invalid_action_penalty` (c, default 0.1),
`render_mode` (`None` or `"ansi"`).

## Version history
* v0: initial release.
"""

from __future__ import annotations

from typing import Any

from mas_envs.core import GoldenEpisode, Outcome, TextAECEnv, Transition, task_id_of, wrap
from mas_envs.envs.math import prompts
from mas_envs.rewards.math import _gold_strings, extract_boxed, grade_math, strip_think

__all__ = ["MathOneAgentEnv", "env", "raw_env", "require_gold"]

MATH_FUZZ = ("\\boxed{", "}", "{", "18", "\\frac{1}{2}", "<think>", "</think>", "$")


def solver_action_is_valid(action: str) -> bool:
    r"""A solver action is valid when a balanced `\boxed{...}` stands after its last `</think>`."""
    return extract_boxed(strip_think(action)) is not None


class MathOneAgentEnv(TextAECEnv):
    """One solver, one turn (see the module docstring)."""

    metadata = {"name": "math-1agent-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("solver",)
    stop_strings = {"solver": ()}
    fuzz_fragments = {"solver": MATH_FUZZ}
    default_tasks = "gsm8k-train"

    def _start(self, task: dict[str, Any]) -> str:
        require_gold(task)
        self.answer_text: str | None = None
        return "solver"

    def _prompt(self, agent: str) -> list[dict[str, str]]:
        user = "\n\n".join(
            [prompts.PROBLEM.format(question=self.task["question"]), prompts.SOLVER_TASK_1AGENT.format()]
        )
        return [
            {"role": "system", "content": prompts.SOLVER_SYSTEM_1AGENT},
            {"role": "user", "content": user},
        ]

    def _act(self, agent: str, action: str) -> Transition:
        self.answer_text = action
        return Transition(invalid=not solver_action_is_valid(action), next_agent=None)

    def _outcome(self) -> Outcome:
        correct = self.answer_text is not None and grade_math(self.answer_text, gold_of(self.task))
        return Outcome(team_reward=1.0 if correct else 0.0, success=bool(correct))

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


def gold_of(task: dict[str, Any]) -> Any:
    """The gold answer of a math task row (`answer`, else `golden_answers`)."""
    return task["answer"] if "answer" in task else task.get("golden_answers")


def require_gold(task: dict[str, Any]) -> None:
    """Raise `ValueError` unless the task has a gold answer `grade_math` can match (else every reward is 0)."""
    if not any(g.strip() for g in _gold_strings(gold_of(task))):
        raise ValueError(
            f"math task {task_id_of(task)} has no gold answer: give it an 'answer' (str or number) or a "
            f"non-empty 'golden_answers' list; got answer={task.get('answer')!r}, "
            f"golden_answers={task.get('golden_answers')!r}"
        )


def gsm8k_golden_task() -> dict[str, Any]:
    """The first real GSM8K test problem (gold answer 18), used by the golden episodes."""
    from mas_envs.data import load_tasks

    return load_tasks("gsm8k-test", limit=1)[0]


def env(**kwargs: Any):
    """`MathOneAgentEnv(**kwargs)` wrapped in PettingZoo's `OrderEnforcingWrapper`."""
    return wrap(MathOneAgentEnv(**kwargs))


raw_env = MathOneAgentEnv

r"""What the math envs share: the gold answer of a row, the solver's validity rule and the grader.

Grading (`grade_solution`): a row made by a reasoning-gym spec whose gold answer is not a number
(`task["grader"] == "reasoning_gym"`, e.g. a word task) is graded by that generator's own scorer on the
solver's last `\boxed{}` content (correct when it scores 1.0); every other row goes through
`mas_envs.rewards.grade_math`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mas_envs.core import task_id_of
from mas_envs.rewards.math_grade import extract_boxed, gold_strings, grade_math, normalize_answer, strip_think

__all__ = [
    "MATH_FUZZ",
    "PROMPT_STYLES",
    "check_prompt_style",
    "fewshot_solver_messages",
    "fewshot_verifier_messages",
    "gold_of",
    "grade_solution",
    "gsm8k_golden_task",
    "require_gold",
    "solver_action_is_valid",
    "solver_answer",
]

# Fragments the action space's sample() splices into random solver text, so fuzzing reaches valid answers.
MATH_FUZZ = ("\\boxed{", "}", "{", "18", "\\frac{1}{2}", "<think>", "</think>", "$")


def solver_action_is_valid(action: str) -> bool:
    r"""A solver action is valid when a balanced `\boxed{...}` stands after its last `</think>`."""
    return extract_boxed(strip_think(action)) is not None


def solver_answer(action: str) -> str | None:
    r"""The solver's parsed answer (`Transition.answer`): its last balanced `\boxed{...}` after `</think>`,
    in `normalize_answer`'s form (`\boxed{1,000.}` and `\boxed{ 1000 }` give `"1000"`); `None` without one."""
    box = extract_boxed(strip_think(action))
    return None if box is None else normalize_answer(box)


def gold_of(task: dict[str, Any]) -> Any:
    """The gold answer of a math task row (`answer`, else `golden_answers`)."""
    return task["answer"] if "answer" in task else task.get("golden_answers")


def require_gold(task: dict[str, Any]) -> None:
    """Raise `ValueError` unless the task has a gold answer `grade_math` can match (else every reward is 0)."""
    if not any(g.strip() for g in gold_strings(gold_of(task))):
        raise ValueError(
            f"math task {task_id_of(task)} has no gold answer: give it an 'answer' (str or number) or a "
            f"non-empty 'golden_answers' list; got answer={task.get('answer')!r}, "
            f"golden_answers={task.get('golden_answers')!r}"
        )


def grade_solution(text: str | None, task: dict[str, Any]) -> bool:
    """Whether a solver reply answers `task` correctly (see the module docstring). Never raises."""
    if text is None:
        return False
    if task.get("grader") == "reasoning_gym" and "reasoning_gym" in task:
        from mas_envs.procedural import score_with_generator

        return score_with_generator(extract_boxed(strip_think(text)), task) >= 1.0
    return bool(grade_math(text, gold_of(task)))


def gsm8k_golden_task() -> dict[str, Any]:
    """The first real GSM8K test problem (gold answer 18), used by the golden episodes."""
    from mas_envs.data import load_tasks

    return load_tasks("gsm8k-test", limit=1)[0]


PROMPT_STYLES = ("paper", "fewshot")


def check_prompt_style(style: object) -> str:
    """Return `style` when it is one of `PROMPT_STYLES`, else raise `ValueError` naming them."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {style!r}")
    return str(style)


def fewshot_solver_messages(question: str, attempts: Sequence[str] = ()) -> list[dict[str, str]]:
    """The "fewshot" solver prompt: the worked examples as earlier chat turns, then the problem.

    `attempts` are the solver's earlier (rejected) attempts: each follows as an assistant turn with a user
    turn saying it was judged wrong and asking the problem again, so the model answers again in the same
    conversation, in the examples' format.
    """
    from mas_envs.envs.math import prompts

    msgs: list[dict[str, str]] = []
    for q, a in prompts.FEWSHOT_SOLVER_EXAMPLES:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    msgs.append({"role": "user", "content": question})
    for text in attempts:
        retry = prompts.FEWSHOT_RETRY.format(question=question)
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": retry}]
    return msgs


def fewshot_verifier_messages(question: str, answer: str) -> list[dict[str, str]]:
    """The "fewshot" verifier prompt: two example verdicts as chat turns, then the problem and the answer.

    Only the end of a long answer is shown (`prompts.FEWSHOT_ANSWER_CHARS`), where its `\\boxed{}` is.
    """
    from mas_envs.envs.math import prompts

    tail = strip_think(answer).strip()
    if len(tail) > prompts.FEWSHOT_ANSWER_CHARS:
        tail = "..." + tail[-prompts.FEWSHOT_ANSWER_CHARS :]
    msgs: list[dict[str, str]] = []
    if prompts.FEWSHOT_VERIFIER_SYSTEM:
        msgs.append({"role": "system", "content": prompts.FEWSHOT_VERIFIER_SYSTEM})
    for q, a, verdict in prompts.FEWSHOT_VERIFIER_EXAMPLES:
        msgs += [
            {"role": "user", "content": prompts.FEWSHOT_VERIFIER_QUERY.format(question=q, answer=a)},
            {"role": "assistant", "content": verdict},
        ]
    msgs.append(
        {"role": "user", "content": prompts.FEWSHOT_VERIFIER_QUERY.format(question=question, answer=tail)}
    )
    return msgs

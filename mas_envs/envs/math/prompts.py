r"""Prompt text of the math envs (our own wording; the tag contract follows the Dr. MAS reference).

The solver must put its final answer in `\boxed{}`; the verifier must end with `<verify>approve</verify>` or
`<verify>reject</verify>`. Changing any text here changes what models see: bump the env versions.
"""

SOLVER_SYSTEM_2AGENT = (
    "You are the solver on a two-agent team (a solver and a verifier) that solves math problems together."
)
VERIFIER_SYSTEM = (
    "You are the verifier on a two-agent team (a solver and a verifier) that solves math problems together."
)
SOLVER_SYSTEM_1AGENT = "You are a careful mathematician who solves problems step by step."

PROBLEM = "# Problem\n{question}"
HISTORY_HEADER = "# Team history"
SOLVER_ENTRY = "## Solver, attempt {n}\n{text}"
VERIFIER_ENTRY = "## Verifier, review {n}\n{text}"

SOLVER_TASK = (
    "# Your task\n"
    "Solve the problem step by step. If the team history holds an earlier attempt and the verifier's "
    "review of it, use them: fix what the verifier found wrong, but keep what was right. "
    "Put your final answer in \\boxed{{}} at the end, for example \\boxed{{42}}."
)
SOLVER_TASK_1AGENT = (
    "# Your task\n"
    "Solve the problem step by step. Put your final answer in \\boxed{{}} at the end, for example "
    "\\boxed{{42}}."
)
VERIFIER_TASK = (
    "# Your task\n"
    "Review the solver's most recent attempt critically: check every step, every formula and the final "
    "answer for correctness and completeness. Explain what you checked. Then end your reply with exactly one "
    "verdict: <verify>approve</verify> if the solution and its final answer are correct, or "
    "<verify>reject</verify> if you found any error."
)

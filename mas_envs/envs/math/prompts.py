r"""Prompt text of the math envs (our own wording; the tag contract follows the Dr. MAS reference).

The solver must put its final answer in `\boxed{}`; the verifier must end with `<verify>approve</verify>` or
`<verify>reject</verify>`. Two styles: the paper style (the default: role, problem, team history, task
instructions in one user turn; right for Qwen3-4B-scale models) and the "fewshot" style for small models
(worked examples as earlier chat turns, below). Changing any text here changes what models see: bump the
env versions.
"""

SOLVER_SYSTEM_2AGENT = (
    "You are the solver on a two-agent team (a solver and a verifier) that solves math problems together."
)
VERIFIER_SYSTEM = (
    "You are the verifier on a two-agent team (a solver and a verifier) that solves math problems together."
)
SOLVER_SYSTEM_1AGENT = "You are a careful mathematician who solves problems step by step."
# math-fixer (paper style)
PROPOSER_SYSTEM = (
    "You are the proposer on a two-agent team (a proposer and a fixer) that solves math problems together. "
    "A grader checks your answer; if it is wrong, the fixer repairs it."
)
FIXER_SYSTEM = (
    "You are the fixer on a two-agent team (a proposer and a fixer) that solves math problems together. "
    "You are called only when the grader found the latest answer wrong."
)
FIXER_ENTRY = "## {who}\n{text}\n\nGrader: incorrect."
FIXER_TASK = (
    "# Your task\n"
    "Every answer in the team history was graded incorrect. Find the mistake and solve the problem again, "
    "step by step, with a different final answer. Put your final answer in \\boxed{{}} at the end, for example "
    "\\boxed{{42}}."
)

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

# --- prompt_style="fewshot": for small models (~100M parameters) --------------------------------------------
# A small model copies a format it has seen far better than it follows an instruction, and it has little
# context to spare. So the "fewshot" style gives worked examples as earlier chat turns (user asks,
# assistant answers in the exact format) and keeps the live turn short: the bare problem for the solver,
# the problem and the solver's latest answer for the verifier. Measured on SmolLM2-135M at T = 0.7 (16
# one-digit problems x 2): two worked examples as chat turns gave \boxed{} in 32/32 replies (24/32 right),
# where a prompt like the paper-style one gave 11/32 boxed.
FEWSHOT_SOLVER_EXAMPLES = (
    ("What is 2 + 3?", "2 + 3 = 5. \\boxed{5}"),
    ("What is 4 - 7?", "4 - 7 = -3. \\boxed{-3}"),
)
# After a rejection the problem is asked again, so the retry turn looks like the examples' turns.
FEWSHOT_RETRY = "That answer is wrong. Try again: {question}"
# The verifier's live turn is `<problem>\n<latest answer>`, after a one-line system turn (the chat template's
# default system turn is longer) and four example verdicts, alternating approve / reject / reject / approve:
# with two examples SmolLM2-135M mostly copied the last example's verdict (0 approvals in 22 valid verdicts
# on 16 right + 16 wrong answers). With these it gave a valid tag in 30/32 replies, 8 of them approvals, 14
# right (T = 0.7): a format it reaches, with verdicts near chance, so the verifier has a signal to learn from.
# This compact form is 244 prompt tokens; a "Problem: / Answer: / Is the answer correct?" form was 331.
FEWSHOT_VERIFIER_SYSTEM: str | None = "Check the answer."
FEWSHOT_VERIFIER_QUERY = "{question}\n{answer}"
FEWSHOT_VERIFIER_EXAMPLES = (
    ("What is 2 + 3?", "2 + 3 = 5. \\boxed{5}", "5 is correct. <verify>approve</verify>"),
    ("What is 4 - 7?", "4 - 7 = 3. \\boxed{3}", "4 - 7 = -3, so 3 is wrong. <verify>reject</verify>"),
    ("What is 6 + 1?", "6 + 1 = 8. \\boxed{8}", "6 + 1 = 7, so 8 is wrong. <verify>reject</verify>"),
    ("What is 9 - 5?", "9 - 5 = 4. \\boxed{4}", "4 is correct. <verify>approve</verify>"),
)
# math-fixer's fixer (fewshot): one worked repair between the solver examples and the live problem. Without it
# SmolLM2-135M mostly repeated the rejected answer: on 20 one-digit +/- problems x 4 (T = 0.7, same seed) it
# repaired 2 of 24 wrong proposals (team success 0.725); with it 6 of 24 (0.775).
FEWSHOT_REPAIR_EXAMPLE = ("What is 6 - 9?", "6 - 9 = 3. \\boxed{3}", "6 - 9 = -3. \\boxed{-3}")
# The verifier sees at most this many characters of the solver's latest answer (its end, where the box is).
FEWSHOT_ANSWER_CHARS = 400

"""Reward functions: math answer equivalence (`grade_math`) and QA exact match / F1.

Each is a pure function of (response, gold) that never raises.
"""

from mas_envs.rewards.math_grade import extract_boxed, grade_math, normalize_answer, strip_think
from mas_envs.rewards.qa import exact_match, f1_score

__all__ = ["exact_match", "extract_boxed", "f1_score", "grade_math", "normalize_answer", "strip_think"]

"""Reward functions: math answer equivalence (`grade_math`) and QA exact match / F1.

Each is a pure function of (response, gold) that never raises.
"""

from mas_envs.rewards.math import extract_boxed, grade_math, normalize_answer, strip_think

__all__ = ["extract_boxed", "grade_math", "normalize_answer", "strip_think"]

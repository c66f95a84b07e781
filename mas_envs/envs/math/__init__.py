"""Math environments: `math-2agent` (solver <-> verifier loop), `math-1agent` (solver alone) and `math-fixer`
(proposer, then a fixer while the grader says wrong)."""

from mas_envs.envs.math.math_1agent import MathOneAgentEnv
from mas_envs.envs.math.math_2agent import MathTwoAgentEnv
from mas_envs.envs.math.math_fixer import MathFixerEnv

__all__ = ["MathFixerEnv", "MathOneAgentEnv", "MathTwoAgentEnv"]

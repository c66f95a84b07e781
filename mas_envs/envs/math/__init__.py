"""Math environments: `math-2agent` (solver <-> verifier loop) and `math-1agent` (solver alone)."""

from mas_envs.envs.math.math_1agent import MathOneAgentEnv
from mas_envs.envs.math.math_2agent import MathTwoAgentEnv

__all__ = ["MathOneAgentEnv", "MathTwoAgentEnv"]

"""mas_envs: PettingZoo AEC text environments for multi-agent LLM post-training.

    import mas_envs
    env = mas_envs.make("math-2agent")        # same as pettingzoo.make("aec", "mas/math-2agent")
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, reward, termination, truncation, info = env.last()
        env.step(None if termination or truncation else my_policy(obs, agent))

Importing this package is light: it never imports torch, transformers, faiss or datasets.
"""

from mas_envs import envs as _envs  # noqa: F401  (registers the built-in envs)
from mas_envs.core import (
    ExactEvaluation,
    GoldenEpisode,
    Outcome,
    Scorer,
    TextAECEnv,
    TextObservation,
    Transition,
    UnicodeText,
)
from mas_envs.registration import UnknownEnvError, make, pprint_registry, register, registry, spec

__all__ = [
    "ExactEvaluation",
    "GoldenEpisode",
    "Outcome",
    "Scorer",
    "TextAECEnv",
    "Transition",
    "TextObservation",
    "UnicodeText",
    "UnknownEnvError",
    "make",
    "pprint_registry",
    "register",
    "registry",
    "spec",
]

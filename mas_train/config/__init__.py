"""Run configuration: dataclasses are the truth; YAML files and CLI flags are views of them.

A run is one :class:`TrainConfig`. It names the environment, the data, the default model and training settings,
and optionally per-model-group (:class:`ModelGroupConfig`) and per-agent (:class:`AgentConfig`) sections. The
agents themselves come from the environment (its ``possible_agents``); :meth:`TrainConfig.resolve` maps them to
model groups and returns a :class:`ResolvedConfig` in which every value is concrete. ``mas-eval`` is one
:class:`EvalConfig`.

Layering (later wins): dataclass defaults < (``--resume RUN``: the run's saved ``config.yaml``) <
``--config run.yaml`` < CLI flags. Inside one config, a setting is looked up agent -> model group -> top level,
and agents that share a model group must agree on every optimisation setting (checked by
:meth:`TrainConfig.resolve`, before any model is loaded), as in Dr. MAS (``build_wg_ids`` asserts equal configs
for agents sharing a model).

The generic work (YAML, flags, dotted overrides, type coercion, unknown-key detection) is OmegaConf's
(:mod:`mas_train.config.omega` says why OmegaConf); the modules here hold the schema (:mod:`.sections`,
:mod:`.train`, :mod:`.eval_config`), the GRPO settings we honour (:mod:`.grpo`), resolution (:mod:`.resolve`)
and the command line (:mod:`.args`).

CLI (``mas-train --help`` lists every flag with its help text)::

    mas-train --env math-2agent --max_steps 5
    mas-train --config run.yaml --num_generations 8              # flags override the file
    mas-train --model_sharing per_agent --agent_models solver=Qwen/Qwen3-4B,verifier=./ckpt/verifier
    mas-train --sampling.temperature 0.8 --agents.verifier.sampling.temperature 0.6
    mas-train --model_groups.solver.learning_rate 1e-5 --grpo.loss_type dr_grpo --env_kwargs.max_loops 3
    mas-train --resume runs/<run> --max_steps 20                 # the run's settings, with more steps

The equivalent YAML::

    env: math-2agent
    model_sharing: per_agent
    grpo: {loss_type: dr_grpo}
    agents:
      verifier: {model: ./ckpt/verifier, sampling: {temperature: 0.6}}
    model_groups:
      solver: {learning_rate: 1.0e-5, backend_options: {max_batch_size: 8}}
"""

from mas_train.config.args import build_parser, config_diff, explicit_overrides, parse_args
from mas_train.config.common import (
    ADVANTAGE_MODES,
    ADVANTAGE_SCOPES,
    ADVANTAGE_STATS,
    BACKENDS,
    DTYPES,
    LAPTOP_DEFAULTS,
    OPTIM_FIELDS,
    POOLS,
    REPORT_TO,
    SHARDINGS,
    SHARING_MODES,
    ConfigError,
)
from mas_train.config.eval_config import (
    EvalAgentConfig,
    EvalConfig,
    EvalGroupConfig,
    build_eval_parser,
    parse_eval_args,
)
from mas_train.config.grpo import GRPO_CHOICES, GRPO_HONOURED
from mas_train.config.resolve import ResolvedAgent, ResolvedConfig, ResolvedModelGroup
from mas_train.config.sections import (
    AgentConfig,
    EvalSamplingConfig,
    LoraConfig,
    ModelGroupConfig,
    RewardWeights,
    SamplingConfig,
)
from mas_train.config.train import TrainConfig

__all__ = [
    "ADVANTAGE_MODES",
    "ADVANTAGE_SCOPES",
    "ADVANTAGE_STATS",
    "BACKENDS",
    "DTYPES",
    "LAPTOP_DEFAULTS",
    "GRPO_CHOICES",
    "GRPO_HONOURED",
    "OPTIM_FIELDS",
    "POOLS",
    "REPORT_TO",
    "SHARDINGS",
    "SHARING_MODES",
    "AgentConfig",
    "ConfigError",
    "EvalAgentConfig",
    "EvalConfig",
    "EvalGroupConfig",
    "LoraConfig",
    "RewardWeights",
    "ModelGroupConfig",
    "ResolvedAgent",
    "ResolvedConfig",
    "ResolvedModelGroup",
    "EvalSamplingConfig",
    "SamplingConfig",
    "TrainConfig",
    "build_eval_parser",
    "build_parser",
    "config_diff",
    "explicit_overrides",
    "parse_args",
    "parse_eval_args",
]

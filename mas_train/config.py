"""Run configuration: dataclasses are the truth; YAML files and CLI flags are views of them.

A run is one :class:`TrainConfig`. It names the environment, the data, the default model and training settings,
and optionally per-model-group (:class:`ModelGroupConfig`) and per-agent (:class:`AgentConfig`) sections. The
agents themselves come from the environment (its ``possible_agents``); :meth:`TrainConfig.resolve` maps them to
model groups and returns a :class:`ResolvedConfig` in which every value is concrete.

Layering (later wins): dataclass defaults < ``--config run.yaml`` < CLI flags. Inside one config, a setting
is looked up agent → model group → top level, and agents that share a model group must agree on every
optimisation setting (checked by :meth:`TrainConfig.resolve`, before any model is loaded), as in Dr. MAS
(``build_wg_ids`` asserts equal configs for agents sharing a model).

CLI (``mas-train --help`` lists every flag with its help text)::

    mas-train --env math-2agent --max_steps 5
    mas-train --config run.yaml --num_generations 8              # flags override the file
    mas-train --model_sharing per_agent --agent_models solver=Qwen/Qwen3-4B,verifier=./ckpt/verifier
    mas-train --sampling.temperature 0.8 --agents.verifier.sampling.temperature 0.6
    mas-train --model_groups.solver.learning_rate 1e-5 --grpo.loss_type dr_grpo --env_kwargs.max_loops 3

The equivalent YAML::

    env: math-2agent
    model_sharing: per_agent
    grpo: {loss_type: dr_grpo}
    agents:
      verifier: {model: ./ckpt/verifier, sampling: {temperature: 0.6}}
    model_groups:
      solver: {learning_rate: 1.0e-5}
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
import time
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from mas_train.backends.base import SamplingParams

__all__ = [
    "ADVANTAGE_MODES",
    "ADVANTAGE_SCOPES",
    "BACKENDS",
    "OPTIM_FIELDS",
    "AgentConfig",
    "ConfigError",
    "ModelGroupConfig",
    "ResolvedAgent",
    "ResolvedConfig",
    "ResolvedModelGroup",
    "SamplingConfig",
    "TrainConfig",
    "build_parser",
    "parse_args",
]

# ----------------------------------------------------------------------------------------------------------------
# Defaults of a plain `mas-train --env math-2agent` run: sized so that SmolLM2-135M-Instruct on a 2-core CPU
# finishes its default budget in about 10-15 minutes. Tune the run here, in one place. Measured costs and the
# reasoning behind these numbers: docs/training.md ("CPU defaults and budget").
# ----------------------------------------------------------------------------------------------------------------
DEFAULT_ENV = "math-2agent"
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_MODEL_SHARING = "shared"
DEFAULT_NUM_GENERATIONS = 4  # G: trajectories per task
DEFAULT_TASKS_PER_STEP = 1  # tasks per training step -> TASKS_PER_STEP * G trajectories
DEFAULT_MAX_STEPS = 6
DEFAULT_MAX_NEW_TOKENS = 128  # per agent turn
DEFAULT_MAX_PROMPT_LENGTH = 1024
# The 4-bit SmolLM2-135M default writes gibberish at 1.0 (never a valid action, so no learning signal);
# 0.7 keeps it coherent. The reference trains 4B+ models at 1.0: set sampling.temperature for those.
DEFAULT_TEMPERATURE = 0.7
DEFAULT_LEARNING_RATE = 1e-5
DEFAULT_SAVE_STEPS = 3
DEFAULT_EVAL_STEPS = 6
DEFAULT_EVAL_K = 4
DEFAULT_EVAL_NUM_TASKS: int | None = 2
DEFAULT_EVAL_TEMPERATURE = 0.6  # the reference's validation sampling (temperature 0.6, top_p 0.95)
DEFAULT_EVAL_TOP_P = 0.95
# ----------------------------------------------------------------------------------------------------------------

ADVANTAGE_MODES = ("drmas", "grpo", "agent_mean", "agent_std")
ADVANTAGE_SCOPES = ("group", "batch")
BACKENDS = ("hf", "sglang_engine", "sglang_http")
POOLS = ("local", "ray")
REPORT_TO = ("tensorboard", "jsonl", "wandb", "none")
SHARING_MODES = ("shared", "per_agent")
DTYPES = ("auto", "float32", "bfloat16", "float16")

#: Optimisation settings: set at top level, per model group, or per agent (agents sharing a group must agree).
#: The names are those of transformers' ``TrainingArguments`` / TRL's ``GRPOConfig``.
OPTIM_FIELDS = ("learning_rate", "weight_decay", "max_grad_norm", "warmup_steps", "lr_scheduler_type")

# GRPOConfig keys that this config owns elsewhere; passing them in `grpo:` would silently fight it.
_GRPO_RESERVED = {
    **dict.fromkeys(OPTIM_FIELDS, "the field of the same name (top level, model_groups.<g>, or agents.<a>)"),
    "num_generations": "the top-level num_generations",
    "max_steps": "the top-level max_steps",
    "seed": "the top-level seed",
    "output_dir": "the top-level output_dir",
    "run_name": "the top-level run_name",
    "report_to": "the top-level report_to",
    "save_steps": "the top-level save_steps",
    "eval_steps": "the top-level eval_steps",
    "logging_steps": "the top-level logging_steps",
    "temperature": "sampling.temperature / agents.<a>.sampling.temperature",
    "top_p": "sampling.top_p / agents.<a>.sampling.top_p",
    "top_k": "sampling.top_k / agents.<a>.sampling.top_k",
    "max_completion_length": "sampling.max_new_tokens / agents.<a>.sampling.max_new_tokens",
    "use_vllm": "model_groups.<g>.backend (generation runs on mas_train backends, not TRL's vLLM)",
}
_GROUP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class ConfigError(ValueError):
    """A configuration is invalid; the message says which setting and what to do."""


def _help(text: str, **kw: Any) -> Any:
    return field(metadata={"help": text}, **kw)


def _close(name: str, options: Sequence[str]) -> str:
    matches = difflib.get_close_matches(name, list(options), n=3, cutoff=0.6)
    return f" Did you mean {', '.join(repr(m) for m in matches)}?" if matches else ""


def _check_choice(where: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(
            f"{where} must be one of {list(choices)}, got {value!r}.{_close(str(value), choices)}"
        )


# ================================================================================================================
# Dataclasses
# ================================================================================================================


@dataclass
class SamplingConfig:
    """How an agent samples its turns (one :class:`~mas_train.backends.base.SamplingParams` per turn)."""

    temperature: float = _help(
        "Softmax temperature for sampling; 0 = greedy. Training logprobs use the same temperature.",
        default=DEFAULT_TEMPERATURE,
    )
    top_p: float = _help("Nucleus sampling mass in (0, 1]; 1 disables it.", default=1.0)
    top_k: int = _help("Keep only the k most likely tokens; 0 disables it.", default=0)
    max_new_tokens: int = _help(
        "Maximum tokens generated per agent turn (TRL: max_completion_length).",
        default=DEFAULT_MAX_NEW_TOKENS,
    )

    def __post_init__(self) -> None:
        try:
            self.to_params()
        except ValueError as err:
            raise ConfigError(f"sampling: {err}") from None
        if self.top_k < -1:
            raise ConfigError(f"sampling.top_k must be >= 0 (or -1 = off), got {self.top_k}")

    def to_params(self, stop: Sequence[str] = (), seed: int | None = None) -> SamplingParams:
        """The backend request for one turn; ``stop`` are the env's stop strings for this agent."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            stop=tuple(stop),
            seed=seed,
        )


@dataclass
class ModelGroupConfig:
    """Settings of one model group: one set of trained weights, its optimizer and its generation backend.

    Fields left ``None`` inherit the top-level value of the same name in :class:`TrainConfig`.
    """

    name: str = _help("Group name (filled in from its key under model_groups).", default="")
    model: str | None = _help(
        "Hub id, local path, or builtin alias (smollm2-135m-instruct, tiny-qwen3). None = the top-level model.",
        default=None,
    )
    backend: str | None = _help(
        f"Generation backend, one of {list(BACKENDS)}. None = top level.", default=None
    )
    backend_kwargs: dict[str, Any] = _help(
        "Backend options, e.g. sglang: mem_fraction_static, tp_size, port, gpu_ids, url.",
        default_factory=dict,
    )
    dtype: str | None = _help(f"Weights dtype, one of {list(DTYPES)}. None = top level.", default=None)
    learning_rate: float | None = _help("Peak learning rate. None = top level.", default=None)
    weight_decay: float | None = _help("AdamW weight decay. None = top level.", default=None)
    max_grad_norm: float | None = _help("Gradient clipping norm. None = top level.", default=None)
    warmup_steps: float | None = _help(
        "Warmup steps (int) or ratio of max_steps (< 1). None = top level.", default=None
    )
    lr_scheduler_type: str | None = _help("transformers scheduler name. None = top level.", default=None)
    grpo: dict[str, Any] = _help(
        "Extra TRL GRPOConfig settings for this group (loss_type, epsilon, epsilon_high, beta, num_iterations, "
        "...), merged over the top-level grpo.",
        default_factory=dict,
    )
    num_cpus: float = _help("CPUs reserved for this group's worker (pool: ray).", default=1.0)
    num_gpus: float = _help(
        "GPUs (fractions allowed) reserved for this group's worker (pool: ray).", default=0.0
    )

    def __post_init__(self) -> None:
        where = f"model_groups.{self.name}" if self.name else "model_groups.<group>"
        if self.name and not _GROUP_NAME_RE.match(self.name):
            raise ConfigError(f"{where}: a group name may use letters, digits, '_', '.', '-' only")
        if self.backend is not None:
            _check_choice(f"{where}.backend", self.backend, BACKENDS)
        if self.dtype is not None:
            _check_choice(f"{where}.dtype", self.dtype, DTYPES)
        _check_optim(where, self)
        _check_grpo(f"{where}.grpo", self.grpo)
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ConfigError(f"{where}: num_cpus and num_gpus must be >= 0")


@dataclass
class AgentConfig:
    """Per-agent settings. Optimisation fields left ``None`` inherit from the agent's model group."""

    name: str = _help("Agent name as the env calls it (filled in from its key under agents).", default="")
    model_group: str | None = _help(
        "Model group this agent trains and samples with; overrides model_sharing for this agent.",
        default=None,
    )
    model: str | None = _help(
        "Model for this agent's group (same forms as model). Agents in one group must not disagree.",
        default=None,
    )
    sampling: SamplingConfig | None = _help(
        "Sampling for this agent's turns; keys not given inherit the top-level sampling.", default=None
    )
    learning_rate: float | None = _help(
        "Learning rate override (must agree within a model group).", default=None
    )
    weight_decay: float | None = _help(
        "Weight decay override (must agree within a model group).", default=None
    )
    max_grad_norm: float | None = _help(
        "Gradient clipping override (must agree within a model group).", default=None
    )
    warmup_steps: float | None = _help("Warmup override (must agree within a model group).", default=None)
    lr_scheduler_type: str | None = _help(
        "Scheduler override (must agree within a model group).", default=None
    )

    def __post_init__(self) -> None:
        _check_optim(f"agents.{self.name or '<agent>'}", self)


@dataclass
class TrainConfig:
    """One training run. Every field is a CLI flag of the same name and a YAML key."""

    # --- environment and data ---
    env: str = _help(
        "Environment id for mas_envs.make (e.g. math-2agent, search-3agent).", default=DEFAULT_ENV
    )
    env_kwargs: dict[str, Any] = _help(
        "Extra keyword arguments for mas_envs.make (e.g. max_loops, max_turns).", default_factory=dict
    )
    invalid_action_penalty: float | None = _help(
        "Penalty c in s = R - c*invalid for a malformed action. None = the env's default.", default=None
    )
    train_data: str | None = _help(
        "Training tasks: a bundled dataset name or a path (.jsonl/.json/.parquet). None = the env's default.",
        default=None,
    )
    eval_data: str | None = _help(
        "Evaluation tasks (same forms as train_data). None = the env's default.", default=None
    )
    data_fields: dict[str, str] = _help(
        "Column renames for custom data, task field -> column (e.g. question=problem,answer=solution).",
        default_factory=dict,
    )
    # --- models ---
    model: str = _help(
        "Default model of every model group: hub id, local path, or builtin alias (smollm2-135m-instruct, "
        "tiny-qwen3).",
        default=DEFAULT_MODEL,
    )
    model_sharing: str | dict[str, str] = _help(
        "How agents map to model groups: 'shared' (agents with the same model share one group), 'per_agent' "
        "(one group per agent), or an explicit mapping agent=group,agent=group.",
        default=DEFAULT_MODEL_SHARING,
    )
    backend: str = _help(
        f"Default generation backend of every model group, one of {list(BACKENDS)}.", default="hf"
    )
    dtype: str = _help(
        f"Default weights dtype, one of {list(DTYPES)} (auto: float32 on CPU, bfloat16 on GPU).",
        default="auto",
    )
    model_groups: dict[str, ModelGroupConfig] = _help(
        "Per-model-group settings, keyed by group name (see --help epilog).", default_factory=dict
    )
    agents: dict[str, AgentConfig] = _help("Per-agent settings, keyed by agent name.", default_factory=dict)
    # --- optimisation (defaults of every model group) ---
    learning_rate: float = _help("Default peak learning rate.", default=DEFAULT_LEARNING_RATE)
    weight_decay: float = _help("Default AdamW weight decay.", default=0.0)
    max_grad_norm: float = _help("Default gradient clipping norm.", default=1.0)
    warmup_steps: float = _help("Default warmup: steps (int) or a ratio of max_steps (< 1).", default=0.0)
    lr_scheduler_type: str = _help(
        "Default transformers scheduler name (constant, linear, cosine, ...).", default="constant"
    )
    grpo: dict[str, Any] = _help(
        "TRL GRPOConfig settings for every model group (loss_type, epsilon, epsilon_high, beta, num_iterations, "
        "scale_rewards is ignored: advantages come from advantage_mode).",
        default_factory=dict,
    )
    # --- algorithm ---
    num_generations: int = _help(
        "G: trajectories sampled per task (the task group).", default=DEFAULT_NUM_GENERATIONS
    )
    tasks_per_step: int = _help("Distinct tasks per training step.", default=DEFAULT_TASKS_PER_STEP)
    advantage_mode: str = _help(
        "drmas: per-agent mean and std (Dr. MAS eq. 5); grpo: global (eq. 2); agent_mean: (mu_k, sigma); "
        "agent_std: (mu, sigma_k).",
        default="drmas",
    )
    advantage_scope: str = _help(
        "Statistics per task group ('group', as the reference code) or over the whole batch ('batch').",
        default="group",
    )
    advantage_eps: float = _help("epsilon in A = (s - mu)/(sigma + epsilon).", default=1e-6)
    sampling: SamplingConfig = _help(
        "Default sampling of every agent during training.", default_factory=SamplingConfig
    )
    max_prompt_length: int = _help(
        "Longest prompt (tokens) an agent turn may have; a longer one is not truncated: the turn is skipped as an "
        "invalid (empty) action and counted in charts/prompt_overflow.",
        default=DEFAULT_MAX_PROMPT_LENGTH,
    )
    max_steps: int = _help("Number of training steps (TRL's name).", default=DEFAULT_MAX_STEPS)
    seed: int = _help("Random seed (data order, sampling, initialisation).", default=0)
    device: str = _help("auto, cpu, cuda or cuda:N.", default="auto")
    pool: str = _help(f"Where model groups live, one of {list(POOLS)}.", default="local")
    log_agent_grad_norms: bool | None = _help(
        "Log the gradient norm of each agent's samples alone (Dr. MAS Figure 4); costs one extra backward per "
        "agent. None = on for models under 1B parameters.",
        default=None,
    )
    # --- outputs ---
    output_dir: str = _help("Directory under which each run gets its own folder.", default="runs")
    run_name: str | None = _help("Run folder name. None = '<env>__<seed>__<UTC time>'.", default=None)
    report_to: list[str] = _help(
        f"Loggers, any of {list(REPORT_TO)}.", default_factory=lambda: ["tensorboard", "jsonl"]
    )
    logging_steps: int = _help("Log metrics every N steps.", default=1)
    save_steps: int = _help(
        "Save a checkpoint every N steps (and at the end); 0 = only at the end.", default=DEFAULT_SAVE_STEPS
    )
    eval_steps: int = _help("Evaluate every N steps (and at the end); 0 = never.", default=DEFAULT_EVAL_STEPS)
    eval_k: int = _help("Samples per eval task for avg@k / pass@k.", default=DEFAULT_EVAL_K)
    eval_num_tasks: int | None = _help(
        "Eval tasks per evaluation. None = all.", default=DEFAULT_EVAL_NUM_TASKS
    )
    eval_sampling: SamplingConfig = _help(
        "Sampling of every agent during evaluation.",
        default_factory=lambda: SamplingConfig(
            temperature=DEFAULT_EVAL_TEMPERATURE, top_p=DEFAULT_EVAL_TOP_P
        ),
    )
    resume: str | None = _help(
        "Continue a run: a checkpoint folder (runs/<run>/checkpoints/step-N), a run folder (its newest "
        "checkpoint), or 'latest' (the newest checkpoint of any run under --output_dir).",
        default=None,
    )

    def __post_init__(self) -> None:
        _check_choice("advantage_mode", self.advantage_mode, ADVANTAGE_MODES)
        _check_choice("advantage_scope", self.advantage_scope, ADVANTAGE_SCOPES)
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("pool", self.pool, POOLS)
        for r in self.report_to:
            _check_choice("report_to", r, REPORT_TO)
        if isinstance(self.model_sharing, str):
            _check_choice("model_sharing", self.model_sharing, SHARING_MODES)
        elif not isinstance(self.model_sharing, Mapping) or not self.model_sharing:
            raise ConfigError(
                "model_sharing must be 'shared', 'per_agent' or a non-empty mapping agent -> group"
            )
        else:
            for agent, group in self.model_sharing.items():
                if not isinstance(group, str) or not _GROUP_NAME_RE.match(group):
                    raise ConfigError(
                        f"model_sharing[{agent!r}] = {group!r}: a group name may use letters, digits, '_', '.', '-'"
                    )
        for name, minimum in (
            ("num_generations", 1),
            ("tasks_per_step", 1),
            ("max_steps", 1),
            ("max_prompt_length", 1),
            ("logging_steps", 1),
            ("save_steps", 0),
            ("eval_steps", 0),
            ("eval_k", 1),
        ):
            if getattr(self, name) < minimum:
                raise ConfigError(f"{name} must be >= {minimum}, got {getattr(self, name)}")
        if self.eval_num_tasks is not None and self.eval_num_tasks < 1:
            raise ConfigError(f"eval_num_tasks must be >= 1 or None, got {self.eval_num_tasks}")
        if self.advantage_eps <= 0:
            raise ConfigError(f"advantage_eps must be > 0, got {self.advantage_eps}")
        if self.invalid_action_penalty is not None and self.invalid_action_penalty < 0:
            raise ConfigError(f"invalid_action_penalty must be >= 0, got {self.invalid_action_penalty}")
        _check_optim("top level", self)
        _check_grpo("grpo", self.grpo)
        for key_name, section in (("model_groups", self.model_groups), ("agents", self.agents)):
            for key, sub in section.items():
                if sub.name and sub.name != key:
                    raise ConfigError(
                        f"{key_name}[{key!r}] has name {sub.name!r}; leave name empty or equal the key"
                    )
                sub.name = key
                if isinstance(sub, ModelGroupConfig) and not _GROUP_NAME_RE.match(key):
                    raise ConfigError(
                        f"model_groups.{key}: a group name may use letters, digits, '_', '.', '-' only"
                    )

    # ------------------------------------------------------------------------------------------------ views
    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready); ``TrainConfig.from_dict(cfg.to_dict()) == cfg``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from a nested mapping (a parsed YAML file), coercing scalars to the field types.

        Per-agent ``sampling`` may be partial; missing keys come from the top-level ``sampling``.

        Raises:
            ConfigError: unknown keys (with close matches), wrong types, invalid values.
        """
        data = dict(data)
        top_sampling = {**dataclasses.asdict(SamplingConfig()), **dict(data.get("sampling") or {})}
        agents = data.get("agents") or {}
        if not isinstance(agents, Mapping):
            raise ConfigError(f"agents must be a mapping agent -> settings, got {type(agents).__name__}")
        merged_agents = {}
        for name, agent in agents.items():
            if isinstance(agent, AgentConfig):
                merged_agents[name] = agent
                continue
            agent = dict(agent or {})
            if agent.get("sampling") is not None:
                if not isinstance(agent["sampling"], Mapping):
                    raise ConfigError(f"agents.{name}.sampling must be a mapping")
                agent["sampling"] = {**top_sampling, **agent["sampling"]}
            merged_agents[name] = agent
        if agents:
            data["agents"] = merged_agents
        return _build(cls, data, "")

    def to_yaml(self, path: str | Path | None = None) -> str:
        """YAML text of :meth:`to_dict`; also written to ``path`` when given."""
        import yaml

        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """Load a YAML file written by hand or by :meth:`to_yaml`."""
        return cls.from_dict(_load_yaml(path))

    # --------------------------------------------------------------------------------------------- helpers
    def env_make_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``mas_envs.make(self.env, **kwargs)``."""
        kwargs = dict(self.env_kwargs)
        if self.invalid_action_penalty is not None:
            kwargs["invalid_action_penalty"] = self.invalid_action_penalty
        return kwargs

    def default_run_name(self) -> str:
        """``<env>__<seed>__<UTC time>`` (cleanrl's habit), used when ``run_name`` is None."""
        env = re.sub(r"[^A-Za-z0-9_.\-]+", "-", self.env)
        return f"{env}__{self.seed}__{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"

    def resolve(self, agent_names: Sequence[str]) -> ResolvedConfig:
        """Map the env's agents to model groups and make every setting concrete.

        Args:
            agent_names: the env's ``possible_agents``, in env order.

        Returns:
            A :class:`ResolvedConfig`; model groups appear in order of their first agent.

        Raises:
            ConfigError: an agent named in ``agents``/``model_sharing`` that the env does not have (the message
                lists the env's agents); an agent missing from an explicit mapping; settings for a model group
                no agent uses; agents of one model group that disagree on their model or on an optimisation
                setting (the message names the agents, group, field and values) -- all before any model loads.
        """
        return _resolve(self, list(agent_names))


# ================================================================================================================
# Resolved view
# ================================================================================================================


@dataclass(frozen=True)
class ResolvedAgent:
    """One agent with concrete settings."""

    name: str
    model_group: str
    sampling: SamplingConfig
    eval_sampling: SamplingConfig

    def sampling_params(
        self, stop: Sequence[str] = (), *, eval: bool = False, seed: int | None = None
    ) -> SamplingParams:
        """Backend request for one turn of this agent (``stop``: the env's stop strings for it)."""
        return (self.eval_sampling if eval else self.sampling).to_params(stop, seed)


@dataclass(frozen=True)
class ResolvedModelGroup:
    """One model group with concrete settings; ``agents`` are the agents it trains, in env order."""

    name: str
    model: str
    agents: tuple[str, ...]
    backend: str
    backend_kwargs: dict[str, Any]
    dtype: str
    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    warmup_steps: float
    lr_scheduler_type: str
    grpo: dict[str, Any]
    num_cpus: float
    num_gpus: float

    def grpo_config_kwargs(self) -> dict[str, Any]:
        """This group's optimisation settings plus its ``grpo`` passthrough, as ``GRPOConfig`` keyword arguments.

        The caller adds run-level keys (output_dir, num_generations, max_steps, seed, use_cpu, bf16, ...).
        """
        return {**{f: getattr(self, f) for f in OPTIM_FIELDS}, **self.grpo}


@dataclass(frozen=True)
class ResolvedConfig:
    """The run's config with the env's agents mapped to model groups (from :meth:`TrainConfig.resolve`)."""

    config: TrainConfig
    agents: dict[str, ResolvedAgent]
    model_groups: dict[str, ResolvedModelGroup]
    run_name: str

    @property
    def agent_to_group(self) -> dict[str, str]:
        return {a.name: a.model_group for a in self.agents.values()}

    @property
    def run_dir(self) -> Path:
        return Path(self.config.output_dir) / self.run_name


# ================================================================================================================
# Validation and resolution
# ================================================================================================================


def _check_optim(where: str, obj: Any) -> None:
    lr, wd, gn, wu = obj.learning_rate, obj.weight_decay, obj.max_grad_norm, obj.warmup_steps
    if lr is not None and lr < 0:
        raise ConfigError(f"{where}: learning_rate must be >= 0, got {lr}")
    if wd is not None and wd < 0:
        raise ConfigError(f"{where}: weight_decay must be >= 0, got {wd}")
    if gn is not None and gn <= 0:
        raise ConfigError(f"{where}: max_grad_norm must be > 0, got {gn}")
    if wu is not None and (wu < 0 or (wu >= 1 and wu != int(wu))):
        raise ConfigError(f"{where}: warmup_steps must be an integer >= 0 or a ratio in [0, 1), got {wu}")


_GRPO_FIELDS: dict[str, Any] | None = None


def _grpo_fields() -> dict[str, Any] | None:
    """GRPOConfig's field types by name, or None when TRL is not installed (then keys are not checked)."""
    global _GRPO_FIELDS
    if _GRPO_FIELDS is None:
        try:
            from trl import GRPOConfig
        except ImportError:
            return None
        _GRPO_FIELDS = {f.name: f.type for f in dataclasses.fields(GRPOConfig)}
    return _GRPO_FIELDS


def _check_grpo(where: str, grpo: Mapping[str, Any]) -> None:
    if not isinstance(grpo, Mapping):
        raise ConfigError(f"{where} must be a mapping of GRPOConfig settings, got {type(grpo).__name__}")
    known = _grpo_fields() if grpo else None  # importing TRL takes seconds; only pay it when there is a key
    for key in grpo:
        if key in _GRPO_RESERVED:
            raise ConfigError(f"{where}.{key}: set it through {_GRPO_RESERVED[key]}, not through grpo")
        # TRL names its importance-sampling correction after vLLM, but our trainer applies it to every backend.
        if key.startswith("vllm_") and not key.startswith("vllm_importance_sampling_"):
            raise ConfigError(
                f"{where}.{key}: vLLM settings do not apply; generation runs on mas_train backends"
            )
        if known is not None and key not in known:
            raise ConfigError(f"{where}.{key} is not a TRL GRPOConfig setting.{_close(key, list(known))}")


def _resolve(cfg: TrainConfig, agent_names: list[str]) -> ResolvedConfig:
    if not agent_names:
        raise ConfigError(f"env {cfg.env!r} reported no agents")
    env_agents = ", ".join(agent_names)
    for where, names in (("agents", cfg.agents), ("model_sharing", cfg.model_sharing)):
        if isinstance(names, Mapping):
            for name in names:
                if name not in agent_names:
                    raise ConfigError(
                        f"{where}.{name}: env {cfg.env!r} has no agent {name!r}; its agents are: {env_agents}."
                        f"{_close(name, agent_names)}"
                    )
    agent_cfg = {a: cfg.agents.get(a) or AgentConfig(name=a) for a in agent_names}

    # agent -> group
    mapping: dict[str, str] = {}
    if isinstance(cfg.model_sharing, Mapping):
        for a in agent_names:
            group = agent_cfg[a].model_group or cfg.model_sharing.get(a)
            if group is None:
                raise ConfigError(
                    f"model_sharing maps some agents but not {a!r}; map every agent of {cfg.env!r} ({env_agents}) "
                    f"or set agents.{a}.model_group"
                )
            mapping[a] = group
    elif cfg.model_sharing == "per_agent":
        mapping = {a: agent_cfg[a].model_group or a for a in agent_names}
    else:  # shared: one group per distinct model, as Dr. MAS groups shared agents by model id
        by_model: dict[str, list[str]] = {}
        for a in agent_names:
            if agent_cfg[a].model_group is None:
                by_model.setdefault(agent_cfg[a].model or cfg.model, []).append(a)
        names = _group_names_for_models(list(by_model))
        for model, agents in by_model.items():
            for a in agents:
                mapping[a] = names[model]
        for a in agent_names:
            if agent_cfg[a].model_group is not None:
                mapping[a] = agent_cfg[a].model_group  # type: ignore[assignment]
    for a, group in mapping.items():
        if not _GROUP_NAME_RE.match(group):
            raise ConfigError(f"agent {a!r} maps to group {group!r}: use letters, digits, '_', '.', '-' only")

    groups_in_order = list(dict.fromkeys(mapping[a] for a in agent_names))
    unused = [g for g in cfg.model_groups if g not in groups_in_order]
    if unused:
        raise ConfigError(
            f"model_groups has settings for {unused} but no agent maps to them; the groups are: "
            f"{', '.join(groups_in_order)} (agent -> group: {mapping})"
        )

    groups: dict[str, ResolvedModelGroup] = {}
    for g in groups_in_order:
        members = tuple(a for a in agent_names if mapping[a] == g)
        gcfg = cfg.model_groups.get(g) or ModelGroupConfig(name=g)
        models = {a: agent_cfg[a].model for a in members if agent_cfg[a].model is not None}
        if gcfg.model is not None:
            models = {f"model_groups.{g}": gcfg.model, **models}
        if len(set(models.values())) > 1:
            raise ConfigError(
                f"model group {g!r} is one set of weights but its settings name different models: {models}. "
                "Give the agents their own groups (model_sharing: per_agent) or use one model."
            )
        model = next(iter(models.values()), cfg.model)
        optim = {}
        for f in OPTIM_FIELDS:
            base = getattr(gcfg, f) if getattr(gcfg, f) is not None else getattr(cfg, f)
            values = {
                a: getattr(agent_cfg[a], f) if getattr(agent_cfg[a], f) is not None else base for a in members
            }
            if len(set(values.values())) > 1:
                shown = ", ".join(f"{a}={v!r}" for a, v in values.items())
                raise ConfigError(
                    f"agents {list(members)} share model group {g!r} but disagree on {f}: {shown}. One model group "
                    f"has one optimizer: set model_groups.{g}.{f} instead, or give the agents separate groups "
                    "(model_sharing: per_agent)."
                )
            optim[f] = next(iter(values.values()))
        groups[g] = ResolvedModelGroup(
            name=g,
            model=model,
            agents=members,
            backend=gcfg.backend or cfg.backend,
            backend_kwargs=dict(gcfg.backend_kwargs),
            dtype=gcfg.dtype or cfg.dtype,
            grpo={**cfg.grpo, **gcfg.grpo},
            num_cpus=gcfg.num_cpus,
            num_gpus=gcfg.num_gpus,
            **optim,
        )
    agents = {
        a: ResolvedAgent(
            name=a,
            model_group=mapping[a],
            sampling=agent_cfg[a].sampling or cfg.sampling,
            eval_sampling=cfg.eval_sampling,
        )
        for a in agent_names
    }
    return ResolvedConfig(
        config=cfg, agents=agents, model_groups=groups, run_name=cfg.run_name or cfg.default_run_name()
    )


def _group_names_for_models(models: list[str]) -> dict[str, str]:
    if len(models) == 1:
        return {models[0]: "shared"}
    names: dict[str, str] = {}
    for m in models:
        base = re.sub(r"[^A-Za-z0-9_.\-]+", "-", Path(m.rstrip("/")).name or m).strip("-.") or "model"
        name, i = base, 2
        while name in names.values():
            name, i = f"{base}-{i}", i + 1
        names[m] = name
    return names


# ================================================================================================================
# Dict -> dataclass with type coercion
# ================================================================================================================


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        if len(args) == 1:
            return args[0], optional
        return Union[tuple(args)], optional  # noqa: UP007 -- rebuilt at run time from a tuple
    return tp, False


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_NONE = {"none", "null", "~", ""}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    tp, optional = _unwrap_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in _NONE):
        if optional:
            return None
        raise ConfigError(f"{where} may not be empty")
    origin = typing.get_origin(tp)
    try:
        if tp is Any:
            return value
        if dataclasses.is_dataclass(tp):
            if isinstance(value, tp):
                return value
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where} must be a mapping, got {value!r}")
            return _build(tp, value, where)
        if tp is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
                return value.strip().lower() in _TRUE
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        if tp is int:
            if isinstance(value, bool):
                raise ConfigError(f"{where} must be an integer, got {value!r}")
            if isinstance(value, float) and not value.is_integer():
                raise ConfigError(f"{where} must be an integer, got {value!r}")
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ConfigError(f"{where} must be a number, got {value!r}")
            return float(value)
        if tp is str:
            if isinstance(value, Mapping | list):
                raise ConfigError(f"{where} must be a string, got {value!r}")
            return str(value)
        if origin is list:
            (item,) = typing.get_args(tp)
            if isinstance(value, str):
                value = [value]
            if item is str:  # "a,b" and ["a", "b"] mean the same on the CLI
                value = [p.strip() for v in value for p in str(v).split(",") if p.strip()]
            return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        if origin is dict:
            _, item = typing.get_args(tp)
            if isinstance(value, str):
                value = _parse_mapping(value, where)
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where} must be a mapping, got {value!r}")
            return {str(k): _coerce(v, item, f"{where}.{k}") for k, v in value.items()}
        if typing.get_origin(tp) in (Union, types.UnionType):  # str | dict[str, str] (model_sharing)
            if isinstance(value, Mapping):
                return _coerce(value, dict[str, str], where)
            if isinstance(value, str) and "=" in value:
                return _parse_mapping(value, where)
            return str(value)
        if typing.get_origin(tp) is Literal:
            return value
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(
            f"{where}: cannot read {value!r} as {getattr(tp, '__name__', tp)} ({err})"
        ) from None
    raise ConfigError(f"{where}: unsupported field type {tp!r}")  # a bug in this module, not in the config


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ConfigError(
                f"unknown setting {path!r}.{_close(str(key), names)} Known here: {', '.join(names)}"
            )
        if cls is TrainConfig and key in ("model_groups", "agents"):
            sub = ModelGroupConfig if key == "model_groups" else AgentConfig
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path} must be a mapping name -> settings, got {value!r}")
            kwargs[key] = {
                str(k): v if isinstance(v, sub) else _build(sub, {**(v or {}), "name": str(k)}, f"{path}.{k}")
                for k, v in value.items()
            }
        elif key == "grpo":
            kwargs[key] = _coerce_grpo(value, path)
        else:
            kwargs[key] = _coerce(value, hints[key], path)
    return cls(**kwargs)


def _coerce_grpo(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):
        value = _parse_mapping(value, where)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping of GRPOConfig settings, got {value!r}")
    _check_grpo(where, value)
    known = _grpo_fields() or {}
    out = {}
    for k, v in value.items():
        tp = known.get(k)
        # GRPOConfig annotations are real types for the common numeric knobs; strings (YAML "1e-5") get coerced
        out[k] = _coerce(v, tp, f"{where}.{k}") if tp in (int, float, bool, float | None, int | None) else v
    return out


def _parse_scalar(text: str) -> Any:
    """A CLI value: YAML scalar rules, plus numbers YAML 1.1 reads as strings (``1e-5``)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _parse_mapping(text: str, where: str) -> dict[str, Any]:
    """``a=1,b=x`` or a YAML/JSON mapping ``{a: 1, b: x}``."""
    text = text.strip()
    if text.startswith("{"):
        import yaml

        value = yaml.safe_load(text)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {text!r}")
        return value
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ConfigError(
                f"{where}: expected key=value pairs separated by commas, got {part!r} in {text!r}"
            )
        k, v = part.split("=", 1)
        out[k.strip()] = _parse_scalar(v.strip())
    return out


def _load_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    with path.open() as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a YAML mapping at top level")
    return data


# ================================================================================================================
# CLI
# ================================================================================================================

_NESTED_SECTIONS = ("agents", "model_groups")  # dotted flags --agents.<name>.<field> ...
_FREE_DICTS = ("env_kwargs", "grpo", "data_fields")  # dotted flags --grpo.<key> ...


def _nested_help(cls: type, prefix: str) -> str:
    lines = []
    for f in dataclasses.fields(cls):
        if f.name == "name":
            continue
        if f.name == "sampling":
            for sf in dataclasses.fields(SamplingConfig):
                lines.append(f"  {prefix}.sampling.{sf.name}: {sf.metadata['help']}")
            continue
        lines.append(f"  {prefix}.{f.name}: {f.metadata['help']}")
    return "\n".join(lines)


def build_parser(prog: str = "mas-train") -> argparse.ArgumentParser:
    """The argparse parser behind :func:`parse_args` (every :class:`TrainConfig` field is a flag)."""
    epilog = (
        "Flags override --config run.yaml, which overrides the defaults. Nested settings use dotted flags:\n"
        "  --agents.<agent>.<setting> VALUE, --model_groups.<group>.<setting> VALUE,\n"
        "  --grpo.<GRPOConfig key> VALUE, --env_kwargs.<key> VALUE, --model_groups.<g>.backend_kwargs.<key> VALUE.\n"
        "Per-agent settings:\n" + _nested_help(AgentConfig, "--agents.<agent>") + "\n"
        "Per-model-group settings:\n" + _nested_help(ModelGroupConfig, "--model_groups.<group>")
    )
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a multi-agent LLM system with Dr. MAS GRPO.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--config", metavar="YAML", help="YAML file of settings (keys as the flags below).")
    parser.add_argument(
        "--agent_models",
        metavar="AGENT=MODEL,...",
        help="Per-agent models, e.g. solver=Qwen/Qwen3-4B,verifier=./ckpt (sets agents.<agent>.model).",
    )
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if f.name in _NESTED_SECTIONS:
            continue
        tp, _ = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            group = parser.add_argument_group(f"{f.name} ({f.metadata['help']})")
            for sf in dataclasses.fields(tp):
                group.add_argument(
                    f"--{f.name}.{sf.name}", dest=f"{f.name}.{sf.name}", metavar="V", help=sf.metadata["help"]
                )
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        help_text = f"{f.metadata['help']} (default: {default})"
        if tp is bool:
            parser.add_argument(f"--{f.name}", nargs="?", const="true", metavar="BOOL", help=help_text)
        elif typing.get_origin(tp) is list:
            parser.add_argument(f"--{f.name}", nargs="+", metavar="V", help=help_text)
        else:
            parser.add_argument(f"--{f.name}", metavar="V", help=help_text)
    return parser


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        node = tree.get(key)
        if not isinstance(node, dict):
            node = tree[key] = {}
        tree = node
    tree[path[-1]] = value


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def parse_args(argv: Sequence[str] | None = None, prog: str = "mas-train") -> TrainConfig:
    """Parse CLI flags (and ``--config run.yaml``) into a :class:`TrainConfig`.

    Args:
        argv: the arguments without the program name; ``None`` = ``sys.argv[1:]``.

    Raises:
        ConfigError: unknown flags (with close matches), bad values, invalid settings.
        SystemExit: for ``--help`` (argparse prints the help).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    ns, rest = parser.parse_known_args(argv)
    given = vars(ns)

    overrides: dict[str, Any] = {}
    for key, value in given.items():
        if key in ("config", "agent_models"):
            continue
        if key in _FREE_DICTS:  # a mapping, so that dotted flags and the YAML file merge into it
            value = _parse_mapping(value, f"--{key}")
        _set_path(overrides, key.split("."), value)
    for name, model in _parse_mapping(given.get("agent_models", ""), "--agent_models").items():
        _set_path(overrides, ["agents", name, "model"], str(model))

    known_flags = [a for action in parser._actions for a in action.option_strings]
    i = 0
    while i < len(rest):
        token = rest[i]
        if not token.startswith("--"):
            raise ConfigError(f"unexpected argument {token!r}; flags look like --name value")
        flag, eq, value = token[2:].partition("=")
        path = flag.split(".")
        if path[0] not in _NESTED_SECTIONS + _FREE_DICTS or len(path) < 2 or not all(path):
            raise ConfigError(f"unknown flag --{flag}.{_close('--' + flag, known_flags)} See --help.")
        if path[0] in _NESTED_SECTIONS and len(path) < 3:
            raise ConfigError(f"--{flag}: expected --{path[0]}.<name>.<setting> VALUE")
        if not eq:
            if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                raise ConfigError(f"--{flag} needs a value")
            i += 1
            value = rest[i]
        _set_path(overrides, path, _parse_scalar(value))
        i += 1

    data: dict[str, Any] = _load_yaml(given["config"]) if "config" in given else {}
    return TrainConfig.from_dict(_deep_merge(data, overrides))

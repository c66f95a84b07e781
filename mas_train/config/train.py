"""The run config, :class:`TrainConfig`: one dataclass whose fields are the CLI flags and the YAML keys."""

from __future__ import annotations

import copy
import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mas_train.advantages import RAE_DEFAULT_DECAY
from mas_train.config.advantage_checks import check_advantage_settings
from mas_train.config.common import (
    BACKENDS,
    DTYPES,
    GROUP_NAME_RE,
    LAPTOP_DEFAULTS,
    POOLS,
    REPORT_TO,
    SHARDINGS,
    SHARING_MODES,
    ConfigError,
    check_choice,
    check_min,
    check_optim,
)
from mas_train.config.common import help_field as _help
from mas_train.config.grpo import check_grpo
from mas_train.config.omega import build, load_yaml
from mas_train.config.resolve import ResolvedConfig, backend_options, resolve
from mas_train.config.sections import (
    AgentConfig,
    DynamicSamplingConfig,
    EvalSamplingConfig,
    LeagueConfig,
    LoraConfig,
    ModelGroupConfig,
    SamplingConfig,
    TaskPoolConfig,
)

__all__ = ["TrainConfig", "laptop_layer"]


def laptop_layer(layers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[LAPTOP_DEFAULTS[env]]`` (a copy) when ``layers`` name no ``train_data``/``eval_data`` and no model other
    than the default ``TrainConfig.model`` (top level, ``model_groups.*.model``, ``agents.*.model``) and the env has a laptop
    setting; else ``[]``. The result goes under the user's layers, so any field they set wins."""

    def given(key: str) -> list[Any]:
        return [d[key] for d in layers if d.get(key) is not None]

    if given("train_data") or given("eval_data"):
        return []
    models = given("model")
    for section in ("agents", "model_groups"):
        for sub in given(section):
            for entry in sub.values():
                m = getattr(entry, "model", None) if not isinstance(entry, Mapping) else entry.get("model")
                if m is not None:
                    models.append(m)
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    if any(m != defaults["model"] for m in models):
        return []
    env = (given("env") or [defaults["env"]])[-1]
    preset = copy.deepcopy(LAPTOP_DEFAULTS.get(env))
    if preset and given("trainable") and given("trainable")[-1] is False:
        preset.pop(
            "lora", None
        )  # a frozen run trains no adapter: the preset's lora is not the user's setting
    return [preset] if preset else []


@dataclass
class TrainConfig:
    """One training run. Every field is a CLI flag of the same name and a YAML key."""

    # --- environment and data ---
    env: str = _help(
        "Environment id for mas_envs.make (e.g. math-2agent, search-3agent).", default="math-2agent"
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
        default="smollm2-135m-instruct",
    )
    model_sharing: str | dict[str, str] = _help(
        "How agents map to model groups: 'shared' (agents with the same model share one group), 'per_agent' "
        "(one group per agent), 'shared_lora' (one group per agent, each a LoRA adapter on one shared base model), "
        "or an explicit mapping agent=group,agent=group.",
        default="shared",
    )
    trainable: bool = _help(
        "Default of model_groups.<g>.trainable / agents.<a>.trainable (false: sample only).", default=True
    )
    lora: LoraConfig | None = _help(
        "Default of model_groups.<g>.lora for every trainable group: train a LoRA adapter (r, alpha, dropout, "
        "target_modules) instead of all weights. None = full fine-tuning (shared_lora: a default adapter).",
        default=None,
    )
    backend: str = _help(
        f"Default generation backend of every model group, one of {list(BACKENDS)}.", default="hf"
    )
    backend_options: dict[str, Any] = _help(
        "Default options of the groups whose backend is the top-level backend (see model_groups.<g>."
        "backend_options).",
        default_factory=dict,
    )
    dtype: str = _help(
        f"Default weights dtype, one of {list(DTYPES)} (auto: bfloat16 on GPU; on a CPU with native bf16 "
        "(amx_bf16/avx512_bf16) a bf16 LoRA base or bf16 autocast for full fine-tuning, else float32; the "
        "banner says which; docs/training.md).",
        default="auto",
    )
    model_groups: dict[str, ModelGroupConfig] = _help(
        "Per-model-group settings, keyed by group name (see --help epilog).", default_factory=dict
    )
    agents: dict[str, AgentConfig] = _help("Per-agent settings, keyed by agent name.", default_factory=dict)
    # --- optimisation (defaults of every model group) ---
    learning_rate: float = _help("Default peak learning rate.", default=1e-5)
    weight_decay: float = _help("Default AdamW weight decay.", default=0.0)
    max_grad_norm: float = _help("Default gradient clipping norm.", default=1.0)
    warmup_steps: float = _help("Default warmup: steps (int) or a ratio of max_steps (< 1).", default=0.0)
    lr_scheduler_type: str = _help(
        "Default transformers scheduler name (constant, linear, cosine, ...).", default="constant"
    )
    micro_batch_size: int = _help(
        "Default samples per forward/backward of a group's update (gradients are accumulated over the step; "
        "bounds the update's activation memory, docs/performance.md).",
        default=2,
    )
    grpo: dict[str, Any] = _help(
        "TRL GRPOConfig settings for every model group: only those our update honours (loss_type, epsilon, "
        "epsilon_high, beta, num_iterations, mask_truncated_completions, optim, ...; see "
        "mas_train.config.GRPO_HONOURED); any other is refused.",
        default_factory=dict,
    )
    # --- algorithm ---
    num_generations: int = _help("G: trajectories sampled per task (the task group).", default=4)
    tasks_per_step: int = _help("Distinct tasks per training step.", default=1)
    task_pool: TaskPoolConfig = _help(
        "Tasks drawn by solve rate (enabled, ema, pools).", default_factory=TaskPoolConfig
    )
    dynamic_sampling: DynamicSamplingConfig = _help(
        "Keep task groups with signal only.", default_factory=DynamicSamplingConfig
    )
    legal_moves_only: bool = _help(
        "Games: choose each move among the legal move texts by the model's probability of each (scored, not "
        "sampled freely), so no move is illegal; needs the hf backend and sampling.temperature 1.",
        default=False,
    )
    league: LeagueConfig = _help(
        "Game opponents: self-play, frozen snapshots and scripted policies (enabled, self_play, snapshots, "
        "scripted, snapshot_every, max_snapshots).",
        default_factory=LeagueConfig,
    )
    advantage_mode: str = _help(
        "drmas: per-agent mean and std (Dr. MAS eq. 5); grpo: global (eq. 2); agent_mean: (mu_k, sigma); "
        "agent_std: (mu, sigma_k); rae: SPIRAL's per-agent moving-average baseline, A = s - b_k, no std "
        "(works at num_generations 1; docs/advantages.md 'RAE').",
        default="drmas",
    )
    advantage_scope: str = _help(
        "Statistics per task group ('group', as the reference code), over the whole batch ('batch'), or the "
        "per-agent ones per task group, agent and turn position ('turn', AT-GRPO; not with advantage_mode grpo).",
        default="group",
    )
    advantage_turn_min_samples: int = _help(
        "advantage_scope turn: a (task group, agent, turn position) cell with fewer turns uses the agent's "
        "task-group statistics instead (docs/advantages.md 'Turn scope'); 1 = never.",
        default=2,
    )
    advantage_rae_decay: float = _help(
        "advantage_mode rae: d in b_k <- d b_k + (1 - d) r, the decay of each agent's moving-average baseline "
        "(SPIRAL's role_baseline_ema_gamma), in (0, 1).",
        default=RAE_DEFAULT_DECAY,
    )
    advantage_eps: float = _help("epsilon in A = (s - mu)/(sigma + epsilon).", default=1e-6)
    advantage_stats: str = _help(
        "How every mean/std of the advantage is estimated: 'paper' (population std; an agent that acted once in "
        "a task group gets advantage 0) or 'reference' (as the Dr. MAS reference code: unbiased std, and a "
        "one-sample cell gets its raw score); docs/advantages.md 'Estimator'.",
        default="paper",
    )
    sampling: SamplingConfig = _help(
        "Default sampling of every agent during training.", default_factory=SamplingConfig
    )
    max_prompt_length: int = _help(
        "Longest prompt (tokens) an agent turn may have; a longer one is not truncated: the turn is skipped as an "
        "invalid (empty) action and counted in charts/prompt_overflow.",
        default=1024,
    )
    max_steps: int = _help("Number of training steps (TRL's name).", default=6)
    seed: int = _help("Random seed (data order, sampling, initialisation).", default=0)
    device: str = _help("auto, cpu, cuda or cuda:N.", default="auto")
    pool: str = _help(f"Where model groups live, one of {list(POOLS)}.", default="local")
    num_ranks: int = _help(
        "Default of model_groups.<g>.num_ranks for every trainable group: processes each group's update is "
        "sharded over (1 = unsharded, in the group's worker).",
        default=1,
    )
    sharding: str = _help(
        f"Default of model_groups.<g>.sharding, one of {list(SHARDINGS)} (PyTorch FSDP2).", default="fsdp2"
    )
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
    log_episodes: int = _help(
        "Episodes of each training step written to RUN/rollouts/step-N.jsonl (and TensorBoard text, and the "
        "run's report.html), half successes and half failures where the step has both; 0 = none.",
        default=4,
    )
    log_eval_episodes: int = _help(
        "Eval tasks whose first episode each evaluation writes to RUN/rollouts/ (the same tasks every "
        "evaluation: report.html shows step 0 and the last evaluation side by side); 0 = none.",
        default=16,
    )
    save_steps: int = _help(
        "Save a checkpoint every N steps (and at the end); 0 = only at the end.", default=3
    )
    save_total_limit: int | None = _help(
        "Keep only the newest N checkpoints of the run. None = keep all.", default=2
    )
    eval_steps: int = _help("Evaluate every N steps (and at the end); 0 = never.", default=6)
    eval_before_training: bool = _help(
        "Also evaluate before the first step (step 0: the initial weights), when evaluation is on.",
        default=True,
    )
    eval_k: int = _help("Samples per eval task for avg@k / pass@k.", default=4)
    eval_num_tasks: int | None = _help("Eval tasks per evaluation. None = all.", default=2)
    eval_tasks_per_batch: int = _help("Eval tasks rolled out together (memory vs speed).", default=8)
    eval_opponents: list[str] = _help(
        "Games: scripted opponents the learner also plays in every seat at each evaluation (random, "
        "minimax?epsilon=0, equilibrium; eval/vs/<opponent>/win|draw|loss|return).",
        default_factory=list,
    )
    eval_sampling: EvalSamplingConfig = _help(
        "Sampling of every agent during evaluation (each agent keeps its own max_new_tokens unless set here).",
        default_factory=EvalSamplingConfig,
    )
    resume: str | None = _help(
        "Continue a run: a checkpoint folder (runs/<run>/checkpoints/step-N), a run folder (its newest "
        "checkpoint), or 'latest' (the newest checkpoint of any run under --output_dir). The run's saved config "
        "is the base; --config and flags given now override it.",
        default=None,
    )

    def __post_init__(self) -> None:
        check_advantage_settings(self)
        check_choice("backend", self.backend, BACKENDS)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("pool", self.pool, POOLS)
        check_choice("sharding", self.sharding, SHARDINGS)
        for r in self.report_to:
            check_choice("report_to", r, REPORT_TO)
        if isinstance(self.model_sharing, str):
            check_choice("model_sharing", self.model_sharing, SHARING_MODES)
        elif not isinstance(self.model_sharing, Mapping) or not self.model_sharing:
            raise ConfigError(
                f"model_sharing must be one of {list(SHARING_MODES)} or a non-empty mapping agent -> group"
            )
        else:
            for agent, group in self.model_sharing.items():
                if not isinstance(group, str) or not GROUP_NAME_RE.match(group):
                    raise ConfigError(
                        f"model_sharing[{agent!r}] = {group!r}: a group name may use letters, digits, '_', '.', '-'"
                    )
        for name, minimum in (
            ("tasks_per_step", 1),
            ("max_steps", 1),
            ("max_prompt_length", 1),
            ("micro_batch_size", 1),
            ("num_ranks", 1),
            ("logging_steps", 1),
            ("log_episodes", 0),
            ("log_eval_episodes", 0),
            ("save_steps", 0),
            ("eval_steps", 0),
            ("eval_k", 1),
            ("eval_tasks_per_batch", 1),
        ):
            check_min(name, getattr(self, name), minimum)
        check_min("eval_num_tasks", self.eval_num_tasks, 1, none_ok=True)
        check_min("save_total_limit", self.save_total_limit, 1, none_ok=True)
        if self.advantage_eps <= 0:
            raise ConfigError(f"advantage_eps must be > 0, got {self.advantage_eps}")
        if self.invalid_action_penalty is not None and self.invalid_action_penalty < 0:
            raise ConfigError(f"invalid_action_penalty must be >= 0, got {self.invalid_action_penalty}")
        check_optim("top level", self)
        check_grpo("grpo", self.grpo)
        if self.backend_options:
            backend_options(self.backend, self.backend_options, "backend_options")
        for key_name, section in (("model_groups", self.model_groups), ("agents", self.agents)):
            for key, sub in section.items():
                if sub.name and sub.name != key:
                    raise ConfigError(
                        f"{key_name}[{key!r}] has name {sub.name!r}; leave name empty or equal the key"
                    )
                sub.name = key
                if isinstance(sub, ModelGroupConfig):
                    if not GROUP_NAME_RE.match(key):
                        raise ConfigError(
                            f"model_groups.{key}: a group name may use letters, digits, '_', '.', '-' only"
                        )
                    kind = sub.backend or self.backend
                    inherited = self.backend_options if kind == self.backend else {}
                    if sub.backend_options or inherited:
                        backend_options(
                            kind, {**inherited, **sub.backend_options}, f"model_groups.{key}.backend_options"
                        )

    # ------------------------------------------------------------------------------------------------ views
    def to_dict(self) -> dict[str, object]:
        """Plain nested dict (YAML-ready); ``TrainConfig.from_dict(cfg.to_dict()) == cfg``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TrainConfig:
        """Build from a nested mapping (a parsed YAML file), coercing values to the field types.

        Per-agent ``sampling`` may be partial; missing keys come from the top-level ``sampling``.

        Raises:
            ConfigError: unknown keys (with close matches), wrong types, invalid values.
        """
        return cls.from_layers([data])

    @classmethod
    def from_layers(cls, layers: Sequence[Mapping[str, object]]) -> TrainConfig:
        """Build from several mappings merged in order (later wins), as :func:`parse_args` does.

        Raises:
            ConfigError: as :meth:`from_dict`.
        """
        for data in layers:
            if not isinstance(data, Mapping):
                raise ConfigError(f"a config must be a mapping of settings, got {type(data).__name__}")
            for key in ("agents", "model_groups"):
                if data.get(key) is not None and not isinstance(data[key], Mapping):
                    raise ConfigError(
                        f"{key} must be a mapping name -> settings, got {type(data[key]).__name__}"
                    )
        layers = [*laptop_layer(layers), *layers]
        # keys of an agent's sampling that some layer sets; the others are taken from the top-level sampling
        given: dict[str, set[str]] = {}
        for data in layers:
            agents = data.get("agents") or {}
            assert isinstance(agents, Mapping)  # checked above (the laptop layer names no agents)
            for name, agent in agents.items():
                sampling = agent.sampling if isinstance(agent, AgentConfig) else (agent or {}).get("sampling")
                if isinstance(sampling, SamplingConfig):
                    given.setdefault(name, set()).update(f.name for f in dataclasses.fields(SamplingConfig))
                elif isinstance(sampling, Mapping):
                    given.setdefault(name, set()).update(sampling)

        def fixup(merged: Any) -> None:
            for section in ("agents", "model_groups"):  # a section knows its key (for its messages)
                for key, sub in merged[section].items():
                    if not sub.name:
                        sub.name = str(key)
            for name, keys in given.items():
                agent_sampling = merged.agents[name].sampling
                if agent_sampling is None:
                    continue
                for f in dataclasses.fields(SamplingConfig):
                    if f.name not in keys:
                        agent_sampling[f.name] = merged.sampling[f.name]

        return build(cls, layers, fixup=fixup)

    def to_yaml(self, path: str | Path | None = None) -> str:
        """YAML text of :meth:`to_dict`; also written to ``path`` when given."""
        import yaml

        text: str = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """Load a YAML file written by hand or by :meth:`to_yaml`.

        Raises:
            ConfigError: no such file, not a mapping, or an invalid setting.
        """
        return cls.from_dict(load_yaml(path))

    # --------------------------------------------------------------------------------------------- helpers
    def env_make_kwargs(self) -> dict[str, object]:
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
            A :class:`~mas_train.config.ResolvedConfig`; model groups appear in order of their first agent.

        Raises:
            ConfigError: an agent named in ``agents``/``model_sharing`` that the env does not have (the message
                lists the env's agents); an agent missing from an explicit mapping; settings for a model group
                no agent uses; agents of one model group that disagree on their model, an optimisation setting
                or ``trainable``; a backend that cannot train on a trainable group; invalid backend options;
                ``shared_lora`` groups that name different models -- all before any model loads.
        """
        return resolve(self, list(agent_names))

"""The per-agent and per-model-group sections of a run config, and the sampling and LoRA settings they hold.

Fields left ``None`` inherit: agent -> model group -> top level (:class:`~mas_train.config.TrainConfig`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mas_train.backends.base import SamplingParams
from mas_train.config.common import (
    BACKENDS,
    DTYPES,
    GROUP_NAME_RE,
    SHARDINGS,
    ConfigError,
    check_choice,
    check_min,
    check_optim,
)
from mas_train.config.common import help_field as _help
from mas_train.config.grpo import check_grpo

__all__ = [
    "AgentConfig",
    "DynamicSamplingConfig",
    "EvalSamplingConfig",
    "LeagueConfig",
    "LoraConfig",
    "ModelGroupConfig",
    "PoolBand",
    "RewardWeights",
    "SamplingConfig",
    "TaskPoolConfig",
]


@dataclass
class RewardWeights:
    """How an agent's turn is scored: ``s = team * R + role * role_reward - c * invalid``.

    ``R`` is the episode's team reward, ``role_reward`` the env's role score of the turn (``Outcome.role_rewards``;
    0 for a turn it does not score) and ``c`` the invalid-action penalty. The default (team 1, role 0) is the
    paper's team reward, and then the score is bit-identical to ``R - c * invalid``.
    """

    team: float = _help("Weight of the team reward R in the agent's turn scores.", default=1.0)
    role: float = _help(
        "Weight of the env's role score of the turn (docs/envs.md 'Role rewards'); 0 = team reward only.",
        default=0.0,
    )

    def __post_init__(self) -> None:
        for name in ("team", "role"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"reward_weights.{name} must be a finite number >= 0, got {v!r}")
            setattr(self, name, float(v))


@dataclass
class SamplingConfig:
    """How an agent samples its turns (one :class:`~mas_train.backends.base.SamplingParams` per turn)."""

    temperature: float = _help(
        "Softmax temperature for sampling; 0 = greedy. Training logprobs use the same temperature.",
        # the 4-bit SmolLM2-135M default writes gibberish at 1.0 (never a valid action, so no learning signal);
        # 0.7 keeps it coherent. The reference trains 4B+ models at 1.0: set sampling.temperature for those.
        default=0.7,
    )
    top_p: float = _help("Nucleus sampling mass in (0, 1]; 1 disables it.", default=1.0)
    top_k: int = _help("Keep only the k most likely tokens; 0 disables it.", default=0)
    max_new_tokens: int = _help(
        "Maximum tokens generated per agent turn (TRL: max_completion_length).",
        default=128,
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
class EvalSamplingConfig:
    """How every agent samples during evaluation (``mas_train.eval.eval_sampling`` applies it): each agent keeps
    its own training ``max_new_tokens`` and stop strings unless ``max_new_tokens`` is set here."""

    temperature: float = _help(
        "Softmax temperature during evaluation; 0 = greedy.",
        default=0.6,  # the reference's validation sampling (temperature 0.6, top_p 0.95)
    )
    top_p: float = _help("Nucleus sampling mass in (0, 1] during evaluation.", default=0.95)
    top_k: int = _help("Keep only the k most likely tokens during evaluation; 0 disables it.", default=0)
    max_new_tokens: int | None = _help(
        "Tokens per agent turn during evaluation. None = each agent's own training max_new_tokens.",
        default=None,
    )

    def __post_init__(self) -> None:
        try:
            SamplingParams(
                max_new_tokens=self.max_new_tokens or 1,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=max(self.top_k, 0),
            )
        except ValueError as err:
            raise ConfigError(f"eval_sampling: {err}") from None
        if self.top_k < -1:
            raise ConfigError(f"eval_sampling.top_k must be >= 0, got {self.top_k}")


@dataclass
class LoraConfig:
    """A LoRA adapter (PEFT's ``LoraConfig`` names): ``W + (alpha / r) * B A`` on each target module."""

    r: int = _help("Adapter rank.", default=16)
    alpha: int = _help("Scaling numerator: the update is scaled by alpha / r (PEFT: lora_alpha).", default=32)
    dropout: float = _help("Dropout on the adapter input, in [0, 1) (PEFT: lora_dropout).", default=0.0)
    target_modules: list[str] = _help(
        "Module names that get an adapter (PEFT: target_modules).",
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
    )

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha < 1:
            raise ConfigError(f"lora: r and alpha must be >= 1, got r={self.r}, alpha={self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("lora.target_modules must name at least one module (e.g. q_proj)")


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
    trainable: bool | None = _help(
        "Train this group's weights (false: it only samples). None = the top-level trainable.", default=None
    )
    backend: str | None = _help(
        f"Generation backend, one of {list(BACKENDS)}. None = top level.", default=None
    )
    backend_options: dict[str, Any] = _help(
        "Options of this group's backend kind (mas_train.backends.options: HFOptions, SGLangEngineOptions, "
        "SGLangHTTPOptions, OpenAIOptions), merged over the top-level backend_options when the kinds match.",
        default_factory=dict,
    )
    dtype: str | None = _help(f"Weights dtype, one of {list(DTYPES)}. None = top level.", default=None)
    lora: LoraConfig | None = _help(
        "Train a LoRA adapter instead of all weights. None = the top-level lora (None there too: full "
        "fine-tuning; model_sharing shared_lora: a default adapter).",
        default=None,
    )
    micro_batch_size: int | None = _help(
        "Samples per forward/backward of this group's update. None = top level.", default=None
    )
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
    num_ranks: int | None = _help(
        "Processes this group's update runs on, its weights, gradients and optimizer state sharded over them "
        "(sharding); generation stays in the group's worker. None = the top-level num_ranks.",
        default=None,
    )
    sharding: str | None = _help(
        f"How a group with num_ranks > 1 shards its update, one of {list(SHARDINGS)}. None = top level.",
        default=None,
    )
    rank_gpu_ids: list[int] = _help(
        "GPU of each of the group's num_ranks ranks on a CUDA run (pool: local), rank 0 first. Empty = GPUs "
        "0..num_ranks-1.",
        default_factory=list,
    )
    num_cpus: float = _help(
        "CPUs reserved for this group's worker (pool: ray), and for each of its rank actors when num_ranks > 1.",
        default=1.0,
    )
    num_gpus: float = _help(
        "GPUs (fractions allowed) reserved for this group (pool: ray): its worker's; with num_ranks > 1 the "
        "group's total, one GPU per rank actor and the rest (> 0) for the worker's generation.",
        default=0.0,
    )

    def __post_init__(self) -> None:
        where = f"model_groups.{self.name}" if self.name else "model_groups.<group>"
        if self.name and not GROUP_NAME_RE.match(self.name):
            raise ConfigError(f"{where}: a group name may use letters, digits, '_', '.', '-' only")
        if self.backend is not None:
            check_choice(f"{where}.backend", self.backend, BACKENDS)
        if self.dtype is not None:
            check_choice(f"{where}.dtype", self.dtype, DTYPES)
        check_min(f"{where}.micro_batch_size", self.micro_batch_size, 1, none_ok=True)
        check_min(f"{where}.num_ranks", self.num_ranks, 1, none_ok=True)
        if self.sharding is not None:
            check_choice(f"{where}.sharding", self.sharding, SHARDINGS)
        check_optim(where, self)
        check_grpo(f"{where}.grpo", self.grpo)
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
    trainable: bool | None = _help(
        "Train on this agent's turns. A model group is trained as a whole: its agents must agree. None = the "
        "group's (then the top-level) trainable.",
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
    reward_weights: RewardWeights | None = _help(
        "Score of this agent's turns: team * R + role * role_reward - c * invalid. None = {team: 1, role: 0} "
        "(the team reward only). A role weight needs an env that scores this agent by role.",
        default=None,
    )

    def __post_init__(self) -> None:
        check_optim(f"agents.{self.name or '<agent>'}", self)


def _refuse_unused(
    section: str, cfg: TaskPoolConfig | DynamicSamplingConfig | LeagueConfig, names: Sequence[str]
) -> None:
    """A setting of a section that is off would be silently ignored: refuse it (one line saying what to do)."""
    if cfg.enabled:
        return
    default = type(cfg)(enabled=True)  # the defaults (enabled: its own check returns at once)
    changed = [n for n in names if getattr(cfg, n) != getattr(default, n)]
    if changed:
        raise ConfigError(
            f"{section}.{changed[0]} is set but {section}.enabled is false, so it would do nothing; add "
            f"--{section}.enabled true (or drop the setting)"
        )


@dataclass
class PoolBand:
    """A named pool of the task pool: the seen tasks whose recent solve rate lies in ``[min, max]`` (inclusive),
    drawn with relative ``weight`` (prime-rl's difficulty pools)."""

    min: float = _help("Lowest solve rate in the pool (inclusive).", default=0.0)
    max: float = _help("Highest solve rate in the pool (inclusive).", default=1.0)
    weight: float = _help("Relative weight of drawing from this pool (0 = never).", default=1.0)

    def __post_init__(self) -> None:
        for name in ("min", "max", "weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"task_pool.pools: {name} must be a finite number, got {v!r}")
            setattr(self, name, float(v))
        if not 0.0 <= self.min <= self.max <= 1.0 or self.weight < 0:
            raise ConfigError(
                f"task_pool.pools: need 0 <= min <= max <= 1 and weight >= 0, got min {self.min}, max {self.max}, "
                f"weight {self.weight}"
            )


def _default_pools() -> dict[str, PoolBand]:
    return {
        "easy": PoolBand(1.0, 1.0, 0.1),
        "hard": PoolBand(0.0, 0.0, 0.1),
        "normal": PoolBand(0.0, 1.0, 1.0),
    }


@dataclass
class TaskPoolConfig:
    """Draw training tasks by their recent solve rate (:mod:`mas_train.task_pool`); off: the data order of
    :class:`~mas_train.tasks.TaskSampler`."""

    enabled: bool = _help(
        "Draw tasks from pools by recent solve rate instead of in data order.", default=False
    )
    ema: float = _help(
        "Weight of a task's newest solve rate in its moving average: rate += ema * (new - rate); 1 = latest only.",
        default=0.5,
    )
    unseen_weight: float = _help(
        "Relative weight of the pool of tasks never drawn yet (in data order).", default=1.0
    )
    pools: dict[str, PoolBand] = _help(
        "Named pools of seen tasks (min, max, weight); a task is in the narrowest pool whose band holds its rate.",
        default_factory=_default_pools,
    )

    def __post_init__(self) -> None:
        _refuse_unused("task_pool", self, ("ema", "unseen_weight", "pools"))
        if not 0.0 < self.ema <= 1.0:
            raise ConfigError(f"task_pool.ema must be in (0, 1], got {self.ema}")
        if self.unseen_weight < 0:
            raise ConfigError(f"task_pool.unseen_weight must be >= 0, got {self.unseen_weight}")
        if self.enabled and self.unseen_weight == 0 and not any(b.weight > 0 for b in self.pools.values()):
            raise ConfigError(
                "task_pool: every pool has weight 0, so no task could be drawn; give one a weight > 0"
            )


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling per (model group, agent) cell (:mod:`mas_train.task_pool`): a step keeps only
    task groups in which some trainable agent's rewards differ, drawing more tasks until it has
    ``tasks_per_step`` of them or ``max_rounds`` rollouts were made."""

    enabled: bool = _help("Keep only task groups with a learning signal, refilling the step.", default=False)
    oversample: float = _help("Tasks drawn per missing task group in each round (>= 1).", default=1.5)
    max_rounds: int = _help("Rollouts per step at most; the step trains on what it has then.", default=3)
    std_tol: float = _help(
        "A cell whose per-trajectory rewards have a std <= std_tol * max(1, |mean|) counts as constant.",
        default=1e-6,
    )

    def __post_init__(self) -> None:
        # std_tol is honoured either way: it also decides the logged sampling/zero_std_cells
        _refuse_unused("dynamic_sampling", self, ("oversample", "max_rounds"))
        if not math.isfinite(self.oversample) or self.oversample < 1:
            raise ConfigError(f"dynamic_sampling.oversample must be >= 1, got {self.oversample}")
        check_min("dynamic_sampling.max_rounds", self.max_rounds, 1)
        if not math.isfinite(self.std_tol) or self.std_tol < 0:
            raise ConfigError(f"dynamic_sampling.std_tol must be a finite number >= 0, got {self.std_tol}")


@dataclass
class LeagueConfig:
    """Self-play with a league for a game env (:mod:`mas_train.league`): each task group's opponent is drawn from
    a mix of the learner itself (every seat trains), frozen snapshots of the learner's adapters taken every
    ``snapshot_every`` steps, and scripted policies; against a snapshot or a script one seat, drawn at random,
    trains."""

    enabled: bool = _help("Draw each task group's opponent from the league mix.", default=False)
    self_play: float = _help("Weight of self-play (every seat is the learner).", default=0.5)
    snapshots: float = _help(
        "Weight of a frozen snapshot (one of the kept ones, uniformly); 0 before the first snapshot; "
        "weight 0: no snapshot is taken.",
        default=0.3,
    )
    scripted: dict[str, float] = _help(
        "Scripted opponents and their weights: random (any game), minimax (tic-tac-toe; minimax?epsilon=0.2), "
        "equilibrium (Kuhn poker; equilibrium?alpha=0.3).",
        default_factory=lambda: {"random": 0.2},
    )
    snapshot_every: int = _help("Steps between snapshots of the learner's adapters.", default=4)
    max_snapshots: int = _help("Snapshots kept (the oldest is dropped).", default=4)

    def __post_init__(self) -> None:
        _refuse_unused(
            "league", self, ("self_play", "snapshots", "scripted", "snapshot_every", "max_snapshots")
        )
        weights = {"self_play": self.self_play, "snapshots": self.snapshots} | {
            f"scripted.{k}": v for k, v in self.scripted.items()
        }
        for name, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ConfigError(f"league.{name} must be a finite weight >= 0, got {w!r}")
        if self.enabled and self.self_play + sum(self.scripted.values()) <= 0:
            raise ConfigError(
                "league: self_play and every scripted weight are 0, so the first steps (before any snapshot) "
                "would have no opponent; give self_play or a scripted opponent a weight > 0"
            )
        check_min("league.snapshot_every", self.snapshot_every, 1)
        check_min("league.max_snapshots", self.max_snapshots, 1)

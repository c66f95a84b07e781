"""The checks of a run's advantage settings (``advantage_*``, and what they need of ``num_generations``): each
setting that does not apply to the chosen ``advantage_mode`` / ``advantage_scope`` is refused with one line saying
what to do, never silently ignored."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mas_train.advantages import RAE_DEFAULT_DECAY
from mas_train.config.common import (
    ADVANTAGE_MODES,
    ADVANTAGE_SCOPES,
    ADVANTAGE_STATS,
    ConfigError,
    check_choice,
    check_min,
)

if TYPE_CHECKING:
    from mas_train.config.train import TrainConfig

__all__ = ["check_advantage_settings"]


def check_advantage_settings(cfg: TrainConfig) -> None:
    """Validate ``cfg``'s advantage settings (called by ``TrainConfig.__post_init__``).

    Raises:
        ConfigError: an unknown mode/scope/stats, a setting that does nothing under the chosen mode or scope,
            or ``num_generations`` 1 where the advantages compare a task's G episodes.
    """
    check_choice("advantage_mode", cfg.advantage_mode, ADVANTAGE_MODES)
    check_choice("advantage_scope", cfg.advantage_scope, ADVANTAGE_SCOPES)
    check_choice("advantage_stats", cfg.advantage_stats, ADVANTAGE_STATS)
    if cfg.advantage_scope == "turn" and cfg.advantage_mode == "grpo":
        raise ConfigError(
            "advantage_scope: turn groups the per-agent statistics by turn position, and advantage_mode: grpo "
            "has none; use advantage_mode drmas (or agent_mean / agent_std), or advantage_scope group"
        )
    _check_rae(cfg)
    check_min("advantage_turn_min_samples", cfg.advantage_turn_min_samples, 1)
    if cfg.advantage_turn_min_samples != 2 and cfg.advantage_scope != "turn":
        raise ConfigError(
            f"advantage_turn_min_samples {cfg.advantage_turn_min_samples} only applies with advantage_scope "
            f"turn (this run groups by {cfg.advantage_scope!r}); set advantage_scope turn or drop it"
        )
    check_min("num_generations", cfg.num_generations, 1)
    if (
        cfg.num_generations == 1
        and cfg.advantage_mode != "rae"  # its baseline spans steps, not the task group
        and (cfg.advantage_scope == "group" or cfg.tasks_per_step == 1)
    ):
        raise ConfigError(
            "num_generations must be >= 2: the advantages compare the G episodes of one task, and with G = 1 "
            "every trajectory's advantage is 0, so nothing would be learned (TRL's GRPO requires 2 as well); "
            "use --num_generations 2 or more (or advantage_mode rae, whose baseline spans steps, or "
            "advantage_scope: batch with tasks_per_step >= 2, which compares the tasks of a step)"
        )


def _check_rae(cfg: TrainConfig) -> None:
    """RAE's decay only applies to rae, and the group statistics' settings do not apply to it: refuse either
    mismatch rather than ignore it."""
    if cfg.advantage_mode != "rae":
        if cfg.advantage_rae_decay != RAE_DEFAULT_DECAY:
            raise ConfigError(
                f"advantage_rae_decay is set but advantage_mode is {cfg.advantage_mode}, so it would do "
                "nothing; add --advantage_mode rae (or drop the setting)"
            )
        return
    d = cfg.advantage_rae_decay
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 < d < 1.0:
        raise ConfigError(f"advantage_rae_decay must be a number in (0, 1) (SPIRAL: 0.95), got {d!r}")
    for name, default in (
        ("advantage_scope", "group"),
        ("advantage_stats", "paper"),
        ("advantage_eps", 1e-6),
    ):
        if getattr(cfg, name) != default:
            raise ConfigError(
                f"{name} {getattr(cfg, name)!r} does not apply to advantage_mode rae (one moving-average "
                f"baseline per agent, no group statistics, no std); drop the setting"
            )
    if cfg.dynamic_sampling.enabled:
        raise ConfigError(
            "dynamic_sampling keeps only task groups whose agents' scores differ, but under advantage_mode rae "
            "a group of equal scores still has signal (s - b_k, b_k from earlier steps); set "
            "--dynamic_sampling.enabled false"
        )

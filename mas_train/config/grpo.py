"""Which TRL ``GRPOConfig`` settings a run may pass in ``grpo:`` (top level or ``model_groups.<g>.grpo``).

Our update (one model group, pre-built samples) calls TRL's ``GRPOTrainer.compute_loss`` on inputs it builds
itself and never runs ``_generate_and_score_completions`` or ``Trainer.train``; so a ``GRPOConfig`` field
takes effect only if ``compute_loss`` / ``_compute_loss`` / ``_get_per_token_logps_and_entropies``, the
trainer's ``__init__`` (dropout, checkpointing, reference model) or the optimizer/scheduler read it. Every other
field is refused with the reason, never silently ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mas_train.config.common import OPTIM_FIELDS, ConfigError, close_matches

__all__ = ["GRPO_CHOICES", "GRPO_HONOURED", "check_grpo"]

#: GRPOConfig fields our update honours. Checked against TRL 1.16.0 (``trl/trainer/grpo_trainer.py``: the
#: attributes ``_compute_loss`` reads, set in ``__init__`` from ``args``) and transformers 5 (optimizer and
#: scheduler creation). Re-check this list when TRL is upgraded.
GRPO_HONOURED: frozenset[str] = frozenset(
    {
        # the loss (_compute_loss)
        "loss_type",
        "epsilon",
        "epsilon_high",
        "beta",
        "num_iterations",
        "importance_sampling_level",
        "delta",
        "top_entropy_quantile",
        "off_policy_mask_threshold",
        "use_bias_correction_kl",
        "entropy_coef",
        "use_adaptive_entropy",
        "entropy_target",
        "entropy_coef_delta",
        "entropy_coef_min",
        "entropy_coef_max",
        "sapo_temperature_pos",
        "sapo_temperature_neg",
        "vespo_k_pos",
        "vespo_k_neg",
        "vespo_lambda_pos",
        "vespo_lambda_neg",
        "router_aux_loss_coef",
        # the importance-sampling correction: TRL names it after vLLM; our update applies it for every backend
        "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode",
        "vllm_importance_sampling_clip_min",
        "vllm_importance_sampling_clip_max",
        # applied by our update (TRL applies it only in _generate_and_score_completions)
        "mask_truncated_completions",
        # GRPOTrainer.__init__
        "disable_dropout",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "activation_checkpointing",
        # optimizer and scheduler (transformers TrainingArguments)
        "optim",
        "optim_args",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "lr_scheduler_kwargs",
    }
)

#: The values TRL 1.16.0 accepts for the enumerated GRPOConfig settings we honour: the branches of
#: ``GRPOTrainer._compute_loss`` (``loss_type``; any other value raises "Unknown loss type" at the first update),
#: ``_compute_loss``'s importance weights (``importance_sampling_level``) and our update's importance-sampling
#: correction (``vllm_importance_sampling_mode``, TRL's four modes). The help text of each GRPOConfig field
#: lists the same values (tests/train/test_config.py compares them). ``optim`` is checked against transformers'
#: ``OptimizerNames`` when given.
GRPO_CHOICES: dict[str, tuple[str, ...]] = {
    "loss_type": ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
    "importance_sampling_level": ("token", "sequence"),
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}

# GRPOConfig keys that this config owns elsewhere; passing them in `grpo:` would silently fight it.
_RESERVED = {
    **dict.fromkeys(OPTIM_FIELDS, "the field of the same name (top level, model_groups.<g>, or agents.<a>)"),
    "num_generations": "the top-level num_generations",
    "max_steps": "the top-level max_steps",
    "seed": "the top-level seed",
    "output_dir": "the top-level output_dir",
    "run_name": "the top-level run_name",
    "report_to": "the top-level report_to",
    "save_steps": "the top-level save_steps",
    "save_total_limit": "the top-level save_total_limit",
    "eval_steps": "the top-level eval_steps",
    "logging_steps": "the top-level logging_steps",
    "log_completions": "the top-level log_episodes (episodes in RUN/rollouts/, TensorBoard text, report.html)",
    "num_completions_to_print": "the top-level log_episodes (episodes in RUN/rollouts/, report.html)",
    "temperature": "sampling.temperature / agents.<a>.sampling.temperature",
    "top_p": "sampling.top_p / agents.<a>.sampling.top_p",
    "top_k": "sampling.top_k / agents.<a>.sampling.top_k",
    "max_completion_length": "sampling.max_new_tokens / agents.<a>.sampling.max_new_tokens",
    "use_vllm": "model_groups.<g>.backend (generation runs on mas_train backends, not TRL's vLLM)",
}

_SAMPLING = "sampling is done by our backends; use sampling.* settings"
_REASONS = {
    **dict.fromkeys(
        (
            "repetition_penalty",
            "min_p",
            "generation_kwargs",
            "generation_batch_size",
            "cache_implementation",
            "use_transformers_paged",
            "chat_template_kwargs",
            "num_generations_eval",
            "max_prompt_length",
            "max_tool_calling_iterations",
        ),
        _SAMPLING,
    ),
    **dict.fromkeys(
        ("scale_rewards", "reward_weights", "multi_objective_aggregation"),
        "advantages come from advantage_mode / advantage_scope",
    ),
    "model_init_kwargs": "models are loaded by mas_train (model, dtype)",
    "steps_per_generation": "each step trains on the samples of that step; use num_iterations",
}


_GRPO_FIELDS: frozenset[str] | None = None


def _grpo_fields() -> frozenset[str] | None:
    """GRPOConfig's field names, or None when TRL is not installed."""
    global _GRPO_FIELDS
    if _GRPO_FIELDS is None:
        try:
            from trl import GRPOConfig
        except ImportError:
            return None
        _GRPO_FIELDS = frozenset(f.name for f in dataclasses.fields(GRPOConfig))
    return _GRPO_FIELDS


def _optimizer_names() -> tuple[str, ...]:
    from transformers.training_args import OptimizerNames  # imported only when a run sets grpo.optim

    return tuple(o.value for o in OptimizerNames)


def check_grpo(where: str, grpo: Mapping[str, object]) -> None:
    """Refuse a ``grpo`` mapping key that is reserved, unknown to TRL, or not honoured by our update, and a
    value of an enumerated setting (:data:`GRPO_CHOICES`, ``optim``) that TRL / transformers would reject only
    after the models are loaded and a rollout has run.

    Raises:
        ConfigError: the message names the key and says where to set it instead, or why it cannot apply, or
            lists the accepted values.
    """
    if not isinstance(grpo, Mapping):
        raise ConfigError(f"{where} must be a mapping of GRPOConfig settings, got {type(grpo).__name__}")
    for key in grpo:
        if key in GRPO_HONOURED:
            choices = GRPO_CHOICES.get(key) or (_optimizer_names() if key == "optim" else None)
            if choices is not None and grpo[key] not in choices:
                raise ConfigError(
                    f"{where}.{key} must be one of {list(choices)} (TRL's accepted values), got {grpo[key]!r}."
                    f"{close_matches(str(grpo[key]), choices)}"
                )
            continue
        if key in _RESERVED:
            raise ConfigError(f"{where}.{key}: set it through {_RESERVED[key]}, not through grpo")
        if key.startswith("vllm_"):
            raise ConfigError(
                f"{where}.{key}: vLLM settings do not apply; generation runs on mas_train backends"
            )
        known = _grpo_fields()  # importing TRL takes seconds: only for a key that is not honoured
        if known is not None and key not in known:
            raise ConfigError(
                f"{where}.{key} is not a TRL GRPOConfig setting.{close_matches(key, sorted(GRPO_HONOURED))}"
            )
        reason = _REASONS.get(
            key, "our update calls TRL's compute_loss on pre-built samples and never reads it"
        )
        raise ConfigError(
            f"{where}.{key} is a TRL GRPOConfig setting that mas_train does not honour: {reason}. Honoured: "
            f"{', '.join(sorted(GRPO_HONOURED))}"
        )

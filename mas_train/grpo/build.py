"""A model group's :class:`~mas_train.grpo.update.GroupGRPOTrainer`, built from the resolved run config: the
group's GRPO settings, its agents' sampling temperature and token budget, its precision and the importance-sampling
rule. Used by the group's worker and by each rank of a sharded group."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from mas_train.config import ResolvedConfig
from mas_train.grpo.trl_adapter import grpo_args
from mas_train.grpo.update import GroupGRPOTrainer, ShardPlan
from mas_train.precision import resolve_precision, tis_rule

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["build_group_trainer"]

logger = logging.getLogger(__name__)


def build_group_trainer(
    resolved: ResolvedConfig,
    group: str,
    model: torch.nn.Module,
    tok: PreTrainedTokenizerBase,
    device: str,
    *,
    shard: ShardPlan | None = None,
) -> GroupGRPOTrainer:
    """The :class:`~mas_train.grpo.update.GroupGRPOTrainer` of model group ``group`` on ``model`` (trained in place):
    the group's GRPO settings, the sampling temperature of its agents, ``max_completion_length`` from their
    ``max_new_tokens``. Used by the group's worker and by each rank of a sharded group."""
    cfg = resolved.config
    g = resolved.model_groups[group]
    agents = tuple(g.agents)
    samplings = [resolved.agents[a].sampling for a in agents]
    temps = {s.temperature for s in samplings}
    if len(temps) > 1:
        logger.warning(
            "agents %s of model group %r sample at different temperatures %s; the trainer scores completions "
            "at %s and the importance-sampling ratio absorbs the rest",
            agents,
            group,
            sorted(temps),
            samplings[0].temperature,
        )
    # log_softmax(logits / T) is the sampled distribution; greedy (T=0) reports temperature-1 logprobs.
    temperature = samplings[0].temperature or 1.0
    kwargs = g.grpo_config_kwargs()
    kwargs.setdefault("max_completion_length", max(s.max_new_tokens for s in samplings))
    precision = resolve_precision(g.dtype, device, lora=g.lora is not None)
    kwargs["vllm_importance_sampling_correction"] = tis_rule(g, precision)[0]
    args = grpo_args(
        str(resolved.run_dir / "trl" / group),
        max_steps=cfg.max_steps,
        seed=cfg.seed,
        use_cpu=not device.startswith("cuda"),
        bf16=precision.autocast,
        temperature=temperature,
        **kwargs,
    )
    return GroupGRPOTrainer(model, tok, args, micro_batch_size=g.micro_batch_size, shard=shard)

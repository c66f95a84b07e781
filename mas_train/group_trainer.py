"""The :class:`~mas_train.update.GroupGRPOTrainer` a model group builds, from its resolved settings; used by the
group's worker (:mod:`mas_train.worker`) and by every rank of a sharded group (:mod:`mas_train.sharded`)."""

from __future__ import annotations

import logging

import torch

from mas_train.update import GroupGRPOTrainer, grpo_args

__all__ = ["build_group_trainer"]

logger = logging.getLogger(__name__)


def _device(spec: str) -> str:
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec


def _torch_dtype(dtype: str, device: str) -> str:
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return dtype


def build_group_trainer(resolved, group: str, model, tok, device: str) -> GroupGRPOTrainer:
    """The :class:`~mas_train.update.GroupGRPOTrainer` of model group ``group`` on ``model`` (trained in place):
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
    args = grpo_args(
        str(resolved.run_dir / "trl" / group),
        max_steps=cfg.max_steps,
        seed=cfg.seed,
        use_cpu=not device.startswith("cuda"),
        bf16=_torch_dtype(g.dtype, device) == "bfloat16",
        temperature=temperature,
        **kwargs,
    )
    return GroupGRPOTrainer(model, tok, args, micro_batch_size=g.micro_batch_size)

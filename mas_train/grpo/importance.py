"""The importance-sampling correction between the sampler's and the trainer's log-probabilities.

The backend samples a completion with logprobs ``logp_sample``; the trainer's forward of the same tokens gives
``logp_old`` (the policy before the update). They differ (another engine, other kernels, rounding), so the
per-token advantages are reweighted by ``w = exp(logp_old − logp_sample)`` as TRL does for vLLM
(``vllm_importance_sampling_*`` settings), for every backend here: token- or sequence-level, truncated (``w``
capped to ``[clip_min, clip_max]``) or masked (``w = 0`` outside it).
"""

from __future__ import annotations

import torch

__all__ = ["IS_MODES", "importance_ratio"]

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's vLLM importance-sampling ratio, applied to any backend.

    Args:
        old_logps, sampling_logps: ``(B, T)`` float per-token logprobs of the trainer and of the sampler.
        mask: ``(B, T)`` completion mask (1 for tokens in the loss).
        mode: one of :data:`IS_MODES`; the ``sequence_*`` modes use the summed log-ratio of each row.
        clip_min, clip_max: the truncation bounds (``*_truncate``) or the kept range (``*_mask``; ``None``: open).

    Returns:
        ``(ratio, stats)``: ``ratio`` ``(B, T)``, or ``(B, 1)`` for the sequence modes; ``stats`` the mean
        ``|logp_old − logp_sample|`` over masked tokens (``sampling/sampling_logp_difference/mean``) and the mean
        ratio (``sampling/importance_sampling_ratio/mean``).

    Raises:
        ValueError: an unknown ``mode``.
    """
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff.clamp(max=30.0))
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    elif mode.endswith("mask"):
        bad = torch.zeros_like(ratio, dtype=torch.bool)
        if clip_min is not None:
            bad |= ratio < clip_min
        if clip_max is not None:
            bad |= ratio > clip_max
        ratio = ratio.masked_fill(bad, 0.0)
    else:
        raise ValueError(f"unknown vllm_importance_sampling_mode {mode!r}; use one of {', '.join(IS_MODES)}")
    m = mask.float()
    tok_diff = (old_logps - sampling_logps).abs() * m
    stats = {
        "sampling/sampling_logp_difference/mean": (tok_diff.sum() / m.sum().clamp(min=1)).item(),
        "sampling/importance_sampling_ratio/mean": (
            (ratio * m).sum().item() / m.sum().clamp(min=1).item()
            if ratio.shape[-1] != 1
            else ratio.mean().item()
        ),
    }
    return ratio, stats

"""The importance-sampling correction between the sampler's and the trainer's log-probabilities.

The backend samples a completion with logprobs ``logp_sample``; the trainer's forward of the same tokens gives
``logp_old`` (the policy before the update). They differ (another engine, other kernels, rounding), so the
per-token loss is weighted by ``w = exp(logp_old − logp_sample)`` as TRL does for vLLM
(``vllm_importance_sampling_*`` settings), for any backend: token- or sequence-level, truncated (``w``
capped to ``[clip_min, clip_max]``) or masked (``w = 0`` outside it). Where it is applied is decided per model
group by :func:`mas_train.precision.tis_rule` (where sampler and trainer differ); the mismatch itself is measured
per agent in every update (:class:`SamplerCheck`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

__all__ = ["IS_MODES", "MISMATCH_BAND", "SamplerCheck", "importance_ratio", "mismatch_sums"]

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


#: the ratio band of :class:`SamplerCheck`'s ``ratio_outside_10pct``: exp(logp_train − logp_sample) in [0.9, 1.1]
MISMATCH_BAND = (0.9, 1.1)


def mismatch_sums(
    train_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float, float, float]:
    """Sums over the masked tokens of ``(B, T)`` logprobs: ``(Σ|Δ|, #outside the band, max |Δ|, #tokens)`` with
    ``Δ = logp_train − logp_sample`` and the band :data:`MISMATCH_BAND` on ``exp(Δ)``."""
    m = mask.bool()
    d = (train_logps.detach().float() - sampling_logps.float())[m]
    if d.numel() == 0:
        return 0.0, 0.0, 0.0, 0.0
    lo, hi = MISMATCH_BAND
    r = torch.exp(d.double())
    outside = ((r < lo) | (r > hi)).sum()
    return float(d.abs().sum()), float(outside), float(d.abs().max()), float(d.numel())


class SamplerCheck:
    """The sampler–trainer mismatch of one update, per agent, and the importance-sampling weight.

    Every micro-batch's trainer logprobs (the policy before the update) are compared with the sampler's, per agent
    (``Δ = logp_train − logp_sample`` over completion tokens in the loss). :meth:`pop` gives, per agent ``a``:
    ``mismatch/mean_abs_logp_diff/a`` (mean |Δ|), ``mismatch/ratio_outside_10pct/a`` (fraction of tokens with
    ``exp(Δ)`` outside [0.9, 1.1]), ``mismatch/max_abs_logp_diff/a`` (max |Δ|: the max ratio is exp of it, or its
    inverse), plus TRL's means over all tokens (:func:`importance_ratio`'s stats) when the correction is applied.

    Args:
        correct: return the weight (the ``vllm_importance_sampling_*`` settings); ``False``: measure only.
        mode, clip_min, clip_max: see :func:`importance_ratio`.
    """

    def __init__(self, correct: bool, mode: str, clip_min: float | None, clip_max: float | None) -> None:
        self.correct, self.mode, self.clip_min, self.clip_max = correct, mode, clip_min, clip_max
        self._sums: dict[str, list[float]] = {}
        self._trl: dict[str, list[float]] = {}

    def __call__(
        self, inputs: Mapping[str, torch.Tensor], old_logps: torch.Tensor, agents: Sequence[str]
    ) -> torch.Tensor | None:
        """Record the mismatch of one micro-batch (``agents``: each row's agent; ``inputs``: its
        ``completion_mask`` and ``sampling_per_token_logps``, ``(B, T)``) and return the importance-sampling weight
        (:func:`importance_ratio`, detached: ``(B, T)``, or ``(B, 1)`` for the sequence modes), or ``None`` when
        not correcting. The loss applies it per token (:func:`mas_train.grpo.loss.weighted`)."""
        mask, samp = inputs["completion_mask"], inputs["sampling_per_token_logps"]
        for a in dict.fromkeys(agents):
            rows = torch.tensor([x == a for x in agents], device=mask.device)
            s = mismatch_sums(old_logps[rows], samp[rows], mask[rows])
            acc = self._sums.setdefault(a, [0.0, 0.0, 0.0, 0.0])
            acc[0], acc[1], acc[2], acc[3] = acc[0] + s[0], acc[1] + s[1], max(acc[2], s[2]), acc[3] + s[3]
        if not self.correct:
            return None
        ratio, stats = importance_ratio(
            old_logps.detach(), samp, mask, mode=self.mode, clip_min=self.clip_min, clip_max=self.clip_max
        )
        for key, value in stats.items():
            self._trl.setdefault(key, []).append(value)
        return ratio

    def pop(self) -> dict[str, float]:
        """The update's statistics (class docstring), then cleared for the next update."""
        out: dict[str, float] = {}
        for a, (total, outside, worst, n) in sorted(self._sums.items()):
            if n:
                out[f"mismatch/mean_abs_logp_diff/{a}"] = total / n
                out[f"mismatch/ratio_outside_10pct/{a}"] = outside / n
                out[f"mismatch/max_abs_logp_diff/{a}"] = worst
        for key, vals in self._trl.items():
            out[key] = float(np.mean(vals))
        self._sums, self._trl = {}, {}
        return out

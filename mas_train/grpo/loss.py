"""The GRPO loss as pure functions: tensors in, tensors out, no trainer state.

:meth:`mas_train.grpo.trl_adapter.TRLGRPO.compute_loss` composes them for one micro-batch; the formulas are those
of TRL 1.16.0's ``GRPOTrainer._compute_loss`` (``trl/trainer/grpo_trainer.py``), which the tests check value for
value (tests/train/test_loss.py). Shapes: ``B`` rows (completions) of a micro-batch, ``T`` completion tokens
(right-padded); ``mask`` ``(B, T)`` is 1 on tokens in the loss (int or float). Log-probabilities are float
tensors (float32 in practice). A per-token quantity may also be ``(B, 1)`` (sequence level), broadcast over T.

The loss of a micro-batch is ``aggregate(surrogate(r, A·w) + β · KL, mask)``:

* ``r`` the policy ratio :func:`policy_ratio` (PPO), ``A`` the advantage, ``w`` the importance-sampling weight
  between the sampler and the trainer (``mas_train.grpo.importance.importance_ratio``, capped or masked as TRL's
  ``vllm_importance_sampling_*`` settings say), applied per token by :func:`weighted` (equal to
  ``surrogate(r, A) · w``, as ``w ≥ 0``);
* the surrogate of the ``loss_type`` (:func:`clipped_surrogate` for ``grpo``/``bnpo``/``dr_grpo``/``dapo``/
  ``luspo``, :func:`cispo_surrogate`, :func:`sapo_surrogate`, :func:`vespo_surrogate`);
* the KL term :func:`k3_kl` (Schulman's k3 estimator, DeepSeekMath eq. 4) times ``beta``;
* the token aggregation of the ``loss_type`` (:func:`aggregate`).
"""

from __future__ import annotations

import torch

__all__ = [
    "CLIPPED_LOSS_TYPES",
    "LOSS_TYPES",
    "aggregate",
    "cispo_surrogate",
    "clip_fractions",
    "clipped_surrogate",
    "k3_kl",
    "masked_mean",
    "policy_ratio",
    "sapo_surrogate",
    "vespo_surrogate",
    "weighted",
]

#: TRL 1.16.0's ``loss_type`` values (the branches of ``GRPOTrainer._compute_loss``).
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
#: The ``loss_type`` values whose surrogate is the PPO clipped one (:func:`clipped_surrogate`).
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def policy_ratio(
    logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """The policy ratio ``r = π_θ / π_old`` of each token (``level="token"``, PPO, DeepSeekMath eq. 3) or of each
    sequence (``level="sequence"``: ``exp`` of the masked mean log-ratio, GSPO §4.1).

    Args:
        logps: ``(B, T)`` float, the trainer's per-token log-probabilities (with grad).
        old_logps: ``(B, T)`` float, those of the policy that produced the batch (no grad).
        mask: ``(B, T)`` completion mask.
        level: ``"token"`` or ``"sequence"`` (TRL's ``importance_sampling_level``).

    Returns:
        ``(B, T)`` for ``"token"``, ``(B, 1)`` for ``"sequence"``.

    Raises:
        ValueError: an unknown ``level``.
    """
    log_ratio = logps - old_logps
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        seq = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return torch.exp(seq.unsqueeze(-1))
    raise ValueError(f"unknown importance_sampling_level {level!r}; use 'token' or 'sequence'")


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> torch.Tensor:
    """The per-token PPO clipped surrogate, negated: ``-min(r·A, clip(r, 1-ε_low, 1+ε_high)·A)``.

    DeepSeekMath (GRPO) eq. 3 with ``ε_low = ε_high``; DAPO §3.1 ("Clip-Higher", ``ε_high > ε_low``); with
    ``delta``, the unclipped branch's ratio is also capped at ``delta`` (two-sided clipping, INTELLECT-2 report;
    TRL's ``delta``).

    Args:
        ratio: ``(B, T)`` or ``(B, 1)`` policy ratio (:func:`policy_ratio`).
        advantages: ``(B, 1)`` (or ``(B, T)``) float advantages.
        epsilon_low, epsilon_high: TRL's ``epsilon`` and ``epsilon_high`` (``epsilon`` when unset).
        delta: the cap of the unclipped ratio, or ``None``.

    Returns:
        The per-token loss, ``(B, T)`` (or ``(B, 1)`` when both inputs are per sequence).
    """
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    return -torch.min(ratio * advantages, clipped * advantages)


def cispo_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, logps: torch.Tensor, epsilon_high: float
) -> torch.Tensor:
    """CISPO's per-token loss ``-sg(min(r, ε_high))·A·log π_θ`` (MiniMax-M1 report §3.1; TRL ``loss_type="cispo"``,
    where ``epsilon_high`` is the cap itself). Shapes as :func:`clipped_surrogate`; ``logps`` ``(B, T)``."""
    return -torch.clamp(ratio, max=epsilon_high).detach() * advantages * logps


def sapo_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, temperature_pos: float, temperature_neg: float
) -> torch.Tensor:
    """SAPO's soft-gated per-token loss ``-(4/τ)·σ(τ(r-1))·A``, ``τ`` = ``temperature_pos`` where ``A > 0`` else
    ``temperature_neg`` (SAPO paper, Qwen 2025; TRL ``loss_type="sapo"``). Shapes as :func:`clipped_surrogate`."""
    tau = torch.where(advantages > 0, temperature_pos, temperature_neg)
    return -(torch.sigmoid(tau * (ratio - 1)) * 4 / tau) * advantages


def vespo_surrogate(phi: torch.Tensor, advantages: torch.Tensor, logps: torch.Tensor) -> torch.Tensor:
    """VESPO's per-token loss ``-φ(w)·A·log π_θ`` with ``φ`` ``(B, 1)`` the detached gamma weights of the sequence
    ratio (TRL's public ``GRPOTrainer.get_gamma_weights``); ``logps`` ``(B, T)``."""
    return -phi * advantages * logps


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """The per-token KL estimate ``exp(q - p) - (q - p) - 1`` with ``p = log π_θ``, ``q = log π_ref`` (Schulman's
    k3, DeepSeekMath eq. 4; TRL's ``per_token_kl``). Non-negative, 0 where the two agree; ``(B, T)`` in, out."""
    d = ref_logps - logps
    return torch.exp(d) - d - 1


def weighted(advantages: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """The importance-sampling correction as a per-token weight: ``A · w`` (``A`` ``(B, 1)``, ``w`` ``(B, T)`` or
    ``(B, 1)``, ``≥ 0``, detached; ``None``: no correction, ``A`` as is), the advantage each token's surrogate
    is computed with. Since ``w ≥ 0``, ``-min(r·A·w, clip(r)·A·w) = w · -min(r·A, clip(r)·A)``: the same loss as
    TRL's product of the per-token loss with vLLM's ratio, for every surrogate here (``sapo`` picks its
    temperature on the sign of ``A·w``, which is that of ``A`` wherever ``w > 0``)."""
    return advantages if weight is None else advantages * weight


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    accumulation_steps: int = 1,
    max_completion_length: int | None = None,
    num_items: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The scalar loss of one micro-batch out of ``accumulation_steps`` for one optimizer step.

    * ``grpo``, ``sapo``: each sequence's masked token mean, averaged over sequences (DeepSeekMath eq. 3),
      ``/ accumulation_steps``;
    * ``bnpo``: the masked token mean of the micro-batch, ``/ accumulation_steps``;
    * ``dr_grpo``: the masked token sum ``/ (B · max_completion_length)`` (Dr. GRPO, "Understanding R1-Zero-Like
      Training" §3.1: a constant normaliser instead of ``|o_i|``), ``/ accumulation_steps``;
    * ``dapo``, ``cispo``, ``vespo``: the masked token sum ``/ num_items``, the completion tokens of the whole
      optimizer step (DAPO §3.3, token-level policy gradient loss): no division by ``accumulation_steps``;
    * ``luspo``: each sequence's masked token sum, averaged over sequences, ``/ accumulation_steps``.

    Args:
        per_token_loss: ``(B, T)`` (or ``(B, 1)``, broadcast over the mask).
        mask: ``(B, T)`` completion mask.
        loss_type: one of :data:`LOSS_TYPES`.
        accumulation_steps: micro-batches accumulated into one optimizer step.
        max_completion_length: ``dr_grpo``'s constant (the completion cap, tokens).
        num_items: the step's completion tokens in the loss (``dapo``/``cispo``/``vespo``; clamped to ``≥ 1``).

    Returns:
        A 0-dim tensor.

    Raises:
        ValueError: an unknown ``loss_type``, or the argument its normaliser needs is missing.
    """
    masked = per_token_loss * mask
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation_steps
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0) / accumulation_steps
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type 'dr_grpo' needs max_completion_length")
        return masked.sum() / (per_token_loss.size(0) * max_completion_length) / accumulation_steps
    if loss_type in ("dapo", "cispo", "vespo"):
        if num_items is None:
            raise ValueError(f"loss_type {loss_type!r} needs num_items (the step's completion tokens)")
        return masked.sum() / torch.as_tensor(num_items, dtype=torch.float32).clamp(min=1.0)
    if loss_type == "luspo":
        return masked.sum(-1).mean() / accumulation_steps
    raise ValueError(f"unknown loss_type {loss_type!r}; use one of {', '.join(LOSS_TYPES)}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``x`` over the tokens in ``mask`` (``(B, T)``), or over rows for a per-sequence ``(B, 1)``;
    0.0 on an empty mask. TRL's ``global_masked_mean`` on one process."""
    if x.shape[1] == 1:
        return float(x.sum().item() / max(x.shape[0], 1))
    m = mask.float()
    return float(((x * m).sum() / m.sum().clamp(min=1.0)).item())


def clip_fractions(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> dict[str, float]:
    """The share of tokens where the clip of :func:`clipped_surrogate` is active (TRL's metric names).

    ``clip_ratio/low_mean``: ``r < 1-ε_low`` with ``A < 0``; ``clip_ratio/high_mean``: ``r > 1+ε_high`` with
    ``A > 0``; ``clip_ratio/region_mean``: either (each a masked token mean, :func:`masked_mean`);
    ``clip_ratio/low_min`` / ``clip_ratio/high_max``: the least / most clipped sequence's share. Shapes as
    :func:`clipped_surrogate`; a token whose advantage is 0 is never clipped.
    """
    low = ((ratio < 1 - epsilon_low) & (advantages < 0)).float()
    high = ((ratio > 1 + epsilon_high) & (advantages > 0)).float()
    region = ((low + high) > 0).float()

    def per_seq(x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            return x.squeeze(1)
        return (x * mask).sum(-1) / mask.sum(-1)

    def nan_extreme(x: torch.Tensor, largest: bool) -> float:
        x = x[~torch.isnan(x)]
        if x.numel() == 0:
            return float("nan")
        return float((x.max() if largest else x.min()).item())

    return {
        "clip_ratio/low_mean": masked_mean(low, mask),
        "clip_ratio/high_mean": masked_mean(high, mask),
        "clip_ratio/region_mean": masked_mean(region, mask),
        "clip_ratio/low_min": nan_extreme(per_seq(low), largest=False),
        "clip_ratio/high_max": nan_extreme(per_seq(high), largest=True),
    }

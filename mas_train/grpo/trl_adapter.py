"""TRL behind one adapter: our GRPO loss (:mod:`mas_train.grpo.loss`) on TRL's trainer, and every workaround of
TRL's behaviour, in this module.

:class:`TRLGRPO` is a ``trl.GRPOTrainer`` that trains on samples built outside it. It overrides the public
``compute_loss``: the per-token forward, the importance-sampling weight, the surrogate of every ``loss_type``, the
KL term and the token aggregation are ours (pure functions in :mod:`mas_train.grpo.loss`, the same formulas as TRL
1.16.0's ``_compute_loss``, checked against it in tests/train/test_loss.py). From TRL it keeps the constructor
(config validation, fused LM head, dropout, checkpointing, PEFT handling), the optimizer and scheduler, and three
public helpers of the loss (``get_high_entropy_mask``, and the static ``get_off_policy_mask`` and
``get_gamma_weights``). The GRPO update of a model group (:class:`~mas_train.grpo.update.GroupGRPOTrainer`)
subclasses it and uses only the public names below. No private TRL name is read, written or overridden.

Each workaround was checked against trl 1.16.0 and has a test in ``tests/train/test_trl_adapter.py`` that fails
loudly when a TRL upgrade changes the behaviour it relies on:

1. **beta around the constructor.** ``args.beta`` is set to 0 around ``GRPOTrainer.__init__``: with ``beta > 0``
   TRL would load the reference model again from the hub id in ``model.config``; the adapter builds it from a
   deep copy of the policy (or uses a LoRA policy's base with the adapter disabled) instead.
2. **A dummy dataset and reward.** A one-row ``train_dataset`` and a reward function that is never called:
   the constructor requires both, though rewards come from the env and batches from the collector.
3. **Batch shapes faked for validation.** :func:`grpo_args` sets ``num_generations=2`` and
   ``per_device_train_batch_size=2`` only to pass ``GRPOConfig``'s batch-shape validation.
4. **The fused LM head patch.** TRL replaces the policy's ``forward`` (an instance attribute) with a fused LM
   head at the trainer's temperature; our forward (:func:`fused_logps`) calls it with ``fused_lm_head=True``.
   Under ``shared_lora`` several trainers share one base model, so each group keeps its own patch
   (:func:`fused_forward`) and puts it back before it trains (:func:`restore_fused_forward`), or every group
   would train at the last group's temperature. The KL reference gets the same patch
   (``trl.trainer.utils.add_fused_lm_head``, with ``disable_dropout_in_model``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

from mas_train.checkpoint import remove_if_empty
from mas_train.grpo import loss as L

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase


__all__ = [
    "TRLGRPO",
    "TokenLogps",
    "fused_forward",
    "fused_logps",
    "grpo_args",
    "no_reward",
    "restore_fused_forward",
]


def no_reward(
    prompts: list[object] | None = None, completions: list[object] | None = None, **kwargs: object
) -> list[float]:  # pragma: no cover - never called
    """A reward function GRPOTrainer requires and never calls here (workaround 2); returns zeros."""
    return [0.0] * len(completions or [])


def grpo_args(
    output_dir: str,
    *,
    max_steps: int,
    learning_rate: float = 1e-6,
    seed: int = 0,
    use_cpu: bool | None = None,
    bf16: bool = False,
    **grpo_kwargs: Any,
) -> GRPOConfig:
    """A ``trl.GRPOConfig`` for an update on pre-built samples.

    Overrides TRL defaults that are wrong here: ``bf16`` (TRL defaults to True even on CPU),
    activation checkpointing (default True; slow and pointless on tiny CPU models; ``activation_checkpointing``
    from transformers 5.24, ``gradient_checkpointing`` before, whichever this install knows), ``report_to`` (we log
    ourselves) and saving (we checkpoint ourselves); fakes the batch shapes (workaround 3). ``grpo_kwargs`` pass
    straight to ``GRPOConfig`` (``loss_type``, ``epsilon``, ``beta``, ``num_iterations``, ``temperature``,
    ``max_completion_length``, ``weight_decay``, ``max_grad_norm``, ``lr_scheduler_type``, ``warmup_steps``,
    ``vllm_importance_sampling_*``, ...).

    Raises:
        TypeError: for a keyword ``GRPOConfig`` does not know.
    """
    if use_cpu is None:
        use_cpu = not torch.cuda.is_available()
    kwargs: dict[str, Any] = dict(
        output_dir=output_dir,
        max_steps=max_steps,
        learning_rate=learning_rate,
        seed=seed,
        use_cpu=use_cpu,
        bf16=bf16,
        fp16=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_dropout=True,
        # Only to satisfy GRPOConfig's batch-shape validation; batches here come from the collector.
        num_generations=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        dataloader_num_workers=0,
    )
    # transformers 5.24 renamed gradient_checkpointing to activation_checkpointing (the old name stays as a
    # deprecated alias); 5.19, which SGLang 0.5.23 pins, knows only the old one. Pass one name, never both.
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    name = "activation_checkpointing" if "activation_checkpointing" in known else "gradient_checkpointing"
    if "gradient_checkpointing" not in grpo_kwargs and "activation_checkpointing" not in grpo_kwargs:
        kwargs[name] = False
    kwargs.update(grpo_kwargs)
    return GRPOConfig(**kwargs)


def fused_forward(peft_model: PeftModel) -> Callable[..., object] | None:
    """The fused-LM-head ``forward`` TRL installed on ``peft_model``'s base model (workaround 4), or ``None``."""
    forward: Callable[..., object] | None = peft_model.get_base_model().__dict__.get("forward")
    return forward


def restore_fused_forward(peft_model: PeftModel, forward: Callable[..., object] | None) -> None:
    """Put a group's own fused-LM-head ``forward`` (from :func:`fused_forward`) back on the shared base model."""
    if forward is not None:
        peft_model.get_base_model().forward = forward


class TokenLogps(NamedTuple):
    """One forward's per-token results on the completion tokens: ``logps`` ``(B, T)`` float log-probabilities,
    ``entropies`` ``(B, T)`` (or ``None`` when not asked for), ``aux_loss`` a 0-dim MoE router loss (or ``None``)."""

    logps: torch.Tensor
    entropies: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def fused_logps(
    model: Any,
    inputs: Mapping[str, Any],
    *,
    compute_entropy: bool,
    autocast: Callable[[], Any],
    aux_loss: bool = False,
) -> TokenLogps:
    """The per-token log-probabilities (and entropies) of the completion tokens of loss ``inputs`` under ``model``,
    through TRL's fused LM head (workaround 4; the computation of TRL's ``_get_per_token_logps_and_entropies``
    on one chunk).

    Args:
        model: a causal LM whose ``forward`` TRL patched (``add_fused_lm_head``).
        inputs: ``prompt_ids``/``prompt_mask`` ``(B, P)`` left-padded, ``completion_ids``/``completion_mask``
            ``(B, T)`` right-padded.
        compute_entropy: also return the per-token entropies.
        autocast: a context-manager factory around the forward (``accelerator.autocast``).
        aux_loss: ask an MoE model for its router load-balancing loss.

    Returns:
        A :class:`TokenLogps` with ``(B, T)`` float tensors.
    """
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    keep = inputs["completion_ids"].size(1)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-keep] = -100  # only the completion tokens are scored
    extra = {"output_router_logits": True} if aux_loss else {}
    with autocast():
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True, **extra
        )
    entropies = out.entropy[:, -keep:] if compute_entropy else None
    return TokenLogps(out.log_probs[:, -keep:], entropies, out.aux_loss if aux_loss else None)


class TRLGRPO(GRPOTrainer):  # type: ignore[misc,unused-ignore]  # trl is untyped (Any) for mypy
    """A ``trl.GRPOTrainer`` built for updates on pre-built samples, whose ``compute_loss`` is ours (module
    docstring).

    Args:
        model: the policy (``PreTrainedModel`` or ``peft.PeftModel``), trained in place.
        tokenizer: its tokenizer (pad token set to EOS when missing).
        args: a ``GRPOConfig`` (:func:`grpo_args`); ``max_steps`` sizes the LR schedule.
        ref_model: frozen reference policy for the KL term; when ``args.beta > 0`` and none is given, a deep
            copy of ``model``, or for a ``peft.PeftModel`` its base with adapters disabled (:attr:`ref_is_base`).

    Attributes:
        beta: the KL coefficient (``args.beta``). ref_is_base: the reference is the adapter-disabled base.
        accumulation_steps: micro-batches per optimizer step (:meth:`set_accumulation`), the divisor of the
            per-micro-batch losses (all ``loss_type`` values but the token-normalised ``dapo``/``cispo``/``vespo``).

    Raises:
        ValueError: a ``loss_type`` not in :data:`mas_train.grpo.loss.LOSS_TYPES`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        args: GRPOConfig,
        *,
        ref_model: torch.nn.Module | None = None,
    ) -> None:
        from accelerate.utils import is_peft_model

        if args.loss_type not in L.LOSS_TYPES:
            raise ValueError(f"unknown loss_type {args.loss_type!r}; use one of {', '.join(L.LOSS_TYPES)}")
        beta = float(args.beta)
        # A LoRA policy's reference is its base with the adapter switched off (the adapter starts at B = 0, so
        # that is the initial policy), as TRL does for PEFT: no second copy of the weights.
        self.ref_is_base = beta != 0.0 and ref_model is None and is_peft_model(model)
        if beta != 0.0 and ref_model is None and not self.ref_is_base:
            ref_model = copy.deepcopy(model)  # before TRL patches the forward
        args.beta = 0.0  # workaround 1
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        super().__init__(
            model=model,
            reward_funcs=[no_reward],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["unused"]}),
            processing_class=tokenizer,
        )
        # transformers' Trainer makes args.output_dir; nothing of ours is written there
        remove_if_empty(args.output_dir)
        args.beta = beta
        self.beta = beta
        if beta != 0.0 and not self.ref_is_base:
            assert ref_model is not None  # a copy of the policy was made above
            ref_model.eval().requires_grad_(False)
            ref_model.to(self.accelerator.device)
            disable_dropout_in_model(ref_model)
            add_fused_lm_head(ref_model, temperature=self.temperature)
            self.ref_model = ref_model
        self.accumulation_steps = 1
        self.epsilon_low = float(args.epsilon)
        self.epsilon_high = float(args.epsilon if args.epsilon_high is None else args.epsilon_high)
        # the entropy bonus (TRL's entropy_coef / use_adaptive_entropy): its coefficient now, and the entropy
        # the adaptive rule last measured
        self.entropy_coef = float(args.entropy_coef)
        self.last_entropy = float("inf")
        self.loss_metrics: dict[str, list[float]] = {}
        self.create_optimizer_and_scheduler(num_training_steps=args.max_steps)

    # -- the forward -----------------------------------------------------------------------------------------
    def training_logps(self, model: Any, inputs: Mapping[str, Any]) -> TokenLogps:
        """The per-token completion logprobs ``(B, T)``, entropies and router loss of the loss's forward (with
        grad); override to change how they are computed. Default: :func:`fused_logps`."""
        return fused_logps(
            model,
            inputs,
            compute_entropy=True,
            autocast=self.accelerator.autocast,
            aux_loss=bool(self.aux_loss_enabled),
        )

    @torch.no_grad()  # type: ignore[untyped-decorator,unused-ignore]  # torch is untyped (Any) for mypy
    def completion_logps(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        """Per-token completion logprobs ``(B, T)`` of ``model`` (the policy or the KL reference) on loss inputs,
        without grad (:func:`fused_logps`)."""
        return fused_logps(model, inputs, compute_entropy=False, autocast=self.accelerator.autocast).logps

    def importance_weights(self, inputs: Mapping[str, Any], logps: torch.Tensor) -> torch.Tensor | None:
        """The importance-sampling weight ``w`` (``(B, T)`` or ``(B, 1)``, detached, ``≥ 0``) of a micro-batch
        whose training forward gave ``logps``, or ``None`` for no correction; override to compute it. Default:
        ``inputs["importance_sampling_ratio"]`` when present."""
        w: torch.Tensor | None = inputs.get("importance_sampling_ratio")
        return w

    # -- the loss -------------------------------------------------------------------------------------------
    def compute_loss(
        self,
        model: Any,
        inputs: Mapping[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> torch.Tensor:
        """The GRPO loss of one micro-batch (:mod:`mas_train.grpo.loss`), to back-propagate as is.

        ``inputs``: ``prompt_ids``/``prompt_mask`` ``(B, P)``, ``completion_ids``/``completion_mask`` ``(B, T)``,
        ``advantages`` ``(B,)`` float, ``num_items_in_batch`` (the optimizer step's completion tokens, for the
        token-normalised losses); optional ``old_per_token_logps`` (``num_iterations > 1``; else the forward's
        own, detached), ``ref_per_token_logps`` (``beta > 0``), ``sampling_per_token_logps``,
        ``importance_sampling_ratio`` (see :meth:`importance_weights`). Per-step metrics go to
        :meth:`pop_loss_metrics` under TRL's names.

        Raises:
            ValueError: ``return_outputs=True`` (there are no outputs to return).
        """
        if return_outputs:
            raise ValueError("TRLGRPO.compute_loss returns the loss only; call it with return_outputs=False")
        args = self.args
        loss_type = str(args.loss_type)
        steps = self.accumulation_steps if self.model.training else 1
        mask = inputs["completion_mask"]
        fwd = self.training_logps(model, inputs)
        logps, entropies = fwd.logps, fwd.entropies
        weight = self.importance_weights(inputs, logps)
        adv = inputs["advantages"]
        adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
        vespo = loss_type == "vespo"
        if not vespo:  # vespo takes the IS weight into its gamma weights instead
            adv = L.weighted(adv, weight)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old

        quantile = float(args.top_entropy_quantile)
        entropy_mask = (
            self.get_high_entropy_mask(entropies, mask, 1 - quantile)
            if quantile < 1.0 and entropies is not None
            else None
        )
        ratio = L.policy_ratio(logps, old, mask, str(args.importance_sampling_level))
        kl = None
        if self.beta != 0.0:
            kl = L.k3_kl(logps, inputs["ref_per_token_logps"])
            if args.use_bias_correction_kl:
                kl = kl * ratio
        phi = None
        if loss_type in L.CLIPPED_LOSS_TYPES:
            per_token = L.clipped_surrogate(ratio, adv, self.epsilon_low, self.epsilon_high, args.delta)
        elif loss_type == "cispo":
            per_token = L.cispo_surrogate(ratio, adv, logps, self.epsilon_high)
        elif loss_type == "sapo":
            per_token = L.sapo_surrogate(ratio, adv, args.sapo_temperature_pos, args.sapo_temperature_neg)
        else:
            phi = GRPOTrainer.get_gamma_weights(
                advantages=adv,
                log_ratio_per_token=logps - old,
                mask=mask,
                importance_sampling_ratio=weight,
                k_pos=args.vespo_k_pos,
                lambda_pos=args.vespo_lambda_pos,
                k_neg=args.vespo_k_neg,
                lambda_neg=args.vespo_lambda_neg,
            )
            per_token = L.vespo_surrogate(phi, adv, logps)
        if args.off_policy_mask_threshold is not None:
            per_token = per_token * GRPOTrainer.get_off_policy_mask(
                advantages=adv,
                per_token_logps=logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old),
                mask=mask,
                off_policy_threshold=args.off_policy_mask_threshold,
            )
        if entropy_mask is not None:
            per_token = per_token * entropy_mask
        if kl is not None:
            per_token = per_token + self.beta * kl
        loss = L.aggregate(
            per_token,
            mask,
            loss_type,
            accumulation_steps=steps,
            max_completion_length=args.max_completion_length,
            num_items=inputs.get("num_items_in_batch"),
        )
        record = self._record
        if self.entropy_bonus_enabled and entropies is not None:
            record(
                "policy_loss",
                float(loss.detach().item()) * (1 if loss_type in ("dapo", "cispo", "vespo") else steps),
            )
            loss = loss - self._entropy_bonus(
                entropies, mask if entropy_mask is None else mask * entropy_mask, steps
            )
        if fwd.aux_loss is not None:
            loss = loss + float(args.router_aux_loss_coef) * fwd.aux_loss / steps
            record("aux_loss", float(fwd.aux_loss.detach().mean().item()))

        if kl is not None:
            record("kl", L.masked_mean(kl.detach(), mask))
        if entropies is not None:
            record("entropy", L.masked_mean(entropies.detach(), mask))
        # clips are counted on the weighted advantage: a token the IS weight zeroes is never clipped
        ratio = ratio.detach()
        if loss_type in L.CLIPPED_LOSS_TYPES:
            if args.delta is not None:  # TRL counts clips on the ratio after the delta cap
                ratio = torch.clamp(ratio, max=args.delta)
            for key, value in L.clip_fractions(ratio, adv, mask, self.epsilon_low, self.epsilon_high).items():
                record(key, value)
        elif loss_type == "cispo":
            record("cispo_clip_ratio", L.masked_mean(((ratio > self.epsilon_high) & (adv > 0)).float(), mask))
        elif phi is not None:
            record("vespo/phi_seq_mean", L.masked_mean(phi, mask))
        return loss

    def _entropy_bonus(self, entropies: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
        """``coef · H`` with ``H`` the mean entropy over ``mask`` ``/ steps`` (TRL's entropy bonus, subtracted from
        the loss); with ``use_adaptive_entropy``, the coefficient applies while the last measured entropy is at
        most ``entropy_target`` and moves by ``entropy_coef_delta`` within ``[entropy_coef_min, entropy_coef_max]``
        after each micro-batch (TRL's rule outside its accumulation context, where every micro-batch ends a
        window)."""
        args = self.args
        mean_entropy = (entropies * mask).sum() / mask.sum().clamp(min=1.0)
        adaptive = bool(args.use_adaptive_entropy)
        coef = self.entropy_coef if not adaptive or self.last_entropy <= args.entropy_target else 0.0
        bonus = coef * (mean_entropy / steps)
        if adaptive and self.model.training:
            measured = float(mean_entropy.detach().item())
            if measured <= args.entropy_target:
                self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
            else:
                self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
            self.last_entropy = measured
        self._record("entropy_coef", self.entropy_coef)
        return bonus

    def grpo_loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        """:meth:`compute_loss` of one micro-batch of loss inputs, in the trainer's compute context (autocast)."""
        with self.compute_loss_context_manager():
            loss: torch.Tensor = self.compute_loss(model, inputs)
            return loss

    def set_accumulation(self, n_micro: int) -> None:
        """One optimizer step accumulates ``n_micro`` micro-batches (:attr:`accumulation_steps`)."""
        self.accumulation_steps = n_micro

    @property
    def entropy_bonus_enabled(self) -> bool:
        """Whether the loss subtracts an entropy bonus (``entropy_coef != 0`` or ``use_adaptive_entropy``)."""
        return float(self.args.entropy_coef) != 0.0 or bool(self.args.use_adaptive_entropy)

    def _record(self, key: str, value: float) -> None:
        self.loss_metrics.setdefault(key, []).append(value)

    def pop_loss_metrics(self) -> dict[str, float]:
        """The means of the loss's metrics since the last call (NaN dropped), and clear them: ``entropy``,
        ``clip_ratio/*`` (:func:`mas_train.grpo.loss.clip_fractions`), ``kl`` (``beta > 0``), ``cispo_clip_ratio``,
        ``vespo/phi_seq_mean``, ``policy_loss`` / ``entropy_coef`` (entropy bonus), ``aux_loss`` (TRL's names)."""
        out: dict[str, float] = {}
        for key, vals in self.loss_metrics.items():
            kept = [v for v in vals if not math.isnan(v)]
            if kept:
                out[key] = float(np.mean(kept))
        self.loss_metrics = {}
        return out

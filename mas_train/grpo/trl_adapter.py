"""TRL behind one adapter: every touch of a TRL private name or workaround of its behaviour is in this module.

:class:`TRLGRPO` is a ``trl.GRPOTrainer`` that trains on samples built outside it; the GRPO update of a model
group (:class:`~mas_train.grpo.update.GroupGRPOTrainer`) subclasses it and uses only the public names below.
Each workaround was checked against trl 1.16.0 and has a test in ``tests/train/test_trl_adapter.py`` that fails
loudly when a TRL upgrade changes the behaviour it relies on:

1. **beta around the constructor.** ``args.beta`` is set to 0 around ``GRPOTrainer.__init__``: with ``beta > 0``
   TRL would load the reference model again from the hub id in ``model.config``; the adapter builds it from a
   deep copy of the policy (or uses a LoRA policy's base with the adapter disabled) instead.
2. **A dummy dataset and reward.** A one-row ``train_dataset`` and a reward function that is never called:
   the constructor requires both, though rewards come from the env and batches from the collector.
3. **Batch shapes faked for validation.** :func:`grpo_args` sets ``num_generations=2`` and
   ``per_device_train_batch_size=2`` only to pass ``GRPOConfig``'s batch-shape validation.
4. **The per-token logprob forward.** The private ``_get_per_token_logps_and_entropies`` is overridden to call
   the public hook :meth:`TRLGRPO.training_logps` (the update folds the importance-sampling ratio into the
   advantages there, and runs shared prompt prefixes once), and called directly by :meth:`TRLGRPO.trl_logps`.
5. **Loss normalisers.** :meth:`TRLGRPO.set_accumulation` sets ``current_gradient_accumulation_steps`` to the
   number of micro-batches; the update sets ``num_items_in_batch`` to the step's completion tokens scaled by
   ``steps_per_generation / n_micro``, so TRL's loss normalisers see one optimizer step per update.
6. **TRL's metric store.** :meth:`TRLGRPO.pop_trl_metrics` reads and clears ``_metrics["train"]``.
7. **The entropy bonus flag.** :attr:`TRLGRPO.entropy_bonus_enabled` reads the private
   ``_entropy_bonus_enabled``.
8. **The fused LM head patch.** TRL replaces the policy's ``forward`` (an instance attribute) with a fused LM
   head at the trainer's temperature. Under ``shared_lora`` several trainers share one base model, so each group
   keeps its own patch (:func:`fused_forward`) and puts it back before it trains (:func:`restore_fused_forward`),
   or every group would train at the last group's temperature. The KL reference gets the same patch
   (``trl.trainer.utils.add_fused_lm_head``, with ``disable_dropout_in_model``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

from mas_train.checkpoint import remove_if_empty

__all__ = ["TRLGRPO", "fused_forward", "grpo_args", "no_reward", "restore_fused_forward"]

LogpsFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def no_reward(prompts=None, completions=None, **kwargs):  # pragma: no cover - never called
    """A reward function GRPOTrainer requires and never calls here (workaround 2); returns zeros."""
    # GRPOTrainer insists on a reward source even though our rewards come from the env (workaround 2).
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
    ``activation_checkpointing`` (default True; slow and pointless on tiny CPU models), ``report_to`` (we log
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
        activation_checkpointing=False,
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
    if "gradient_checkpointing" in grpo_kwargs:  # the deprecated alias; do not pass both names
        kwargs.pop("activation_checkpointing")
    kwargs.update(grpo_kwargs)
    return GRPOConfig(**kwargs)


def fused_forward(peft_model: Any) -> Callable[..., Any] | None:
    """The fused-LM-head ``forward`` TRL installed on ``peft_model``'s base model (workaround 8), or ``None``."""
    return peft_model.get_base_model().__dict__.get("forward")


def restore_fused_forward(peft_model: Any, forward: Callable[..., Any] | None) -> None:
    """Put a group's own fused-LM-head ``forward`` (from :func:`fused_forward`) back on the shared base model."""
    if forward is not None:
        peft_model.get_base_model().forward = forward


class TRLGRPO(GRPOTrainer):
    """A ``trl.GRPOTrainer`` built for updates on pre-built samples (workarounds 1, 2, 4–8 of the module).

    Args:
        model: the policy (``PreTrainedModel`` or ``peft.PeftModel``), trained in place.
        tokenizer: its tokenizer (pad token set to EOS when missing).
        args: a ``GRPOConfig`` (:func:`grpo_args`); ``max_steps`` sizes the LR schedule.
        ref_model: frozen reference policy for the KL term; when ``args.beta > 0`` and none is given, a deep
            copy of ``model``, or for a ``peft.PeftModel`` its base with adapters disabled (:attr:`ref_is_base`).

    Attributes:
        beta: the KL coefficient (``args.beta``). ref_is_base: the reference is the adapter-disabled base.
    """

    def __init__(self, model: Any, tokenizer: Any, args: GRPOConfig, *, ref_model: Any = None) -> None:
        from accelerate.utils import is_peft_model

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
            ref_model.eval().requires_grad_(False)
            ref_model.to(self.accelerator.device)
            disable_dropout_in_model(ref_model)
            add_fused_lm_head(ref_model, temperature=self.temperature)
            self.ref_model = ref_model
        self.create_optimizer_and_scheduler(num_training_steps=args.max_steps)

    # -- workaround 4: the per-token logprob forward ---------------------------------------------------------
    def training_logps(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        compute_entropy: bool,
        trl_forward: LogpsFn,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The per-token completion logprobs ``(B, T)`` (and entropies) TRL's loss uses; override to change how
        they are computed. ``trl_forward(model, input_ids, attention_mask, logits_to_keep, compute_entropy=...)``
        is TRL's own forward. Default: TRL's."""
        return trl_forward(model, input_ids, attention_mask, logits_to_keep, compute_entropy=compute_entropy)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        aux: list[Any] = []

        def trl_forward(m, ids, mask, keep, compute_entropy=False):
            logps, ent, extra = super(TRLGRPO, self)._get_per_token_logps_and_entropies(
                m, ids, mask, keep, *a, **{**kw, "compute_entropy": compute_entropy}
            )
            aux.append(extra)
            return logps, ent

        logps, ent = self.training_logps(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            bool(kw.get("compute_entropy", False)),
            trl_forward,
        )
        return logps, ent, (aux[0] if aux else None)

    @torch.no_grad()
    def trl_logps(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token completion logprobs ``(B, T)`` of ``model`` (the policy or the KL reference) on loss inputs,
        through TRL's own forward, without grad."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, _, _ = super()._get_per_token_logps_and_entropies(
            model, input_ids, attn, inputs["completion_ids"].size(1)
        )
        return logps

    # -- the loss -------------------------------------------------------------------------------------------
    def grpo_loss(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """TRL's GRPO loss of one micro-batch of loss inputs (every ``loss_type``, clipping, KL)."""
        with self.compute_loss_context_manager():
            return self.compute_loss(model, inputs)

    def set_accumulation(self, n_micro: int) -> None:
        """Tell TRL's loss normalisers that one optimizer step accumulates ``n_micro`` micro-batches
        (workaround 5)."""
        self.current_gradient_accumulation_steps = n_micro

    @property
    def entropy_bonus_enabled(self) -> bool:
        """Whether TRL adds an entropy term to the loss (workaround 7)."""
        return bool(getattr(self, "_entropy_bonus_enabled", False))

    def pop_trl_metrics(self) -> dict[str, float]:
        """The means of TRL's per-step training metrics since the last call (NaN and ``None`` dropped), and
        clear them (workaround 6)."""
        out: dict[str, float] = {}
        for key, vals in self._metrics["train"].items():
            vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
            if vals:
                out[key] = float(np.mean(vals))
        self._metrics["train"].clear()
        return out

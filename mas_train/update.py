"""The GRPO update of one model group: a TRL ``GRPOTrainer`` subclass that trains on pre-built samples.

TRL's ``GRPOTrainer`` computes rewards and advantages inside one long method with a fixed
``view(-1, num_generations)`` layout that a multi-agent system breaks (each agent acts a variable number of
times per trajectory). So rollouts and advantages are built outside (``mas_train.rollout``,
``mas_train.advantages``), and each model group's trainer only receives ready samples:
:meth:`GroupGRPOTrainer.update` pads them, calls TRL's own ``compute_loss`` (every ``loss_type``, clipping, KL
when ``beta > 0``), and steps TRL's optimizer and scheduler.

What TRL would do and we do ourselves:

* **Importance-sampling correction** against the backend's sampling logprobs (TRL only applies it with vLLM).
  With ``w = exp(logp_old - logp_sampling)`` (token- or sequence-level, truncated or masked with TRL's
  ``vllm_importance_sampling_*`` settings), the per-token advantages become ``A · w``. Since ``w ≥ 0``,
  ``-min(r·A·w, clip(r)·A·w) = w · -min(r·A, clip(r)·A)``, identical to TRL's post-hoc multiplication for the
  ``grpo/bnpo/dr_grpo/dapo/luspo/cispo/sapo`` losses; ``vespo`` gets the ratio through its own
  ``importance_sampling_ratio`` input instead. With ``num_iterations == 1`` the old policy *is* the current
  one, so ``w`` is computed from the training forward itself (no extra forward pass).
* **mask_truncated_completions**: a completion the backend cut at ``max_new_tokens`` (``finish_reason ==
  "length"``) gets an all-zero completion mask, so it takes no part in the loss (TRL applies the setting in
  ``_generate_and_score_completions``, which this update bypasses).
* **Gradient accumulation** over micro-batches of ``micro_batch_size`` samples, so memory is bounded whatever
  the number of turns.
* **Per-agent gradient norms** (paper Fig. 4): each agent's micro-batches are back-propagated into empty
  ``.grad`` buffers, the norm of that agent's gradient alone is read, and it is added into a running sum that
  becomes the real gradient. The update is therefore exactly the one without the measurement.

Where this module works around TRL (each checked against trl 1.16.0; re-check them when the pin moves):

1. ``args.beta`` is set to 0 around ``GRPOTrainer.__init__``: with ``beta > 0`` TRL would load the reference
   model again from the hub id in ``model.config``; we give it a deep copy of the policy instead.
2. A one-row dummy ``train_dataset`` and a reward function that is never called: the constructor requires
   both, though rewards come from the env and batches from the collector.
3. :func:`grpo_args` sets ``num_generations=2`` and ``per_device_train_batch_size=2`` only to pass
   ``GRPOConfig``'s batch-shape validation.
4. ``_get_per_token_logps_and_entropies`` (a private TRL method) is overridden to fold the IS ratio into the
   advantages from the training forward, and called directly for the old-policy / reference logprobs.
5. ``current_gradient_accumulation_steps`` is set to the number of micro-batches, and ``num_items_in_batch``
   to the step's completion tokens scaled by ``steps_per_generation / n_micro``, so TRL's loss normalisers
   see one optimizer step per update whatever the micro-batching.
6. TRL's per-step metric store ``_metrics["train"]`` is read and cleared after every update.
7. Sharded groups (:mod:`mas_train.sharded`): each rank runs its ``shard_plan`` share of the one-rank micro-batch
   plan with the one-rank normalisers, its loss times N (FSDP's reduce-scatter averages over ranks); no shared
   prefixes or per-agent norms there (their extra forwards would differ between ranks).
8. TRL patches the policy's forward with a fused LM head at the trainer's temperature. Under ``shared_lora``
   several trainers share one base model, so each worker puts its own trainer's patch back before its update
   (``mas_train.worker``), or every group would train at the last group's temperature.

The update and these workarounds stay in one file: each workaround is read against the code it changes.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from trl import GRPOTrainer

from mas_train.prefix import SharedPrefix, agent_prefix_lengths, build_prefixes, prefix_logps
from mas_train.rollout import Sample

__all__ = ["GroupGRPOTrainer", "grpo_args"]


def _no_reward(prompts=None, completions=None, **kwargs):  # pragma: no cover - never called
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
):
    """Build a ``trl.GRPOConfig`` with the settings pattern (A) needs.

    Overrides TRL defaults that are wrong for us: ``bf16`` (TRL defaults to True even on CPU),
    ``activation_checkpointing`` (default True; slow and pointless on tiny CPU models), ``report_to`` (we log
    ourselves) and saving (we checkpoint ourselves). ``grpo_kwargs`` pass straight to ``GRPOConfig``
    (``loss_type``, ``epsilon``, ``beta``, ``num_iterations``, ``temperature``, ``max_completion_length``,
    ``weight_decay``, ``max_grad_norm``, ``lr_scheduler_type``, ``warmup_steps``,
    ``vllm_importance_sampling_*``, ...).

    Raises:
        TypeError: for a keyword ``GRPOConfig`` does not know.
    """
    from trl import GRPOConfig

    if use_cpu is None:
        use_cpu = not torch.cuda.is_available()
    kwargs = dict(
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


class GroupGRPOTrainer(GRPOTrainer):
    """A ``trl.GRPOTrainer`` that trains one model group on pre-built samples (pattern (A)).

    Args:
        model: the policy (``PreTrainedModel``), trained in place.
        tokenizer: its tokenizer (pad id for padding; TRL's processing class).
        args: a ``GRPOConfig`` (see :func:`grpo_args`). ``max_steps`` sizes the LR schedule.
        micro_batch_size: samples per forward/backward; the step's samples are accumulated over
            ``ceil(n / micro_batch_size)`` micro-batches (more if split by agent), one optimizer step.
        ref_model: frozen reference policy for the KL term; built as a copy of ``model`` when
            ``args.beta > 0`` and none is given (a ``peft.PeftModel``: its base with adapters disabled).
        share_prefix: run the prompt prefix an agent's samples share once per update (:mod:`mas_train.prefix`;
            same gradient, less compute) when ``num_iterations == 1`` and ``beta == 0``.

    After every :meth:`update` the TRL optimizer, scheduler and ``state.global_step`` have advanced by
    ``args.num_iterations`` steps.
    """

    def __init__(
        self, model, tokenizer, args, *, micro_batch_size: int, ref_model=None, share_prefix: bool = True
    ):
        from datasets import Dataset

        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        from accelerate.utils import is_peft_model

        beta = float(args.beta)
        # A LoRA policy's reference is its base with the adapter switched off (the adapter starts at B = 0, so
        # that is the initial policy), as TRL does for PEFT: no second copy of the weights.
        self._ref_is_base = beta != 0.0 and ref_model is None and is_peft_model(model)
        if beta != 0.0 and ref_model is None and not self._ref_is_base:
            ref_model = copy.deepcopy(model)  # before TRL patches the forward
        # TRL would reload the reference from the hub id in model.config; build it from our copy instead.
        args.beta = 0.0
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        super().__init__(
            model=model,
            reward_funcs=[_no_reward],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["unused"]}),
            processing_class=tokenizer,
        )
        args.beta = beta
        self.beta = beta
        if beta != 0.0 and not self._ref_is_base:
            from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

            ref_model.eval().requires_grad_(False)
            ref_model.to(self.accelerator.device)
            disable_dropout_in_model(ref_model)
            add_fused_lm_head(ref_model, temperature=self.temperature)
            self.ref_model = ref_model
        self.micro_batch_size = micro_batch_size
        self.pad_token_id = tokenizer.pad_token_id
        self.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
        self._is_ctx: dict | None = None
        self.share_prefix = share_prefix
        self._prefix: SharedPrefix | None = (
            None  # the shared prefix the current micro-batch's rows start with
        )
        self._is_stats: dict[str, list[float]] = defaultdict(list)
        # set on the ranks of a sharded group (mas_train.sharded): the rank count, and plan -> (share, weights)
        self.shard_world, self.shard_plan = 1, None

    # -- inputs ---------------------------------------------------------------------------------------
    def build_inputs(
        self, samples: Sequence[Sample], advantages: Sequence[float], prefix_len: int = 0
    ) -> dict[str, Any]:
        """Pad samples into TRL's loss inputs.

        With ``prefix_len`` L > 0 (the samples' prompts share their first L tokens), each prompt row is laid out
        ``[prefix | left padding | rest of the prompt]`` for :func:`mas_train.prefix.prefix_logps`.

        Returns a dict of tensors on the trainer's device: ``prompt_ids``/``prompt_mask`` (B, P) left-padded,
        ``completion_ids``/``completion_mask`` (B, T) right-padded (masks from lengths, never from
        ``ids == pad``, so EOS tokens stay in the loss; all zero for a truncated completion when
        ``args.mask_truncated_completions``), ``sampling_per_token_logps`` (B, T) float32,
        ``advantages`` (B,) float32, ``num_items_in_batch`` (scalar, completion tokens in the loss).

        Raises:
            ValueError: on an empty batch, an empty completion, or logprobs misaligned with ids.
        """
        if not samples:
            raise ValueError("build_inputs needs at least one sample")
        if len(samples) != len(advantages):
            raise ValueError(f"{len(samples)} samples but {len(advantages)} advantages")
        dev = self.accelerator.device
        b = len(samples)
        lead = prefix_len
        p_len = lead + max(len(s.prompt_ids) - lead for s in samples)
        c_len = max(len(s.completion_ids) for s in samples)
        if c_len == 0:
            raise ValueError("every sample has an empty completion; nothing to train on")
        prompt_ids = torch.full((b, p_len), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros((b, p_len), dtype=torch.long)
        comp_ids = torch.full((b, c_len), self.pad_token_id, dtype=torch.long)
        comp_mask = torch.zeros((b, c_len), dtype=torch.long)
        samp_lp = torch.zeros((b, c_len), dtype=torch.float32)
        for r, s in enumerate(samples):
            p, c = len(s.prompt_ids), len(s.completion_ids)
            if len(s.sampling_logprobs) != c:
                raise ValueError(
                    f"sample {s.traj_uid}/{s.turn}: {len(s.sampling_logprobs)} logprobs for {c} ids"
                )
            prompt_ids[r, p_len - (p - lead) :] = torch.tensor(s.prompt_ids[lead:], dtype=torch.long)
            prompt_mask[r, p_len - (p - lead) :] = 1
            if lead:
                prompt_ids[r, :lead] = torch.tensor(s.prompt_ids[:lead], dtype=torch.long)
                prompt_mask[r, :lead] = 1
            if c:
                comp_ids[r, :c] = torch.tensor(s.completion_ids, dtype=torch.long)
                comp_mask[r, :c] = 0 if self._masked(s) else 1
                samp_lp[r, :c] = torch.tensor(s.sampling_logprobs, dtype=torch.float32)
        return {
            "prompt_ids": prompt_ids.to(dev),
            "prompt_mask": prompt_mask.to(dev),
            "completion_ids": comp_ids.to(dev),
            "completion_mask": comp_mask.to(dev),
            "sampling_per_token_logps": samp_lp.to(dev),
            "advantages": torch.as_tensor(np.asarray(advantages, dtype=np.float32)).to(dev),
            "num_items_in_batch": comp_mask.sum().to(dev),
        }

    def _masked(self, s: Sample) -> bool:
        """Whether ``s`` is left out of the loss (``mask_truncated_completions`` and it was cut at the cap)."""
        return bool(self.args.mask_truncated_completions) and s.finish_reason == "length"

    # -- importance sampling --------------------------------------------------------------------------
    def _is_ratio(self, old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor):
        """TRL's vLLM importance-sampling ratio, applied to any backend: ``(B, T)``, or ``(B, 1)`` for the
        sequence-level modes."""
        diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
        mode = self.args.vllm_importance_sampling_mode
        if mode in ("sequence_mask", "sequence_truncate"):
            diff = diff.sum(dim=-1, keepdim=True)
        ratio = torch.exp(diff.clamp(max=30.0))
        lo, hi = self.args.vllm_importance_sampling_clip_min, self.args.vllm_importance_sampling_clip_max
        if mode.endswith("truncate"):
            ratio = torch.clamp(ratio, min=lo, max=hi)
        elif mode.endswith("mask"):
            bad = torch.zeros_like(ratio, dtype=torch.bool)
            if lo is not None:
                bad |= ratio < lo
            if hi is not None:
                bad |= ratio > hi
            ratio = ratio.masked_fill(bad, 0.0)
        else:
            raise ValueError(f"unknown vllm_importance_sampling_mode {mode!r}")
        m = mask.float()
        tok_diff = (old_logps - sampling_logps).abs() * m
        self._is_stats["sampling/sampling_logp_difference/mean"].append(
            (tok_diff.sum() / m.sum().clamp(min=1)).item()
        )
        self._is_stats["sampling/importance_sampling_ratio/mean"].append(
            (ratio * m).sum().item() / m.sum().clamp(min=1).item()
            if ratio.shape[-1] != 1
            else ratio.mean().item()
        )
        return ratio

    def _apply_is(self, inputs: dict, old_logps: torch.Tensor) -> None:
        mask = inputs["completion_mask"]
        ratio = self._is_ratio(old_logps.detach(), inputs["sampling_per_token_logps"], mask)
        if self.loss_type == "vespo":
            inputs["importance_sampling_ratio"] = ratio
        else:
            adv = inputs["advantages"]
            if adv.dim() == 1:
                adv = adv.unsqueeze(1)
            inputs["advantages"] = adv * ratio

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        if self._prefix is not None and model is self.model:
            logps, ent = prefix_logps(
                model,
                self._prefix,
                input_ids,
                attention_mask,
                logits_to_keep,
                kw.get("compute_entropy", False),
            )
            aux = None
        else:
            logps, ent, aux = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *a, **kw
            )
        # With num_iterations == 1 the old policy equals the current weights, so the IS ratio comes from this
        # very forward (detached) and is folded into the advantages before _compute_loss reads them.
        ctx = self._is_ctx
        if ctx is not None and model is self.model:
            self._is_ctx = None
            self._apply_is(ctx, logps)
        return logps, ent, aux

    @torch.no_grad()
    def _frozen_logps(self, model, inputs: dict) -> torch.Tensor:
        """Per-token completion logprobs ``(B, T)`` of ``model`` (the policy or the KL reference), no grad."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, _, _ = super()._get_per_token_logps_and_entropies(
            model, input_ids, attn, inputs["completion_ids"].size(1)
        )
        return logps

    # -- update ---------------------------------------------------------------------------------------
    def _micro_batches(self, samples, advantages, by_agent: bool) -> list[tuple[str | None, list[int]]]:
        """``(agent, indices)`` of each micro-batch: grouped by agent when ``by_agent`` (for per-agent grad
        norms; else the agent is ``None``, which no agent name can equal) and length-sorted (less padding)."""
        keys: list[str | None] = sorted({s.agent for s in samples}) if by_agent else [None]
        out = []
        for k in keys:
            idx = [i for i, s in enumerate(samples) if k is None or s.agent == k]
            idx.sort(key=lambda i: len(samples[i].prompt_ids) + len(samples[i].completion_ids))
            for j in range(0, len(idx), self.micro_batch_size):
                out.append((k, idx[j : j + self.micro_batch_size]))
        return out

    def update(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[float],
        *,
        agent_grad_norms: bool = False,
    ) -> dict[str, float]:
        """One GRPO update (``num_iterations`` optimizer steps) on this group's samples.

        Args:
            samples: this model group's samples of the step (any agents of the group).
            advantages: one float per sample (already normalised, e.g. Dr. MAS eq. 5).
            agent_grad_norms: also measure the gradient norm of each agent's samples alone.

        Returns:
            Plain-float metrics: ``loss``, ``grad_norm`` (pre-clip, of the last optimizer step),
            ``grad_norm/<agent>``, ``learning_rate``, ``entropy``, ``clip_ratio/*``, ``kl`` (beta > 0),
            IS statistics, ``num_tokens``, ``num_samples``, ``num_skipped_zero_advantage`` (samples left out of
            the forward/backward because their advantage is 0 and the loss makes that exact; see
            :meth:`_zero_advantage_is_free`).

        Raises:
            ValueError: on empty or malformed samples.
        """
        samples = list(samples)
        advantages = [float(a) for a in advantages]
        if not samples:
            raise ValueError("update needs at least one sample; skip groups that did not act instead")
        all_samples = samples
        all_agents = sorted({s.agent for s in samples})
        n_all = len(samples)
        total_tokens = sum(len(s.completion_ids) for s in samples if not self._masked(s))
        if self._zero_advantage_is_free():
            # A sample whose advantage is 0 adds exactly 0 to a token-normalised loss without KL or entropy
            # terms, and the normaliser (total_tokens) already counts it: leaving it out of the forward and
            # backward is exact and saves their cost. One sample is kept when all are 0, so the optimizer
            # still steps (Adam's moments move on a zero gradient too).
            keep = [i for i, a in enumerate(advantages) if a != 0.0] or [0]
            samples = [samples[i] for i in keep]
            advantages = [advantages[i] for i in keep]
        model = self.model
        model.train()
        use_is = bool(self.args.vllm_importance_sampling_correction)
        num_iterations = int(self.args.num_iterations)
        need_old = num_iterations > 1
        use_prefix = self.share_prefix and num_iterations == 1 and self.beta == 0.0
        shared = agent_prefix_lengths(samples) if use_prefix else {}
        mbs = self._micro_batches(samples, advantages, by_agent=agent_grad_norms or bool(shared))
        n_micro = len(mbs)
        weights = [1.0] * n_micro
        if self.shard_world > 1:  # workaround 7: this rank's share of the one-rank plan
            shared, agent_grad_norms = {}, False
            mbs, weights = self.shard_plan(mbs)
        prefixes = self._shared_prefixes(samples, shared)
        # Build inputs once per micro-batch; old/ref logps are those of the policy before this update.
        prepared = []
        for agent, idx in mbs:
            lead = prefixes[agent].length if agent in prefixes else 0
            inp = self.build_inputs([samples[i] for i in idx], [advantages[i] for i in idx], prefix_len=lead)
            # DAPO-style losses divide by num_items_in_batch * GA / steps_per_generation (workaround 5); make
            # that the step's total completion tokens whatever the micro-batching.
            inp["num_items_in_batch"] = torch.tensor(
                total_tokens * self.args.steps_per_generation / n_micro, dtype=torch.float32
            )
            if need_old:
                inp["old_per_token_logps"] = self._frozen_logps(self.model, inp)
            if self.beta != 0.0 and self._ref_is_base:
                with self.accelerator.unwrap_model(self.model).disable_adapter():
                    inp["ref_per_token_logps"] = self._frozen_logps(self.model, inp)
            elif self.beta != 0.0:
                inp["ref_per_token_logps"] = self._frozen_logps(self.ref_model, inp)
            prepared.append((agent, inp))
        if use_is and need_old:
            for _, inp in prepared:
                self._apply_is(inp, inp["old_per_token_logps"])

        self.current_gradient_accumulation_steps = n_micro
        params = [p for p in model.parameters() if p.requires_grad]
        losses: list[float] = []
        # An agent whose samples were all left out (advantage 0) has a gradient of exactly 0.
        agent_norms: dict[str, float] = dict.fromkeys(all_agents, 0.0) if agent_grad_norms else {}
        grad_norm = float("nan")
        for _ in range(num_iterations):
            acc: list[torch.Tensor | None] | None = None
            current = None
            for (agent, inp0), weight in zip(prepared, weights, strict=True):
                inp = dict(inp0)
                if agent != current:
                    if current in prefixes:  # the last agent's prefix gets its accumulated gradient
                        prefixes[current].backward()
                    if agent_grad_norms:
                        acc = self._fold_agent_grad(params, acc, current, agent_norms)
                    current = agent
                    self._prefix = prefixes.get(agent)
                if use_is and not need_old:
                    self._is_ctx = inp
                try:
                    with self.compute_loss_context_manager():
                        loss = self.compute_loss(model, inp)
                finally:
                    self._is_ctx = None
                if self.shard_world > 1:  # FSDP averages the ranks' gradients; one rank sums micro-batches
                    loss = loss * (self.shard_world * weight)
                losses.append(loss.detach().item() / self.shard_world)
                self.accelerator.backward(loss)
            self._prefix = None
            if current in prefixes:
                prefixes[current].backward()
            if agent_grad_norms:
                acc = self._fold_agent_grad(params, acc, current, agent_norms)
                for p, a in zip(params, acc, strict=True):
                    p.grad = a
            max_norm = self.args.max_grad_norm
            gn = self.accelerator.clip_grad_norm_(
                model.parameters(), max_norm if max_norm and max_norm > 0 else float("inf")
            )
            if hasattr(gn, "full_tensor"):  # FSDP2: the norm of DTensor gradients is a DTensor
                gn = gn.full_tensor()
            grad_norm = float(gn.item() if torch.is_tensor(gn) else gn)
            self.optimizer.step()
            self.lr_scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.global_step += 1
        model.eval()

        out: dict[str, float] = {
            "loss": float(sum(losses) / max(num_iterations, 1)),  # this rank's part when sharded
            "grad_norm": grad_norm,
            "learning_rate": float(self.lr_scheduler.get_last_lr()[0]),
            "num_tokens": float(sum(len(s.completion_ids) for s in all_samples)),
            "num_masked_truncated": float(sum(self._masked(s) for s in all_samples)),
            "num_samples": float(n_all),
            "num_skipped_zero_advantage": float(n_all - len(samples)),
            "num_micro_batches": float(n_micro),
        }
        for a, v in agent_norms.items():
            out[f"grad_norm/{a}"] = v
        for key, vals in self._metrics["train"].items():
            vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
            if vals:
                out[key] = float(np.mean(vals))
        self._metrics["train"].clear()
        for key, vals in self._is_stats.items():
            out[key] = float(np.mean(vals))
        self._is_stats.clear()
        return out

    def _shared_prefixes(self, samples: Sequence[Sample], lengths: dict[str, int]) -> dict[str, SharedPrefix]:
        """The agents' shared prefixes, run forward now; none, now and later, for a model whose cache cannot be
        broadcast (the plain forward)."""
        with self.compute_loss_context_manager():
            out = build_prefixes(self.model, samples, lengths, self.accelerator.device)
        if out is None:
            self.share_prefix = False
        return out or {}

    def _zero_advantage_is_free(self) -> bool:
        """Whether a zero-advantage sample adds exactly nothing to the gradient: a token-normalised ``loss_type``
        (``dapo``, ``cispo``, ``vespo``; their normaliser counts all samples), ``beta == 0``, no entropy bonus.
        The per-sequence losses (``grpo``, ``bnpo``, ``dr_grpo``) average over rows: a zero row changes them."""
        return (
            self.loss_type in ("dapo", "cispo", "vespo")
            and self.beta == 0.0
            and not getattr(self, "_entropy_bonus_enabled", False)
        )

    @staticmethod
    def _fold_agent_grad(params, acc, agent, norms):
        """Read the gradient accumulated since the last fold (one agent's samples alone), add it to ``acc``
        and clear ``.grad`` for the next agent."""
        if agent is None:
            return acc
        sq = torch.zeros((), dtype=torch.float64)
        for p in params:
            if p.grad is not None:
                sq += p.grad.detach().double().pow(2).sum().cpu()
        norms[agent] = float(sq.sqrt().item())
        if acc is None:
            acc = [p.grad for p in params]
        else:
            for i, p in enumerate(params):
                if p.grad is None:
                    continue
                if acc[i] is None:
                    acc[i] = p.grad
                else:
                    acc[i].add_(p.grad)
        for p in params:
            p.grad = None
        return acc

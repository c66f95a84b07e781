"""The GRPO update of one model group: a TRL ``GRPOTrainer`` subclass that trains on pre-built samples.

TRL's ``GRPOTrainer`` computes rewards and advantages inside one long method with a fixed
``view(-1, num_generations)`` layout that a multi-agent system breaks (each agent acts a variable number of
times per trajectory). So rollouts and advantages are built outside (``mas_train.rollout``,
``mas_train.advantages``), and each model group's trainer only receives ready samples:
:meth:`GroupGRPOTrainer.update` pads them, calls the adapter's ``compute_loss`` (our loss,
:mod:`mas_train.grpo.loss`: every ``loss_type``, clipping, KL when ``beta > 0``), and steps TRL's optimizer and
scheduler.

What TRL would do and we do ourselves:

* **Importance-sampling correction** against the backend's sampling logprobs (TRL only applies it with vLLM).
  With ``w = exp(logp_old - logp_sampling)`` (token- or sequence-level, truncated or masked with TRL's
  ``vllm_importance_sampling_*`` settings), the loss weights each token's surrogate by ``w``
  (:func:`mas_train.grpo.loss.weighted`, as TRL does for vLLM); ``vespo`` takes ``w`` into its gamma weights
  instead. With ``num_iterations == 1`` the old policy *is* the current one, so ``w`` is computed from the
  training forward itself (:meth:`GroupGRPOTrainer.importance_weights`, no extra forward pass). Applied only where the
  sampler and the trainer differ (:func:`mas_train.precision.tis_rule`, via ``vllm_importance_sampling_correction``);
  the per-agent mismatch is measured either way (:class:`~mas_train.grpo.importance.SamplerCheck`).
* **mask_truncated_completions**: a completion the backend cut at ``max_new_tokens`` (``finish_reason ==
  "length"``) gets an all-zero completion mask, so it takes no part in the loss (TRL applies the setting in
  ``_generate_and_score_completions``, which this update bypasses).
* **Gradient accumulation** over micro-batches of ``micro_batch_size`` samples, so memory is bounded whatever
  the number of turns.
* **Copies of one sequence trained once**: where the loss is linear in each row's advantage
  (:meth:`GroupGRPOTrainer._merging_is_exact`), samples with the same agent, prompt and completion become one row
  with their advantages summed (:func:`mas_train.samples.merge_duplicates`), the same gradient for fewer forwards
  (a game's few states; Kuhn poker's step trains at most 24 distinct rows). Loss metrics (entropy, clip ratios,
  sampler mismatch) are then means over distinct rows.
* **Per-agent gradient norms** (paper Fig. 4): each agent's micro-batches are back-propagated into empty
  ``.grad`` buffers, the norm of that agent's gradient alone is read, and it is added into a running sum that
  becomes the real gradient. The update is therefore exactly the one without the measurement.

Every touch of TRL's private API, and every workaround of its behaviour, is in
:mod:`mas_train.grpo.trl_adapter` (:class:`~mas_train.grpo.trl_adapter.TRLGRPO`, the base class here), which lists
them. Sharded groups (:mod:`mas_train.hosting.sharded`) pass a :class:`ShardPlan`: each rank runs its share of the
one-rank micro-batch plan with the one-rank normalisers, its loss times N (FSDP's reduce-scatter averages over
ranks); no shared prefixes or per-agent norms there (their extra forwards would differ between ranks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from trl import GRPOConfig

from mas_train.grpo.importance import SamplerCheck
from mas_train.grpo.prefix import SharedPrefix, agent_prefix_lengths, build_prefixes, prefix_logps
from mas_train.grpo.trl_adapter import TRLGRPO, TokenLogps, grpo_args
from mas_train.samples import Sample, merge_duplicates

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


__all__ = ["GroupGRPOTrainer", "MicroBatch", "ShardPlan", "grpo_args"]

#: one micro-batch of an update: its agent (``None`` when micro-batches are not split by agent) and the indices of
#: its samples
MicroBatch = tuple[str | None, list[int]]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardPlan:
    """A sharded group's rank: ``world`` ranks; ``share(plan)`` gives this rank's micro-batches of the one-rank
    plan and their loss weights (:func:`~mas_train.hosting.sharded_rank.rank_share`)."""

    world: int
    share: Callable[[list[MicroBatch]], tuple[list[MicroBatch], list[float]]]


class GroupGRPOTrainer(TRLGRPO):
    """A ``trl.GRPOTrainer`` that trains one model group on pre-built samples (pattern (A)).

    Args:
        model: the policy (``PreTrainedModel``), trained in place.
        tokenizer: its tokenizer (pad id for padding; TRL's processing class).
        args: a ``GRPOConfig`` (see :func:`grpo_args`). ``max_steps`` sizes the LR schedule.
        micro_batch_size: samples per forward/backward; the step's samples are accumulated over
            ``ceil(n / micro_batch_size)`` micro-batches (more if split by agent), one optimizer step.
        ref_model: frozen reference policy for the KL term; built as a copy of ``model`` when
            ``args.beta > 0`` and none is given (a ``peft.PeftModel``: its base with adapters disabled).
        share_prefix: run the prompt prefix an agent's samples share once per update (:mod:`mas_train.grpo.prefix`;
            same gradient, less compute) when ``num_iterations == 1`` and ``beta == 0``.

    After every :meth:`update` the TRL optimizer, scheduler and ``state.global_step`` have advanced by
    ``args.num_iterations`` steps.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        args: GRPOConfig,
        *,
        micro_batch_size: int,
        ref_model: torch.nn.Module | None = None,
        share_prefix: bool = True,
        shard: ShardPlan | None = None,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        super().__init__(model, tokenizer, args, ref_model=ref_model)
        self.micro_batch_size = micro_batch_size
        self.pad_token_id = tokenizer.pad_token_id
        # an MoE router loss needs the plain forward (the shared-prefix forward does not return it)
        self.share_prefix = share_prefix and not self.aux_loss_enabled
        self._prefix: SharedPrefix | None = None  # the shared prefix of the current micro-batch's rows
        self.sampler_check = SamplerCheck(
            bool(args.vllm_importance_sampling_correction),
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
        )
        self.shard = shard

    # -- inputs ---------------------------------------------------------------------------------------
    def build_inputs(
        self, samples: Sequence[Sample], advantages: Sequence[float], prefix_len: int = 0
    ) -> dict[str, Any]:
        """Pad samples into TRL's loss inputs.

        With ``prefix_len`` L > 0 (the samples' prompts share their first L tokens), each prompt row is laid out
        ``[prefix | left padding | rest of the prompt]`` for :func:`mas_train.grpo.prefix.prefix_logps`.

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

    def training_logps(self, model: Any, inputs: Mapping[str, Any]) -> TokenLogps:
        """The loss's forward: through the shared prefix of the current micro-batch when there is one
        (:func:`mas_train.grpo.prefix.prefix_logps`), else the adapter's."""
        if self._prefix is not None and model is self.model:
            input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            logps, ent = prefix_logps(
                model, self._prefix, input_ids, attn, inputs["completion_ids"].size(1), compute_entropy=True
            )
            return TokenLogps(logps, ent)
        return super().training_logps(model, inputs)

    def importance_weights(self, inputs: Mapping[str, Any], logps: torch.Tensor) -> torch.Tensor | None:
        """The importance-sampling weight of a micro-batch: the one computed before the update
        (``num_iterations > 1``), else, for the rows' agents in ``inputs["row_agents"]``, from this very forward
        (detached; with ``num_iterations == 1`` the old policy is the current weights), measured per agent
        (:class:`~mas_train.grpo.importance.SamplerCheck`)."""
        if "importance_sampling_ratio" in inputs or "row_agents" not in inputs:
            return super().importance_weights(inputs, logps)
        return self.sampler_check(inputs, logps.detach(), inputs["row_agents"])

    # -- update ---------------------------------------------------------------------------------------
    def _micro_batches(
        self, samples: Sequence[Sample], advantages: Sequence[float], by_agent: bool
    ) -> list[MicroBatch]:
        """``(agent, indices)`` of each micro-batch: grouped by agent when ``by_agent`` (for per-agent grad
        norms; else the agent is ``None``, which no agent name can equal) and length-sorted (less padding)."""
        keys: list[str | None] = [a for a in sorted({s.agent for s in samples})] if by_agent else [None]
        out: list[MicroBatch] = []
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
            IS statistics, ``num_tokens``, ``num_samples``, ``num_merged_duplicates`` (copies of another
            sample's sequence trained in its row, :meth:`_merging_is_exact`), ``num_skipped_zero_advantage``
            (distinct samples left out of the forward/backward because their advantage is 0 and the loss makes
            that exact; see :meth:`_zero_advantage_is_free`).

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
        if self._merging_is_exact():  # copies of one sequence: one row with their advantages summed (exact)
            samples, advantages = merge_duplicates(samples, advantages, self._masked)
        n_distinct = len(samples)
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
        num_iterations = int(self.args.num_iterations)
        need_old = num_iterations > 1
        use_prefix = self.share_prefix and num_iterations == 1 and self.beta == 0.0
        shared = agent_prefix_lengths(samples) if use_prefix else {}
        mbs = self._micro_batches(samples, advantages, by_agent=agent_grad_norms or bool(shared))
        n_micro = len(mbs)
        weights = [1.0] * n_micro
        world = self.shard.world if self.shard is not None else 1
        if self.shard is not None:  # this rank's share of the one-rank plan
            shared, agent_grad_norms = {}, False
            mbs, weights = self.shard.share(mbs)
        prefixes = self._shared_prefixes(samples, shared)
        # Build inputs once per micro-batch; old/ref logps are those of the policy before this update.
        prepared = []
        for agent, idx in mbs:
            lead = prefixes[agent].length if agent in prefixes else 0
            inp = self.build_inputs([samples[i] for i in idx], [advantages[i] for i in idx], prefix_len=lead)
            # the token-normalised losses (dapo, cispo, vespo) divide by the step's completion tokens, whatever
            # the micro-batching
            inp["num_items_in_batch"] = torch.tensor(float(total_tokens), dtype=torch.float32)
            rows = [samples[i].agent for i in idx]
            if need_old:
                inp["old_per_token_logps"] = self.completion_logps(self.model, inp)
            else:  # the IS weight comes from the training forward itself (importance_weights)
                inp["row_agents"] = rows
            if self.beta != 0.0 and self.ref_is_base:
                with self.accelerator.unwrap_model(self.model).disable_adapter():
                    inp["ref_per_token_logps"] = self.completion_logps(self.model, inp)
            elif self.beta != 0.0:
                inp["ref_per_token_logps"] = self.completion_logps(self.ref_model, inp)
            prepared.append((agent, inp, rows))
        # token positions each optimizer step runs through the model (padding included, a shared prefix once):
        # the work done, which the left-out zero-advantage samples and the shared prefix make less than the batch
        forward_tokens = sum(p.length for p in prefixes.values()) + sum(
            inp["completion_ids"].numel()
            + inp["prompt_ids"].numel()
            - inp["prompt_ids"].size(0) * (prefixes[a].length if a in prefixes else 0)
            for a, inp, _ in prepared
        )
        if need_old:  # the mismatch (and the correction) against the policy before the update
            for _, inp, rows in prepared:
                w = self.sampler_check(inp, inp["old_per_token_logps"], rows)
                if w is not None:
                    inp["importance_sampling_ratio"] = w

        self.set_accumulation(n_micro)
        params = [p for p in model.parameters() if p.requires_grad]
        losses: list[float] = []
        # An agent whose samples were all left out (advantage 0) has a gradient of exactly 0.
        agent_norms: dict[str, float] = dict.fromkeys(all_agents, 0.0) if agent_grad_norms else {}
        grad_norm = float("nan")
        for _ in range(num_iterations):
            acc: list[torch.Tensor | None] | None = None
            current = None
            for (agent, inp0, _), weight in zip(prepared, weights, strict=True):
                inp = dict(inp0)
                if agent != current:
                    if current is not None and current in prefixes:  # the last agent's prefix: its gradient
                        prefixes[current].backward()
                    if agent_grad_norms:
                        acc = self._fold_agent_grad(params, acc, current, agent_norms)
                    current = agent
                    self._prefix = prefixes.get(agent) if agent is not None else None
                loss = self.grpo_loss(model, inp)
                if world > 1:  # FSDP averages the ranks' gradients; one rank sums micro-batches
                    loss = loss * (world * weight)
                losses.append(loss.detach().item() / world)
                self.accelerator.backward(loss)
            self._prefix = None
            if current in prefixes:
                prefixes[current].backward()
            if agent_grad_norms:
                acc = self._fold_agent_grad(params, acc, current, agent_norms)
                assert acc is not None  # the last agent was folded
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
            "num_merged_duplicates": float(n_all - n_distinct),
            "num_skipped_zero_advantage": float(n_distinct - len(samples)),
            "num_micro_batches": float(n_micro),
            "num_forward_tokens": float(forward_tokens * num_iterations),
        }
        for a, v in agent_norms.items():
            out[f"grad_norm/{a}"] = v
        out.update(self.pop_loss_metrics())
        out.update(self.sampler_check.pop())
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
            and not self.entropy_bonus_enabled
        )

    def _merging_is_exact(self) -> bool:
        """Whether copies of one (prompt, completion) may be trained as one row with their advantages summed
        (:func:`mas_train.samples.merge_duplicates`): the loss is linear in each row's advantage and its
        normaliser counts every copy's tokens. That holds for ``dapo``/``cispo`` at ``num_iterations == 1`` (the
        ratio is 1, no clip binds) with nothing else per row: no KL, entropy bonus or top-entropy mask, no
        sampler correction or off-policy mask (they read each copy's sampling logprobs), no ``delta`` below 1, dropout off."""
        a = self.args
        return (
            self.loss_type in ("dapo", "cispo")
            and int(a.num_iterations) == 1
            and self._zero_advantage_is_free()
            and not self.sampler_check.correct
            and a.off_policy_mask_threshold is None
            and float(a.top_entropy_quantile) >= 1.0
            and not self.aux_loss_enabled
            and (a.delta is None or float(a.delta) >= 1.0)  # a cap below 1 binds at ratio 1: not linear in A
            and bool(a.disable_dropout)  # n copies under dropout are n masks, not one
        )

    @staticmethod
    def _fold_agent_grad(
        params: Sequence[torch.Tensor],
        acc: list[torch.Tensor | None] | None,
        agent: str | None,
        norms: dict[str, float],
    ) -> list[torch.Tensor | None] | None:
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
                held = acc[i]
                if held is None:
                    acc[i] = p.grad
                else:
                    held.add_(p.grad)
        for p in params:
            p.grad = None
        return acc

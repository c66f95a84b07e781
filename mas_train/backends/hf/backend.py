"""Hugging Face transformers generation backend: the CPU default.

:class:`HFBackend` runs its own incremental decode loop (prefill + one token per step with the model's KV cache)
instead of ``model.generate``, for three reasons:

* every row of a batch samples with its own settings (temperature, top-p, top-k, max_new_tokens, stop strings)
  and its own ``torch.Generator``, so mixed :class:`SamplingParams` share one forward pass and a per-request
  seed gives the same completion whatever else is in the batch;
* the logprob of each sampled token is taken from exactly the logits it was sampled from, with no hidden
  processors (``generate`` merges the checkpoint's ``generation_config``, e.g. a repetition penalty, into the
  sampling distribution without telling the caller);
* stop strings end a row at the token that completes them and the finish reason says which one;
* a finished row leaves the batch (and the KV cache) at once, so one long completion does not make the
  others pay for padding steps;
* identical prompts in a batch are prefilled once (prompt sharing, see :mod:`mas_train.backends.hf.loop`);
* rows may name their own LoRA adapter (``generate(..., adapters=[...])`` on a ``peft.PeftModel``): PEFT's
  mixed-adapter batch (``adapter_names=`` on every forward) adds each row's own ``B A x`` to the shared base
  output, so agents whose adapters sit on one base sample in one call, each row exactly as in a call with its
  adapter active (up to float rounding of the sub-batch matmuls). PEFT refuses it in training mode (sampling
  runs in eval mode), with merged adapters and with DoRA.

On CPU, sampling runs the model's large linear layers through oneDNN-packed copies of their weights, its
Llama-style RMSNorms through ``F.rms_norm``, and the KV cache in preallocated buffers
(:mod:`mas_train.backends.hf.kernels`: measured 1.6-2.3x faster decode GEMMs, the norms and the cache bit for bit
the same, the GEMMs up to float rounding), and each decode step of a Llama-family model (LoRA adapters included)
as :mod:`mas_train.backends.hf.decode`'s fused step (~20 tensor ops per layer instead of ~45 through the
modules; 0.99-1.18x the model forward's tok/s on SmolLM2 at batch 8 over 8 runs; logits equal up to float
rounding).

Logprobs are ``log_softmax(logits / temperature)[token]`` (natural log, fp32; greedy: temperature 1), the
quantity TRL's trainer recomputes and SGLang returns, so importance ratios compare like with like. Top-p/top-k
truncation restricts which tokens can be drawn but is not folded into the reported logprob (as in SGLang).

This module holds the backend's surface: construction, request checks, batching, weight sync and lifecycle.
The decode loop of one batch (prefill with prompt sharing, finished-row dropping, per-row adapters: they all
edit the same batch state of that loop) is :class:`~mas_train.backends.hf.loop.DecodeLoop`, the backend's base
class, whose docstring also describes prompt sharing; sampling itself lives in
:mod:`mas_train.backends.hf.sampling`.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from mas_train.backends.base import GenerationOutput, SamplingParams
from mas_train.backends.hf.decode import supports_fused_decode
from mas_train.backends.hf.kernels import PackedLinears, fused_rms_norms, onednn_available
from mas_train.backends.hf.loop import DecodeLoop
from mas_train.models import cache_keyword

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["HFBackend"]

# Wrapper prefixes a trainer's state_dict may carry (DDP / accelerate, torch.compile).
_NAME_PREFIXES = ("module.", "_orig_mod.")


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos is not None:
        ids.update(int(i) for i in gen_eos)
    return frozenset(ids)


class HFBackend(DecodeLoop):
    """Batched sampling with a ``transformers`` causal LM; implements :class:`GenerationBackend`.

    Args:
        model: a ``PreTrainedModel`` causal LM (any architecture whose ``forward`` takes ``attention_mask``,
            ``position_ids`` and a KV cache).
        tokenizer: its tokenizer; used for the pad/EOS ids and to detect stop strings (decoding only; the
            returned ids are never re-tokenised).
        device: where the private copy generates; default: the model's device.
        share_model: ``False`` (default) generates with a private deep copy of ``model`` that only
            :meth:`update_weights` changes, like a real inference engine: a forgotten or wrong weight sync shows
            up as stale outputs in tests instead of being hidden. It costs one more copy of the weights.
            ``True`` generates with ``model`` itself (no extra memory; :meth:`update_weights` then only bumps the
            version when the tensors are the model's own, and copies them otherwise).
        dtype: dtype of the private copy (e.g. ``torch.bfloat16`` to sample faster on GPU).
        max_batch_size: most prompts per forward pass (caps KV-cache memory); ``None`` = all at once.
        seed: seeds the per-request seeds of requests that have none, so a run is reproducible as a whole.
        eos_token_ids: ids that end generation; default: the tokenizer's EOS plus the model's
            ``generation_config.eos_token_id`` (e.g. Qwen's ``<|im_end|>`` and ``<|endoftext|>``).
        packed_linears: run the large linear layers through oneDNN-packed copies of their weights while
            sampling (:class:`~mas_train.backends.hf.kernels.PackedLinears`: 1.6-2.3x faster decode GEMMs on
            CPU, logits equal up to float rounding, one more copy of the weights). ``None`` (default): on when
            generating on CPU with a torch build that has oneDNN; ``False``: plain ``F.linear``.
        fused_decode: run each decode step of a Llama-family model (Llama, Qwen2, Qwen3, Mistral; LoRA
            adapters included) as :class:`~mas_train.backends.hf.decode.FusedDecoder`'s ~20 tensor ops per layer
            instead of the model's forward (logits equal up to float rounding; prefill stays the model's own).
            ``None`` (default): on when generating on CPU in fp32 with a supported model; a batch the step
            cannot compute exactly (a DoRA adapter, a cache of other layer types) steps through the model's
            forward. ``True``: required (refused where unsupported); ``False``: always the model's forward.

    Raises:
        ValueError: ``max_batch_size < 1``; ``device``/``dtype`` given with ``share_model=True``; a tokenizer
            with neither pad nor EOS token; ``packed_linears=True`` off CPU or without oneDNN;
            ``fused_decode=True`` off CPU or for a model :class:`~mas_train.backends.hf.decode.FusedDecoder`
            does not support.

    Requests are sorted by prompt length (identical prompts next to each other, so they land in the same batch),
    split into batches of at most ``max_batch_size`` rows, left-padded, prefilled once per distinct prompt (the
    cache is then expanded to all rows, so ``max_batch_size`` still bounds KV-cache memory) and decoded until
    every row has finished (EOS, stop string or its own ``max_new_tokens``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: torch.device | str | None = None,
        share_model: bool = False,
        dtype: torch.dtype | None = None,
        max_batch_size: int | None = None,
        seed: int = 0,
        eos_token_ids: Iterable[int] | None = None,
        packed_linears: bool | None = None,
        fused_decode: bool | None = None,
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        model_device = next(model.parameters()).device
        self.device = torch.device(device) if device is not None else model_device
        can_pack = self.device.type == "cpu" and onednn_available()
        if packed_linears and not can_pack:
            raise ValueError(
                f"packed_linears=True needs generation on CPU with a oneDNN torch build (device {self.device}, "
                f"oneDNN {onednn_available()}); use packed_linears=None or False"
            )
        self.share_model = bool(share_model)
        if share_model:
            if self.device != model_device or dtype is not None:
                raise ValueError(
                    "share_model=True samples with the model as it is: device= and dtype= only apply to the "
                    f"private copy (model is on {model_device}); drop them or use share_model=False"
                )
            self._model = model
        else:
            # normal tensors even when built under inference_mode: their version counters let the packed
            # linears skip repacking weights that did not change
            with torch.inference_mode(False):
                self._model = copy.deepcopy(model).to(self.device)
                if dtype is not None:
                    self._model.to(dtype)
            self._model.requires_grad_(False)
            self._model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_token_ids = (
            frozenset(eos_token_ids) if eos_token_ids is not None else _eos_ids(model, tokenizer)
        )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError(
                "the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token first"
            )
        self.pad_token_id = int(pad)
        self.vocab_size = int(self._model.get_output_embeddings().weight.shape[0])
        self.weight_version = 0
        self._rng = random.Random(seed)
        self._asleep = False
        self._closed = False
        # The keywords the model's own forward takes: a PEFT wrapper's forward (or TRL's fused-LM-head patch on
        # the instance) is (*args, **kwargs) and would hide them, so read the base model class's signature.
        base = self._model.get_base_model() if hasattr(self._model, "get_base_model") else self._model
        params = inspect.signature(type(base).forward).parameters
        self._cache_kw = cache_keyword(self._model)
        self._keep_last_logits = "logits_to_keep" in params
        self._share_prefill = True  # turned off for good if the model's cache cannot select batch rows
        self._packed = (
            PackedLinears(self._model) if (can_pack if packed_linears is None else packed_linears) else None
        )
        if packed_linears and self._packed is not None and self._packed.skipped:
            raise ValueError(f"packed_linears=True, but {self._packed.skipped}; use packed_linears=None")
        self._reserve = 0  # KV positions a new cache leaves free: the current batch's decode steps
        why_not = "it generates on " + str(self.device) if self.device.type != "cpu" else None
        why_not = why_not or supports_fused_decode(self._model)
        if fused_decode and why_not:
            raise ValueError(f"fused_decode=True, but {why_not}; use fused_decode=None or False")
        self._fused_decode = False if why_not else fused_decode  # None: per batch, where the step applies

    @property
    def model(self) -> PreTrainedModel:
        """The module generation runs with (the private copy unless ``share_model=True``)."""
        self._check_usable()
        return self._model

    # -- GenerationBackend ---------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
        *,
        adapters: Sequence[str] | None = None,
    ) -> list[GenerationOutput]:
        """Sample one completion per prompt (see :meth:`GenerationBackend.generate`).

        Args:
            prompt_ids: N non-empty prompts of token ids in ``[0, vocab_size)``.
            sampling: one :class:`SamplingParams` for all, or N of them.
            adapters: N LoRA adapter names, one per prompt, when the model is a ``peft.PeftModel``: row i then
                runs with adapter ``adapters[i]`` whatever adapter is active (PEFT's mixed-adapter batch,
                ``adapter_names=`` on every forward; each LoRA layer adds ``B A x`` of each row's own adapter
                to the shared base output). ``None`` (default): every row uses the model as it is. Rows of
                different adapters never share a prefill (their keys and values differ).

        Returns:
            N :class:`GenerationOutput` in prompt order; ``meta["seed"]`` is the seed the row sampled with.

        Raises:
            ValueError: empty prompt, id out of range, ``len(sampling) != N``; ``adapters`` of the wrong
                length, on a model without PEFT adapters, naming an adapter the model lacks, or while an
                adapter is merged into the base weights (PEFT cannot mix merged adapters).
            RuntimeError: the backend is asleep or closed.
        """
        self._check_usable()
        prompts = [list(map(int, p)) for p in prompt_ids]
        n = len(prompts)
        if isinstance(sampling, SamplingParams):
            params = [sampling] * n
        else:
            params = list(sampling)
            if len(params) != n:
                raise ValueError(
                    f"got {len(params)} SamplingParams for {n} prompts; pass one or one per prompt"
                )
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
            if min(p) < 0 or max(p) >= self.vocab_size:
                raise ValueError(f"prompt {i} has token ids outside [0, {self.vocab_size})")
        names = self._check_adapters(adapters, n)
        seeds = [sp.seed if sp.seed is not None else self._rng.randrange(2**63) for sp in params]
        version = self.weight_version
        # identical prompts sort next to each other, so a batch split keeps duplicates together for prefill sharing
        order = sorted(range(n), key=lambda i: (-len(prompts[i]), prompts[i], names[i] if names else ""))
        step = self.max_batch_size or max(n, 1)
        results: list[GenerationOutput | None] = [None] * n
        packed = self._packed.active() if self._packed is not None else contextlib.nullcontext()
        norms = fused_rms_norms(self._model) if self.device.type == "cpu" else contextlib.nullcontext()
        with torch.inference_mode(), self._eval_mode(), packed, norms:
            for start in range(0, n, step):
                idx = order[start : start + step]
                outs = self._generate_batch(
                    [prompts[i] for i in idx],
                    [params[i] for i in idx],
                    [seeds[i] for i in idx],
                    version,
                    [names[i] for i in idx] if names else None,
                )
                for i, out in zip(idx, outs, strict=True):
                    results[i] = out
        return results  # type: ignore[return-value]

    @property
    def can_score(self) -> bool:
        """:class:`~mas_train.backends.base.LogprobScorer`: this backend scores completions (:meth:`score`)."""
        return True

    def score(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """The model's per-token log-probabilities of given completions (teacher forcing), in eval mode.

        Each value is ``log_softmax(logits)[token]`` at temperature 1 with no truncation (natural log, fp32):
        the model's own distribution, the quantity :class:`GenerationOutput` reports for a greedy completion.
        Per batch of at most ``max_batch_size`` rows, the prompts go through :meth:`generate`'s prefill (each
        distinct prompt once, a long common prefix once: several completions of one prompt, or prompts that
        share a preamble, cost little more than one), then the completions in one forward on that KV cache.

        Args:
            prompt_ids: N non-empty prompts of token ids.
            completion_ids: N completions of token ids (an empty one scores ``[]``).

        Returns:
            N lists of floats, ``len(completion_ids[i])`` each, in order.

        Raises:
            ValueError: ``len(completion_ids) != N``, an empty prompt, or an id outside ``[0, vocab_size)``.
            RuntimeError: the backend is asleep or closed.
        """
        self._check_usable()
        prompts = [list(map(int, p)) for p in prompt_ids]
        comps = [list(map(int, c)) for c in completion_ids]
        if len(comps) != len(prompts):
            raise ValueError(f"got {len(comps)} completions for {len(prompts)} prompts; pass one per prompt")
        for i, (p, c) in enumerate(zip(prompts, comps, strict=True)):
            if not p:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
            if min(p + c) < 0 or max(p + c) >= self.vocab_size:
                raise ValueError(f"prompt or completion {i} has token ids outside [0, {self.vocab_size})")
        out: list[list[float]] = [[] for _ in prompts]
        # identical prompts next to each other, so a batch split keeps them in one prefill
        rows = sorted((i for i, c in enumerate(comps) if c), key=lambda i: (-len(prompts[i]), prompts[i]))
        step = self.max_batch_size or max(len(rows), 1)
        # no packed linears: they pay off in decode steps, and a backend that never sampled would pack a copy of
        # the weights just for this (under shared_lora every group's backend holds its own packed copy)
        norms = fused_rms_norms(self._model) if self.device.type == "cpu" else contextlib.nullcontext()
        with torch.inference_mode(), self._eval_mode(), norms:
            for start in range(0, len(rows), step):
                idx = rows[start : start + step]
                got = self._score_batch([prompts[i] for i in idx], [comps[i] for i in idx])
                for i, lps in zip(idx, got, strict=True):
                    out[i] = lps
        return out

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Copy named tensors (trainer ``state_dict`` names; ``module.`` / ``_orig_mod.`` prefixes are stripped)
        into the generation model and bump :attr:`weight_version`. A subset of the tensors may be given.

        All names and shapes are checked before anything is copied, so a failed update changes nothing.

        Returns:
            The new ``weight_version``.

        Raises:
            RuntimeError: unknown names, shape mismatches, no tensors, or the backend is closed.
        """
        self._check_open()
        items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        if not items:
            raise RuntimeError("update_weights got no tensors")
        targets = self._model.state_dict(keep_vars=True)
        plan: list[tuple[torch.Tensor, torch.Tensor]] = []
        problems: list[str] = []
        for name, tensor in items:
            key = name
            while key.startswith(_NAME_PREFIXES):  # wrappers nest in any order (compiled DDP module, ...)
                key = key.split(".", 1)[1]
            dst = targets.get(key)
            if dst is None:
                problems.append(f"unknown tensor {name!r}")
            elif tuple(dst.shape) != tuple(tensor.shape):
                problems.append(f"{name}: shape {tuple(tensor.shape)} != {tuple(dst.shape)}")
            else:
                plan.append((dst, tensor))
        if problems:
            raise RuntimeError(
                "update_weights failed, nothing was changed: "
                + "; ".join(problems[:5])
                + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
                + ". Names must match the generation model's state_dict (merge PEFT adapters first)."
            )
        with torch.no_grad():
            for dst, src in plan:
                if dst.data_ptr() != src.data_ptr():  # sharing the trainer's module: already in place
                    dst.copy_(src.detach().to(device=dst.device, dtype=dst.dtype))
        self.weight_version += 1
        return self.weight_version

    def sleep(self) -> None:
        """Move a private copy on an accelerator to CPU and free the accelerator cache; on CPU nothing moves.

        Until :meth:`wake`, :meth:`generate` raises (the same discipline an SGLang engine needs).
        """
        self._check_open()
        if not self.share_model and self.device.type != "cpu":
            self._model.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self._asleep = True

    def wake(self) -> None:
        """Undo :meth:`sleep`."""
        self._check_open()
        if self._asleep and not self.share_model and self.device.type != "cpu":
            self._model.to(self.device)
        self._asleep = False

    def close(self) -> None:
        """Drop the generation model (the caller's model is untouched). Idempotent."""
        self._closed = True
        self._model = None
        self._packed = None  # it references the model: a closed private copy and its packed weights are freed

    # -- internals -----------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("HFBackend is closed; create a new backend")

    def _check_usable(self) -> None:
        self._check_open()
        if self._asleep:
            raise RuntimeError("HFBackend is asleep; call wake() before generate()")

    def _check_adapters(self, adapters: Sequence[str] | None, n: int) -> list[str] | None:
        if adapters is None:
            return None
        names = [str(a) for a in adapters]
        if len(names) != n:
            raise ValueError(f"got {len(names)} adapter names for {n} prompts; pass one per prompt")
        known = getattr(self._model, "peft_config", None)
        if not isinstance(known, Mapping):
            raise ValueError(
                "adapters= needs a peft.PeftModel with LoRA adapters; this backend's model has none "
                "(drop adapters= or build the backend on the PeftModel)"
            )
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ValueError(f"adapters {unknown} are not adapters of the model; it has {sorted(known)}")
        if any(getattr(m, "merged", False) for m in self._model.modules() if hasattr(m, "lora_A")):
            raise ValueError(
                "adapters= cannot run while a LoRA adapter is merged into the base weights "
                "(PEFT's mixed-adapter batches need unmerged adapters); call unmerge_adapter() first"
            )
        return names

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        # A shared trainer module may be in train mode (dropout); sample in eval mode and restore it after.
        was_training = self._model.training
        self._model.eval()
        try:
            yield
        finally:
            self._model.train(was_training)

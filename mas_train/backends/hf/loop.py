"""The decode loop of :class:`~mas_train.backends.hf.HFBackend`: one batch from its prefill to its last token.

:class:`DecodeLoop` holds the batch state of one :meth:`~mas_train.backends.hf.HFBackend.generate` batch (KV
cache, attention mask, positions, live rows, per-row adapter names) and every step that edits it: the model
forward, the prefill with prompt sharing, the per-step sampling, stop strings, and dropping finished rows; and
:meth:`~mas_train.backends.hf.HFBackend.score`'s batch (``_score_batch``: that prefill, then the given completions
in one forward on its cache).
Prefill sharing, finished-row dropping and per-row adapters all edit that same state, so they stay together in
this one class; sampling itself lives in :mod:`mas_train.backends.hf.sampling`, the fused decode step in
:mod:`mas_train.backends.hf.decode`.

Prompt sharing: GRPO-style rollouts reset the G copies of a task group to the same task, so on the first tick
of every group the G prompts are identical token sequences (``num_generations`` copies of one prompt). Prefill
(the forward pass over the whole prompt) dominates a tick on CPU and costs the same FLOPs batched or not, so
:meth:`~mas_train.backends.hf.HFBackend.generate` runs the prefill forward on the distinct prompts only and then copies each one's KV
cache rows and last-position logits to every row that asked for it (``Cache.batch_select_indices`` with
repeated indices, the mechanism that also drops finished rows). Later turns of a group differ (each holds its
own trajectory's replies) but still share the system prompt and task text: when the distinct prompts of a batch
have a common prefix long enough to pay for one more forward, that prefix is prefilled once, its cache copied to
every distinct prompt, and only the suffixes are run. This is the batch-wide case of SGLang's radix (prefix)
cache; prefixes shared by only some prompts of a batch are not shared. Sampling is untouched: each row
keeps its own generator, temperature, truncation and stop strings, so a seeded row gives the same completion
(and logprobs up to float rounding) as when it is generated alone. A model whose cache cannot select rows
(e.g. some linear-attention caches) falls back to prefilling every row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from mas_train.backends.base import GenerationOutput, SamplingParams
from mas_train.backends.hf.decode import FusedDecoder
from mas_train.backends.hf.kernels import PackedLinears, preallocated_cache
from mas_train.backends.hf.sampling import sample_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["DecodeLoop"]

# A shared prompt prefix is prefilled once when that saves at least this many prefill tokens: below it the extra
# forward (one more pass over the weights) costs about as much as it saves.
_MIN_SHARED_TOKENS = 64


class DecodeLoop:
    """Prefill and decode of one batch; the base of :class:`~mas_train.backends.hf.HFBackend`, which sets the
    attributes below in its constructor (the loop reads them and keeps ``_share_prefill`` / ``_reserve``).

    Attributes:
        device: where the model generates.
        tokenizer: decodes a row's last tokens to detect stop strings.
        pad_token_id: the id left padding and finished rows carry.
        eos_token_ids: ids that end a row.
    """

    device: torch.device
    tokenizer: PreTrainedTokenizerBase
    pad_token_id: int
    eos_token_ids: frozenset[int]
    # the generation model, and how its forward is called (set from its signature)
    _model: PreTrainedModel
    _cache_kw: str
    _keep_last_logits: bool
    # False for good once the model's cache cannot select batch rows: every row is then prefilled
    _share_prefill: bool
    # KV positions a new cache leaves free: the current batch's decode steps
    _reserve: int
    _packed: PackedLinears | None
    # None: the fused step per batch where it applies; True: required; False: the model's forward
    _fused_decode: bool | None

    def _forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        cache: Any,
        adapters: list[str] | None = None,
    ) -> tuple:
        if cache is None:  # None: the model builds its own (e.g. sliding-window or linear-attention layers)
            cache = preallocated_cache(self._model.config, self._reserve)
        kwargs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": pos,
            self._cache_kw: cache,
            "use_cache": True,  # needed even when gradient checkpointing switched config.use_cache off
        }
        if self._keep_last_logits:
            kwargs["logits_to_keep"] = 1  # prefill would otherwise materialise B x L x vocab logits
        if adapters is not None:
            kwargs["adapter_names"] = adapters  # PEFT: row i runs with LoRA adapter adapters[i]
        out = self._model(**kwargs)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        return out.logits[:, -1, :].float(), new_cache

    def _prefill(
        self,
        prompts: list[list[int]],
        ids: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        adapters: list[str] | None = None,
    ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """First forward of a batch: last-position logits (B, V) fp32, the KV cache for all B rows, and the
        (B, W) attention mask and (B, W) positions of the cache's columns (the decode loop extends both).

        Runs the model on the distinct prompts only and expands the cache and logits to all rows by index.
        Left padding is to the longest prompt, which is among the distinct ones, so every row's padded ids,
        mask and positions are exactly those it would have had in a full prefill. When the distinct prompts
        also share a long common prefix (a task group's later turns: same system prompt and task, different
        replies), that prefix is prefilled once and only the suffixes are run per prompt (see
        :meth:`_prefill_shared_prefix`).

        With per-row ``adapters`` a prompt is "distinct" per (adapter, prompt): the same tokens under two
        adapters have different keys and values. The common prefix is shared only when every row uses one
        adapter.
        """
        tags = adapters if adapters is not None else [""] * len(prompts)
        unique: dict[tuple[str, tuple[int, ...]], int] = {}
        inverse = [unique.setdefault((a, tuple(p)), len(unique)) for a, p in zip(tags, prompts, strict=True)]
        if not self._share_prefill:
            return (*self._forward(ids, mask, pos, None, adapters), mask, pos)
        distinct = [list(p) for _, p in unique]
        one_adapter = len(set(tags)) == 1
        shared = (
            self._prefill_shared_prefix(distinct, adapters[0] if adapters else None) if one_adapter else None
        )
        if shared is None and len(unique) == len(prompts):
            return (*self._forward(ids, mask, pos, None, adapters), mask, pos)
        if shared is None:
            first_rows = [inverse.index(u) for u in range(len(unique))]
            firsts = torch.tensor(first_rows, dtype=torch.long, device=ids.device)
            sub = [adapters[i] for i in first_rows] if adapters is not None else None
            logits, cache = self._forward(ids[firsts], mask[firsts], pos[firsts], None, sub)
        else:
            logits, cache, mask, pos = shared
            if len(unique) == len(prompts):
                return logits, cache, mask, pos
        expand = torch.tensor(inverse, dtype=torch.long, device=ids.device)
        try:
            # repeated indices copy a distinct prompt's keys/values into each row that shares it
            cache.batch_select_indices(expand)
        except (AttributeError, NotImplementedError):
            self._share_prefill = False
            return (*self._forward(ids, mask, pos, None, adapters), mask, pos)
        if shared is None:
            return logits[expand], cache, mask, pos
        return logits[expand], cache, mask[expand], pos[expand]

    def _prefill_shared_prefix(self, distinct: list[list[int]], adapter: str | None = None) -> tuple | None:
        """Prefill the distinct prompts' longest common prefix once, then their suffixes together.

        Returns ``(logits (D, V), cache, mask (D, P + S), pos (D, P + S))`` for the D distinct prompts, or
        ``None`` when sharing does not pay: fewer than two prompts, or a prefix saving fewer than
        ``_MIN_SHARED_TOKENS`` prefill tokens. Layout: ``[prefix | left-padded suffix]``, so the pad columns sit
        between prefix and suffix with mask 0 and every row's suffix continues the prefix's positions; each row
        attends to exactly its own prompt's tokens at their own positions, as in a full prefill (the logits
        agree up to float rounding of the differently shaped matmuls). ``adapter``: the one LoRA adapter every
        row uses (passed per row), or ``None``.
        """
        if len(distinct) < 2:
            return None
        shortest = min(len(p) for p in distinct)
        lcp = 0
        first = distinct[0]
        while lcp < shortest - 1 and all(p[lcp] == first[lcp] for p in distinct):
            lcp += 1  # at least one suffix token per row, so every row gets its last-position logits
        if lcp * (len(distinct) - 1) < _MIN_SHARED_TOKENS:
            return None
        dev = self.device
        pre_ids = torch.tensor([first[:lcp]], dtype=torch.long, device=dev)
        pre_mask = torch.ones_like(pre_ids)
        pre_pos = torch.arange(lcp, device=dev)[None, :]
        _, cache = self._forward(pre_ids, pre_mask, pre_pos, None, None if adapter is None else [adapter])
        d = len(distinct)
        try:
            cache.batch_select_indices(torch.zeros(d, dtype=torch.long, device=dev))
        except (AttributeError, NotImplementedError):
            self._share_prefill = False
            return None
        s = max(len(p) for p in distinct) - lcp
        suf_ids = torch.full((d, s), self.pad_token_id, dtype=torch.long, device=dev)
        suf_mask = torch.zeros((d, s), dtype=torch.long, device=dev)
        for i, p in enumerate(distinct):
            n = len(p) - lcp
            suf_ids[i, s - n :] = torch.tensor(p[lcp:], dtype=torch.long, device=dev)
            suf_mask[i, s - n :] = 1
        mask = torch.cat([pre_mask.expand(d, lcp), suf_mask], dim=1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(
            suf_ids, mask, pos[:, lcp:], cache, None if adapter is None else [adapter] * d
        )
        return logits, cache, mask, pos

    def _score_batch(self, prompts: list[list[int]], comps: list[list[int]]) -> list[list[float]]:
        """:meth:`score` of one batch (non-empty completions): the prefill's last logits score each first
        completion token, one forward of the right-padded rest on the prefill's cache scores the others."""
        dev = self.device
        b, width, keep = len(prompts), max(map(len, prompts)), max(map(len, comps))
        ids = torch.full((b, width), self.pad_token_id, dtype=torch.long, device=dev)
        mask = torch.zeros((b, width), dtype=torch.long, device=dev)
        for r, p in enumerate(prompts):
            ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long, device=dev)
            mask[r, width - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        self._reserve = keep
        logits, cache, mask, pos = self._prefill(prompts, ids, mask, pos)
        logps = [torch.log_softmax(logits, dim=-1)[:, None, :]]  # (B, 1, V): predicts each first token
        if keep > 1:
            rest = torch.full((b, keep - 1), self.pad_token_id, dtype=torch.long, device=dev)
            rest_mask = torch.zeros((b, keep - 1), dtype=torch.long, device=dev)
            for r, c in enumerate(comps):  # right padding: a pad column follows a row's last token only
                rest[r, : len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long, device=dev)
                rest_mask[r, : len(c) - 1] = 1
            step_pos = pos[:, -1:] + 1 + torch.arange(keep - 1, device=dev)[None, :]
            got = self._model(
                input_ids=rest,
                attention_mask=torch.cat([mask, rest_mask], dim=1),
                position_ids=step_pos,
                use_cache=True,
                **{self._cache_kw: cache},
            )
            logps.append(torch.log_softmax(got.logits.float(), dim=-1))  # (B, keep - 1, V)
        table = torch.cat(logps, dim=1)
        return [
            table[r, : len(c)].gather(1, torch.tensor(c, device=dev)[:, None])[:, 0].tolist()
            for r, c in enumerate(comps)
        ]

    def _stop_match(self, ids: list[int], stops: tuple[str, ...], window: int) -> str | None:
        # Each token decodes to >= 1 character, so a stop string completed by the newest token lies within the
        # last len(stop) tokens; decoding a small tail keeps this O(1) per step. Earlier steps found no match,
        # so any match here was completed by the newest token.
        tail = self.tokenizer.decode(ids[-window:], skip_special_tokens=False)
        hits = [s for s in stops if s in tail]
        if not hits:
            return None
        return min(hits, key=lambda s: tail.index(s))

    def _generate_batch(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        seeds: list[int],
        version: int,
        adapters: list[str] | None = None,
    ) -> list[GenerationOutput]:
        dev = self.device
        b, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((b, width), self.pad_token_id, dtype=torch.long, device=dev)
        mask = torch.zeros((b, width), dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long, device=dev)
            mask[i, width - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: each row's positions start at 0

        temps = torch.tensor([sp.temperature for sp in params], dtype=torch.float32, device=dev)
        greedy = temps == 0
        scale = torch.where(greedy, torch.ones_like(temps), temps)[:, None]
        top_k = torch.tensor([sp.top_k if sp.top_k > 0 else 0 for sp in params], device=dev)
        top_p = torch.tensor([sp.top_p for sp in params], dtype=torch.float32, device=dev)
        truncate = bool((~greedy & ((top_k > 0) | (top_p < 1))).any())
        gens = [torch.Generator(device=dev).manual_seed(s) for s in seeds]
        windows = [max((len(s) for s in sp.stop), default=0) + 2 for sp in params]

        out_ids: list[list[int]] = [[] for _ in range(b)]
        out_lps: list[list[float]] = [[] for _ in range(b)]
        finish: list[str | None] = [None] * b
        stop_hit: list[str | None] = [None] * b
        rows = list(range(b))  # batch position -> request index; finished rows leave the batch
        eos = self.eos_token_ids
        # The attention mask of every later step is a prefix of one preallocated buffer (no per-step cat), and
        # so are the KV cache's keys and values (PreallocatedLayer).
        steps = max(sp.max_new_tokens for sp in params)
        self._reserve = steps
        logits, cache, mask, pos = self._prefill(prompts, ids, mask, pos, adapters)
        cols = mask.shape[1]
        mask_buf = torch.ones((b, cols + steps), dtype=mask.dtype, device=dev)
        mask_buf[:, :cols] = mask
        pos = pos[:, -1:]
        can_drop = hasattr(cache, "batch_select_indices")
        fused = (
            FusedDecoder.build(self._model, cache, adapters, self._packed is not None)
            if self._fused_decode is not False
            else None
        )
        if fused is None and self._fused_decode:
            raise RuntimeError(
                "fused_decode=True, but this batch cannot run the fused step (an adapter that is not vanilla "
                "LoRA, a module with forward hooks, or a KV cache of other layer types); use fused_decode=None"
            )
        unit_scale = bool((scale == 1).all())  # temperature 1 (or greedy) everywhere: no division per step
        for _ in range(steps):
            scaled = logits if unit_scale else logits / scale
            logps = torch.log_softmax(scaled, dim=-1)
            draws = torch.stack([torch.rand((), generator=gens[i], device=dev) for i in rows])
            # finished rows ride along only in a cache that cannot drop rows
            live = None if can_drop else torch.tensor([finish[i] is None for i in rows], device=dev)
            sampled = sample_tokens(scaled, logps, draws, top_k, top_p, greedy, truncate, live)
            sampled_lps = logps.gather(1, sampled[:, None])[:, 0].tolist()
            sampled = sampled.tolist()
            next_ids = []
            keep = []
            for j, i in enumerate(rows):
                if finish[i] is not None:
                    next_ids.append(self.pad_token_id)
                    continue
                tok = sampled[j]
                out_ids[i].append(tok)
                out_lps[i].append(sampled_lps[j])
                next_ids.append(tok)
                if tok in eos:
                    finish[i] = "stop"
                elif params[i].stop and (hit := self._stop_match(out_ids[i], params[i].stop, windows[i])):
                    finish[i], stop_hit[i] = "stop", hit
                elif len(out_ids[i]) >= params[i].max_new_tokens:
                    finish[i] = "length"
                else:
                    keep.append(j)
            if not keep:
                break
            ids = torch.tensor(next_ids, dtype=torch.long, device=dev)[:, None]
            cols += 1
            pos = pos + 1
            if len(keep) < len(rows) and can_drop:
                # Drop finished rows (KV cache included): in RL rollouts rows stop at very different lengths.
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                if fused is not None:
                    fused.select(sel)
                ids, pos, mask_buf = ids[sel], pos[sel], mask_buf[sel]
                scale, top_k, top_p, greedy = scale[sel], top_k[sel], top_p[sel], greedy[sel]
                rows = [rows[j] for j in keep]
            live_adapters = None if adapters is None else [adapters[i] for i in rows]
            if fused is not None:
                logits = fused(ids, mask_buf[:, :cols], pos)
            else:
                logits, cache = self._forward(ids, mask_buf[:, :cols], pos, cache, live_adapters)
        return [
            GenerationOutput(
                completion_ids=out_ids[i],
                logprobs=out_lps[i],
                finish_reason=finish[i],  # type: ignore[arg-type]
                weight_version=version,
                stop_string=stop_hit[i],
                meta={"seed": seeds[i]},
            )
            for i in range(b)
        ]

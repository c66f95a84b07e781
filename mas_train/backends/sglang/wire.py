"""SGLang wire mapping shared by the engine and HTTP backends: our :class:`SamplingParams` to SGLang's
``sampling_params`` and one SGLang answer to a :class:`GenerationOutput`. The SGLang 0.5.x shapes relied on are listed in :mod:`mas_train.backends.sglang`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mas_train.backends.base import FinishReason, GenerationOutput, SamplingParams

# the request checks live in mas_train.backends.checks, the checkpoint writers and LoRA sync in
# mas_train.backends.weight_sync (shared with vllm_http); re-exported here under the names the SGLang modules use
from mas_train.backends.checks import earliest_stop as _earliest_stop
from mas_train.backends.weight_sync import write_hf_checkpoint, write_peft_adapter

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = [
    "check_result",
    "parse_sglang_output",
    "parse_sglang_outputs",
    "result_ok",
    "to_sglang_sampling_params",
    "weight_buckets",
    "write_hf_checkpoint",
    "write_peft_adapter",
]

INSTALL_HINT = (
    "SGLang is not installed. Install the GPU extra on a CUDA machine: pip install 'mas-rl[gpu]' "
    "(sglang>=0.5.23), or run `python -m sglang.launch_server` in its own environment and use "
    "backend: sglang_http with backend_options.url."
)


def to_sglang_sampling_params(sampling: SamplingParams) -> dict[str, Any]:
    """Translate our :class:`SamplingParams` into an SGLang ``sampling_params`` dict.

    ``no_stop_trim=True`` keeps the stop string (and EOS) in SGLang's ``text`` so the decoded completion ends
    with e.g. ``</search>``, as the env contract expects; ``skip_special_tokens=False`` keeps special tokens
    visible in that text. ``top_k=0`` (our "off") becomes SGLang's ``-1``.

    Returns:
        A JSON-serialisable dict with SGLang's key names.
    """
    params: dict[str, Any] = {
        "max_new_tokens": int(sampling.max_new_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        params["sampling_seed"] = int(sampling.seed)
    return params


def parse_sglang_outputs(
    outs: Mapping | Sequence[Mapping], samplings: Sequence[SamplingParams], *, weight_version: int, tokenizer
) -> list[GenerationOutput]:
    """Parse one batched SGLang answer (a list of outputs, or one dict for a single prompt), in prompt order.

    Raises:
        RuntimeError: the number of outputs differs from the number of prompts, or one output is malformed.
    """
    if isinstance(outs, Mapping):
        outs = [outs]
    if len(outs) != len(samplings):
        raise RuntimeError(f"SGLang returned {len(outs)} outputs for {len(samplings)} prompts")
    return [
        parse_sglang_output(o, s, weight_version=weight_version, tokenizer=tokenizer)
        for o, s in zip(outs, samplings, strict=True)
    ]


def parse_sglang_output(
    out: Mapping[str, Any],
    sampling: SamplingParams,
    *,
    weight_version: int,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> GenerationOutput:
    """Turn one SGLang ``/generate`` answer into a :class:`GenerationOutput`.

    Args:
        out: ``{"text", "output_ids", "meta_info"}`` as SGLang returns per prompt; ``meta_info`` must hold
            ``output_token_logprobs`` (request it with ``return_logprob=True``) and ``finish_reason``.
        sampling: the parameters the completion was sampled with (for stop strings and the length cap).
        weight_version: the backend's weight version at sampling time; stamped on the output.
        tokenizer: optional; when given, the completion is cut right after the token that first completes a
            stop string even if the server generated further.

    Returns:
        The completion: ids from ``output_token_logprobs`` (EOS kept when sampled), logprobs aligned 1:1,
        ``finish_reason`` ``"stop"`` or ``"length"``, and ``stop_string`` when a stop string ended it.

    Raises:
        RuntimeError: the request was aborted by the server, logprobs are missing, or ``output_ids`` and the
            logprob token ids disagree (a server that does not speak SGLang's format).
    """
    meta = out.get("meta_info")
    if not isinstance(meta, Mapping):
        raise RuntimeError(f"SGLang answer has no meta_info dict; got keys {sorted(out)}")
    finish = meta.get("finish_reason")
    if isinstance(finish, Mapping) and finish.get("type") == "abort":
        raise RuntimeError(f"SGLang aborted the request: {finish.get('message', finish)}")
    triples = meta.get("output_token_logprobs")
    if triples is None:
        raise RuntimeError(
            "SGLang answer has no meta_info.output_token_logprobs; the request must set return_logprob=True"
        )
    ids = [int(t[1]) for t in triples]
    logprobs = [float(t[0]) for t in triples]
    output_ids = out.get("output_ids")
    if output_ids is not None and [int(x) for x in output_ids] != ids:
        raise RuntimeError(
            "SGLang output_ids and output_token_logprobs token ids disagree "
            f"({len(output_ids)} vs {len(ids)} tokens); cannot align logprobs with completion ids"
        )

    finish_reason: FinishReason = "length"
    stop_string: str | None = None
    if isinstance(finish, Mapping) and finish.get("type") == "stop":
        finish_reason = "stop"
        matched = finish.get("matched")
        if isinstance(matched, str) and matched in sampling.stop:
            stop_string = matched
    elif isinstance(finish, Mapping) and finish.get("type") == "length":
        finish_reason = "length"
    elif finish is not None and not isinstance(finish, Mapping):
        raise RuntimeError(f"unexpected SGLang finish_reason {finish!r}; expected a dict with 'type'")

    eos = getattr(tokenizer, "eos_token_id", None)
    if finish_reason == "length" and ids and eos is not None and ids[-1] == eos:
        # SGLang checks the length cap before EOS, so an EOS on the last allowed token reads "length"
        finish_reason = "stop"
    cut = _earliest_stop(ids, sampling.stop, tokenizer)
    if cut is not None:
        i, s = cut
        if i + 1 < len(ids):
            logger.debug(
                "cutting SGLang completion after stop string %r at token %d of %d", s, i + 1, len(ids)
            )
        ids, logprobs = ids[: i + 1], logprobs[: i + 1]
        finish_reason, stop_string = "stop", s
    if len(ids) > sampling.max_new_tokens:
        raise RuntimeError(f"SGLang returned {len(ids)} tokens > max_new_tokens={sampling.max_new_tokens}")
    return GenerationOutput(
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason=finish_reason,
        weight_version=weight_version,
        stop_string=stop_string,
        meta={"text": out.get("text"), "sglang_finish_reason": finish},
    )


def result_ok(result: object) -> tuple[bool, str]:
    """Normalise SGLang's many success conventions: ``(success, message[, n])``, ``{"success": ...}``, an
    output object with ``.success``, a bool, or ``None`` (older calls that return nothing on success)."""
    if result is None:
        return True, ""
    if isinstance(result, bool):
        return result, ""
    if isinstance(result, tuple | list) and result and isinstance(result[0], bool):
        return result[0], str(result[1]) if len(result) > 1 else ""
    # LoRA load/unload answer LoRAUpdateOutput(success, error_message, loaded_adapters) (io_struct.py)
    if isinstance(result, Mapping) and "success" in result:
        return bool(result["success"]), str(result.get("message") or result.get("error_message") or "")
    if hasattr(result, "success"):
        message = getattr(result, "message", None) or getattr(result, "error_message", None) or ""
        return bool(result.success), str(message)
    return True, ""


def check_result(result: object, what: str) -> None:
    ok, message = result_ok(result)
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {message or repr(result)}")


def weight_buckets(
    items: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterable[list[tuple[str, torch.Tensor]]]:
    # Few large buckets: many small ones garbled outputs in sglang#14178 and cost one RPC each.
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in items:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket

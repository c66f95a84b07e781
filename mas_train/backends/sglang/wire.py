"""SGLang wire mapping shared by the engine and HTTP backends: our :class:`SamplingParams` to SGLang's
``sampling_params``, one SGLang answer to a :class:`GenerationOutput`, and the checkpoint folder a disk weight
sync writes. The SGLang 0.5.x shapes relied on are listed in :mod:`mas_train.backends.sglang`.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas_train.backends.base import GenerationOutput, SamplingParams

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = [
    "parse_sglang_output",
    "parse_sglang_outputs",
    "to_sglang_sampling_params",
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


def _earliest_stop(
    completion_ids: Sequence[int], stops: Sequence[str], tokenizer: Any
) -> tuple[int, str] | None:
    """Index ``i`` of the first token after which the decoded completion contains a stop string, and that string.

    Guards against servers that let generation run past a stop string (e.g. one that ends inside a
    multi-character token in an older SGLang). Containing a stop string is monotone in the prefix length, so
    after one full decode (the common no-stop case) a binary search needs O(log T) more decodes.
    """
    if not stops or tokenizer is None or not completion_ids:
        return None

    def hit(n: int) -> list[str]:
        text = tokenizer.decode(list(completion_ids[:n]), skip_special_tokens=False)
        return [s for s in stops if s in text]

    if not hit(len(completion_ids)):
        return None
    lo, hi = 1, len(completion_ids)  # invariant: prefix hi contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    text = tokenizer.decode(list(completion_ids[:hi]), skip_special_tokens=False)
    # several may complete on the same token: report the one that appears first in the text
    return hi - 1, min(hit(hi), key=text.find)


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
    tokenizer: Any = None,
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

    finish_reason = "length"
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


def _per_prompt_sampling(
    prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    if isinstance(sampling, SamplingParams):
        return [sampling] * len(prompt_ids)
    sampling = list(sampling)
    if len(sampling) != len(prompt_ids):
        raise ValueError(
            f"got {len(prompt_ids)} prompts but {len(sampling)} SamplingParams; pass one, or one per prompt"
        )
    return sampling


def _validate_prompts(prompt_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    prompts = [[int(t) for t in p] for p in prompt_ids]
    for k, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {k} is empty; SGLang needs at least one input token")
    return prompts


def _result_ok(result: Any) -> tuple[bool, str]:
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


def _check(result: Any, what: str) -> None:
    ok, message = _result_ok(result)
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {message or repr(result)}")


def _named_tensor_list(
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> list[tuple[str, torch.Tensor]]:
    items = list(named_tensors.items()) if isinstance(named_tensors, Mapping) else list(named_tensors)
    if not items:
        raise ValueError("update_weights got no tensors")
    return items


def write_hf_checkpoint(
    named_tensors: Sequence[tuple[str, torch.Tensor]],
    out_dir: str | os.PathLike,
    *,
    model_config: Any = None,
    source_dir: str | os.PathLike | None = None,
) -> Path:
    """Write ``named_tensors`` as a Hugging Face checkpoint folder SGLang's ``update_weights_from_disk`` loads.

    Weights go to ``model.safetensors`` (tensors are copied to CPU and made contiguous; tied weights become
    two copies, which safetensors requires). The config comes from ``model_config.save_pretrained`` when
    given, else every ``*.json`` is copied from ``source_dir`` (the original model folder).

    Raises:
        ValueError: neither a config object nor a source folder with ``config.json`` is available.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model_config is not None:
        model_config.save_pretrained(out)
    elif source_dir is not None and (Path(source_dir) / "config.json").is_file():
        for f in Path(source_dir).glob("*.json"):
            if not f.name.endswith(".index.json"):  # an old shard index would point at files we do not write
                shutil.copy2(f, out / f.name)
    else:
        raise ValueError(
            "cannot write a checkpoint for update_weights_from_disk without a config: pass model_config= "
            "(e.g. model.config) or a model_path folder that has config.json"
        )
    state = {name: t.detach().to("cpu").contiguous().clone() for name, t in named_tensors}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _buckets(
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


def write_peft_adapter(
    named_tensors: Sequence[tuple[str, torch.Tensor]],
    adapter_name: str,
    lora: Any,
    out_dir: str | os.PathLike,
) -> Path:
    """Write one adapter's tensors as a PEFT adapter folder SGLang's ``load_lora_adapter`` reads.

    The folder is what ``PeftModel.save_pretrained`` writes for that adapter: ``adapter_config.json`` (from
    :func:`mas_train.lora.peft_config`, i.e. ``peft.LoraConfig.save_pretrained``) and
    ``adapter_model.safetensors`` with PEFT's saved names, the PeftModel parameter names without the adapter-name
    segment (``...q_proj.lora_A.<name>.weight`` -> ``...q_proj.lora_A.weight``).

    Args:
        named_tensors: ``(name, tensor)`` pairs under PeftModel names (:func:`mas_train.lora.adapter_state`).
        adapter_name: the PEFT adapter name in those names (the model group's name).
        lora: the group's :class:`mas_train.config.LoraConfig`.
        out_dir: folder to write (created; files in it are replaced).

    Raises:
        ValueError: a tensor that is not one of adapter ``adapter_name``'s (e.g. a base weight): a LoRA sync
            never pushes base weights.
    """
    from safetensors.torch import save_file

    from mas_train.lora import is_adapter_param, peft_config

    segment = f".{adapter_name}."
    state: dict[str, Any] = {}
    for name, t in named_tensors:
        if not is_adapter_param(name, adapter_name):
            raise ValueError(
                f"LoRA weight sync of adapter {adapter_name!r} got {name!r}, which is not one of its tensors; "
                "a LoRA group pushes only its adapter (mas_train.lora.adapter_state)"
            )
        head, _, tail = name.rpartition(segment)
        state[f"{head}.{tail}"] = t.detach().to("cpu").contiguous().clone()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_config(lora).save_pretrained(str(out))
    save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out


class _LoRASync:
    """Adapter-only weight sync shared by both SGLang backends of a LoRA model group.

    SGLang has no in-place update of a loaded adapter from a folder: ``load_lora_adapter`` refuses a name that
    is loaded ("... because it is already loaded", ``srt/lora/lora_manager.py::validate_new_adapter``), so a
    new version is ``unload_lora_adapter(lora_name)`` then ``load_lora_adapter(lora_name, lora_path)`` of a
    freshly written PEFT folder. Subclasses set ``lora_name``, ``lora`` and ``adapter_root`` and implement
    ``_load_lora`` / ``_unload_lora`` with the transport's call.
    """

    lora_name: str | None = None
    lora: Any = None
    adapter_root: Path
    adapter_path: Path | None = None

    def _load_lora(self, name: str, path: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _unload_lora(self, name: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _lora_request_field(self, n: int) -> dict[str, Any]:
        """``{"lora_path": [name] * n}`` (GenerateReqInput.lora_path: adapter *names*, one per prompt) or ``{}``."""
        if self.lora_name is None:
            return {}
        if self.adapter_path is None:
            raise RuntimeError(
                f"LoRA adapter {self.lora_name!r} is not loaded into SGLang yet: call load_adapter() or "
                "update_weights() with the adapter's tensors first"
            )
        return {"lora_path": [self.lora_name] * n}

    def _push_adapter(self, items: Sequence[tuple[str, torch.Tensor]], version: int) -> Path:
        """Write ``items`` to ``adapter_root/<name>-v<version>`` and make it the served version of the adapter:
        unload the old one (if loaded), load the new one; on a failed load the old version is loaded back."""
        target = self.adapter_root / f"{self.lora_name}-v{version}"
        write_peft_adapter(items, self.lora_name, self.lora, target)
        previous = self.adapter_path
        if previous is not None:
            self._unload_lora(self.lora_name)
        try:
            self._load_lora(self.lora_name, str(target))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            if previous is not None:
                try:  # keep serving the last good version rather than none
                    self._load_lora(self.lora_name, str(previous))
                except Exception:  # noqa: BLE001 - the original error is the one to report
                    self.adapter_path = None
                    logger.error("could not load LoRA adapter %s back after a failed sync", previous)
            raise
        if previous is not None and previous != target:
            shutil.rmtree(previous, ignore_errors=True)
        self.adapter_path = target
        return target

    def load_adapter(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> Path:
        """Load the group's adapter as it is now (at start-up, before any update) without bumping
        ``weight_version``; returns the PEFT folder SGLang loaded.

        Raises:
            RuntimeError: this backend serves no adapter, or SGLang refused the load (its message included).
            ValueError: a tensor that is not the adapter's.
        """
        if self.lora_name is None:
            raise RuntimeError("this SGLang backend serves no LoRA adapter (no lora_name)")
        return self._push_adapter(_named_tensor_list(named_tensors), int(getattr(self, "weight_version", 0)))

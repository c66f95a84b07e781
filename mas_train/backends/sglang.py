"""SGLang generation backends: an in-process ``sglang.Engine`` and a ``sglang.launch_server`` HTTP server.

Both implement :class:`~mas_train.backends.base.GenerationBackend` with token ids in and token ids out:
prompts go to SGLang as ``input_ids`` and the completion is read back from
``meta_info["output_token_logprobs"]``, so the ids the trainer trains on are exactly the ids SGLang sampled.
Nothing here imports ``sglang`` at module import time: :class:`SGLangEngineBackend` imports it when it builds
an engine itself (install the ``gpu`` extra, ``pip install 'mas-rl[gpu]'``), and :class:`SGLangHTTPBackend`
needs only ``httpx``, so SGLang and its pinned CUDA stack can live in a separate environment.

SGLang 0.5.x wire shapes this module relies on (read in the SGLang sources and docs; nothing here was run
against a real SGLang, see ``docs/scaling.md``):

* ``/generate`` and ``Engine.generate`` take ``input_ids`` (``list[list[int]]`` for a batch),
  ``sampling_params`` (one dict or one per prompt) and ``return_logprob``
  (``python/sglang/srt/managers/io_struct.py::GenerateReqInput``, ``docs/basic_usage/sampling_params.md``).
  Sampling keys used: ``max_new_tokens``, ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (-1 = off),
  ``stop``, ``no_stop_trim``, ``skip_special_tokens``, ``sampling_seed``.
* A batch answers one dict per prompt: ``{"text", "output_ids", "meta_info"}``;
  ``meta_info["output_token_logprobs"]`` is a list of ``[logprob, token_id, text_or_None]`` triples, one per
  generated token, and ``meta_info["finish_reason"]`` is ``{"type": "stop", "matched": <eos id | stop str>}``,
  ``{"type": "length", "length": n}`` or ``{"type": "abort", "message": ...}``
  (``srt/managers/schedule_batch.py::FINISH_MATCHED_TOKEN / FINISH_MATCHED_STR / FINISH_LENGTH``).
* ``Engine.update_weights_from_tensor(named_tensors, load_format=None, flush_cache=True)`` returns
  ``(success, message)``; since SGLang 0.5.23 it only succeeds inside
  ``begin_weight_update()`` / ``end_weight_update()`` (``scheduler_components/weight_updater.py``: "requires an
  open begin_weight_update session"), and the tensors must be CUDA tensors (sglang#4551).
* ``Engine.update_weights_from_disk(model_path, load_format=None)`` returns
  ``(success, message, num_paused_requests)``; ``POST /update_weights_from_disk`` answers
  ``{"success", "message", "num_paused_requests"}`` with status 200, or 400 on failure
  (``srt/entrypoints/http_server.py``).
* ``flush_cache`` (``GET|POST /flush_cache``: 200, or 400 while requests are running),
  ``release_memory_occupation(tags=None)`` / ``resume_memory_occupation(tags=None)`` (need
  ``enable_memory_saver`` and an idle engine), ``GET /health`` (200 once the server is up).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas_train.backends.base import GenerationOutput, SamplingParams

if TYPE_CHECKING:
    import httpx
    import torch

logger = logging.getLogger(__name__)

__all__ = [
    "SGLANG_BACKEND_KWARGS",
    "SGLangEngineBackend",
    "SGLangHTTPBackend",
    "make_sglang_backend",
    "parse_sglang_output",
    "to_sglang_sampling_params",
]

_INSTALL_HINT = (
    "SGLang is not installed. Install the GPU extra on a CUDA machine: pip install 'mas-rl[gpu]' "
    "(sglang>=0.5.23), or run `python -m sglang.launch_server` in its own environment and use "
    "backend: sglang_http with backend_kwargs.url."
)


# ----------------------------------------------------------------------------------------------------------
# Request / response mapping shared by both backends
# ----------------------------------------------------------------------------------------------------------


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
    if isinstance(result, Mapping) and "success" in result:
        return bool(result["success"]), str(result.get("message", ""))
    if hasattr(result, "success"):
        return bool(result.success), str(getattr(result, "message", ""))
    return True, ""


def _check(result: Any, what: str) -> None:
    ok, message = _result_ok(result)
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {message or result!r}")


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


# ----------------------------------------------------------------------------------------------------------
# In-process engine
# ----------------------------------------------------------------------------------------------------------


class SGLangEngineBackend:
    """Generation through an in-process ``sglang.Engine`` (one per model group).

    Args:
        model_path: Hugging Face model folder or hub id the engine serves (also the config source for the
            disk fallback of :meth:`update_weights`).
        tokenizer: the model group's tokenizer; used to cut completions at stop strings defensively.
        engine: an existing engine object (or a test double with the same methods); when ``None`` one is
            built with ``sglang.Engine(...)`` from the arguments below.
        mem_fraction_static: fraction of GPU memory SGLang reserves for weights + KV cache (e.g. ``0.35`` so
            that two engines and the trainers share one GPU; see ``docs/scaling.md``).
        tp_size: tensor-parallel size of the engine.
        base_gpu_id: first GPU index the engine uses (``gpu_ids[0]`` of the model group).
        random_seed: the engine's sampling seed.
        enable_memory_saver: build with ``torch_memory_saver`` so :meth:`sleep` can release weights and KV
            cache while the trainer updates on the same GPU (colocated mode). Without it sleep/wake are no-ops.
        weight_sync: ``"tensor"`` (CUDA-IPC ``update_weights_from_tensor``, trainer on the same node),
            ``"disk"`` (write a safetensors folder and ``update_weights_from_disk``) or ``"auto"`` (tensor when
            the engine has it and CUDA is available, else disk).
        model_config: a ``transformers`` config used to write the disk checkpoint (default: copy the JSON
            files of ``model_path``).
        bucket_bytes: upper bound of one ``update_weights_from_tensor`` call's payload.
        tensor_device: device tensors are moved to before ``update_weights_from_tensor`` (SGLang needs CUDA
            tensors); default ``"cuda"`` when available, else tensors are passed as they are.
        engine_kwargs: any further ``sglang.ServerArgs`` fields.

    ``weight_version`` starts at 0 and increases by one per successful :meth:`update_weights`; every output
    carries the version it was sampled with.
    """

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        tokenizer: Any = None,
        engine: Any = None,
        mem_fraction_static: float | None = None,
        tp_size: int = 1,
        base_gpu_id: int = 0,
        random_seed: int | None = None,
        enable_memory_saver: bool = False,
        weight_sync: str = "auto",
        model_config: Any = None,
        bucket_bytes: int = 512 * 1024**2,
        tensor_device: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if weight_sync not in ("auto", "tensor", "disk"):
            raise ValueError(f"weight_sync must be 'auto', 'tensor' or 'disk', got {weight_sync!r}")
        if mem_fraction_static is not None and not 0 < mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
        if tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {tp_size}")
        self.model_path = None if model_path is None else str(model_path)
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.bucket_bytes = int(bucket_bytes)
        self.enable_memory_saver = bool(enable_memory_saver)
        self.weight_version = 0
        self._asleep = False
        self._closed = False
        self._owns_engine = engine is None
        if engine is None:
            if self.model_path is None:
                raise ValueError("SGLangEngineBackend needs model_path= (or an engine= object)")
            kwargs: dict[str, Any] = {
                "model_path": self.model_path,
                "tp_size": int(tp_size),
                "base_gpu_id": int(base_gpu_id),
                "enable_memory_saver": self.enable_memory_saver,
            }
            if mem_fraction_static is not None:
                kwargs["mem_fraction_static"] = float(mem_fraction_static)
            if random_seed is not None:
                kwargs["random_seed"] = int(random_seed)
            kwargs.update(engine_kwargs or {})
            try:
                import sglang
            except ImportError as e:
                raise ImportError(_INSTALL_HINT) from e
            engine = sglang.Engine(**kwargs)
        self.engine = engine

        cuda = _cuda_available()
        if weight_sync == "auto":
            weight_sync = "tensor" if hasattr(engine, "update_weights_from_tensor") and cuda else "disk"
        self.weight_sync = weight_sync
        self.tensor_device = tensor_device if tensor_device is not None else ("cuda" if cuda else None)
        # sglang >= 0.5.23 refuses tensor updates outside a begin/end session; older versions lack the calls
        self.has_update_session = hasattr(engine, "begin_weight_update") and hasattr(
            engine, "end_weight_update"
        )

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        """Sample one completion per prompt with ``engine.generate(input_ids=..., return_logprob=True)``.

        Raises:
            RuntimeError: the backend is asleep or closed, or SGLang's answer is malformed or aborted.
            ValueError: an empty prompt, or a sampling list of the wrong length.
        """
        self._check_usable()
        prompts = _validate_prompts(prompt_ids)
        samplings = _per_prompt_sampling(prompts, sampling)
        if not prompts:
            return []
        version = self.weight_version
        outs = self.engine.generate(
            input_ids=prompts,
            sampling_params=[to_sglang_sampling_params(s) for s in samplings],
            return_logprob=True,
        )
        return parse_sglang_outputs(outs, samplings, weight_version=version, tokenizer=self.tokenizer)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Load new policy weights into the engine, flush its prefix cache, and bump ``weight_version``.

        Tensor path: ``begin_weight_update()`` (when the engine has it), ``update_weights_from_tensor`` per
        bucket with ``flush_cache=False``, ``end_weight_update()``, then one ``flush_cache()``. Disk path:
        write a safetensors checkpoint to a temporary folder and ``update_weights_from_disk`` it.

        Returns:
            The new ``weight_version``.

        Raises:
            RuntimeError: SGLang reported ``success=False`` for any call (the message is included), or the
                backend is asleep/closed. The version is not bumped then.
        """
        self._check_usable()
        items = _named_tensor_list(named_tensors)
        if self.weight_sync == "tensor":
            self._update_from_tensor(items)
        else:
            self._update_from_disk(items)
        self._flush_cache()
        self.weight_version += 1
        return self.weight_version

    def _update_from_tensor(self, items: list[tuple[str, torch.Tensor]]) -> None:
        if self.has_update_session:
            _check(self.engine.begin_weight_update(), "begin_weight_update")
        try:
            for bucket in _buckets(items, self.bucket_bytes):
                if self.tensor_device is not None:
                    bucket = [(n, t.detach().to(self.tensor_device)) for n, t in bucket]
                _check(
                    self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False),
                    "update_weights_from_tensor",
                )
        finally:
            if self.has_update_session:
                _check(self.engine.end_weight_update(), "end_weight_update")

    def _update_from_disk(self, items: list[tuple[str, torch.Tensor]]) -> None:
        with tempfile.TemporaryDirectory(prefix="mas_sglang_weights_") as tmp:
            write_hf_checkpoint(items, tmp, model_config=self.model_config, source_dir=self.model_path)
            _check(self.engine.update_weights_from_disk(model_path=tmp), "update_weights_from_disk")

    def _flush_cache(self) -> None:
        # flush_cache refuses while requests are in flight; generate() is synchronous, so retry only briefly
        for attempt in range(3):
            ok, message = _result_ok(self.engine.flush_cache())
            if ok:
                return
            time.sleep(0.1 * (attempt + 1))
        raise RuntimeError(f"SGLang flush_cache failed after a weight update: {message}")

    def sleep(self) -> None:
        """Release weights and KV cache (``release_memory_occupation``); a no-op without the memory saver."""
        if self._closed or self._asleep or not self.enable_memory_saver:
            return
        _check(self.engine.release_memory_occupation(), "release_memory_occupation")
        self._asleep = True

    def wake(self) -> None:
        """Re-occupy the memory released by :meth:`sleep` (``resume_memory_occupation``)."""
        if self._closed or not self._asleep:
            return
        _check(self.engine.resume_memory_occupation(), "resume_memory_occupation")
        self._asleep = False

    def close(self) -> None:
        """Shut the engine down (only if this backend built it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_engine and hasattr(self.engine, "shutdown"):
            self.engine.shutdown()

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this SGLang backend is closed")
        if self._asleep:
            raise RuntimeError("this SGLang backend is asleep (memory released); call wake() first")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# ----------------------------------------------------------------------------------------------------------
# HTTP server
# ----------------------------------------------------------------------------------------------------------


class SGLangHTTPBackend:
    """Generation through an SGLang HTTP server (``python -m sglang.launch_server``), with only ``httpx`` here.

    Args:
        url: server base URL, e.g. ``http://127.0.0.1:30000``.
        tokenizer: the model group's tokenizer; used to cut completions at stop strings defensively.
        client: an ``httpx.Client`` to use (tests pass a ``fastapi.testclient.TestClient``); default: a new
            client for ``url``.
        timeout: seconds to wait for one request (generation and weight loading can take minutes).
        connect_retries: attempts when the server cannot be reached (connection refused / reset before the
            request was sent); requests that reached the server are never repeated.
        retry_backoff: seconds before the first retry, doubling after each.
        weight_dir: folder the server can read (same machine or shared filesystem) where
            :meth:`update_weights` writes the checkpoint it asks the server to load; default a temp folder.
        model_config / model_path: config source for that checkpoint (see :func:`write_hf_checkpoint`).
        memory_saver: the server was started with ``--enable-memory-saver``; otherwise sleep/wake are no-ops.
        process: a ``subprocess.Popen`` of a server this backend owns; :meth:`close` terminates it.

    Weights are synced through disk (``/update_weights_from_disk``): ``update_weights_from_tensor`` passes
    CUDA IPC handles, which only work for a server on the same GPU node as the trainer.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:30000",
        *,
        tokenizer: Any = None,
        client: httpx.Client | None = None,
        timeout: float = 600.0,
        connect_retries: int = 5,
        retry_backoff: float = 0.5,
        weight_dir: str | os.PathLike | None = None,
        model_config: Any = None,
        model_path: str | os.PathLike | None = None,
        memory_saver: bool = False,
        process: subprocess.Popen | None = None,
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.timeout = float(timeout)
        self.connect_retries = max(1, int(connect_retries))
        self.retry_backoff = float(retry_backoff)
        self.model_config = model_config
        self.model_path = None if model_path is None else str(model_path)
        self.memory_saver = bool(memory_saver)
        self.weight_version = 0
        self._owns_client = client is None
        self.client = client if client is not None else httpx.Client(base_url=self.url, timeout=self.timeout)
        self._process = process
        self._tmp_weight_dir: tempfile.TemporaryDirectory | None = None
        if weight_dir is None:
            self._tmp_weight_dir = tempfile.TemporaryDirectory(prefix="mas_sglang_http_weights_")
            weight_dir = self._tmp_weight_dir.name
        self.weight_dir = Path(weight_dir)
        self._asleep = False
        self._closed = False

    # -- server lifecycle --------------------------------------------------------------------------------

    @classmethod
    def launch(
        cls,
        model_path: str | os.PathLike,
        *,
        port: int = 30000,
        host: str = "127.0.0.1",
        mem_fraction_static: float | None = None,
        tp_size: int = 1,
        base_gpu_id: int = 0,
        random_seed: int | None = None,
        memory_saver: bool = False,
        extra_args: Sequence[str] = (),
        server_module: str = "sglang.launch_server",
        startup_timeout: float = 900.0,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> SGLangHTTPBackend:
        """Start ``python -m sglang.launch_server`` on ``host:port``, wait for ``/health``, return a backend
        that owns (and on :meth:`close` terminates) the server process.

        Raises:
            TimeoutError: the server did not answer ``/health`` within ``startup_timeout`` seconds.
            RuntimeError: the server process exited during start-up (its exit code is in the message).
        """
        cmd = [sys.executable, "-m", server_module, "--model-path", str(model_path)]
        cmd += ["--host", host, "--port", str(port), "--tp-size", str(tp_size)]
        cmd += ["--base-gpu-id", str(base_gpu_id)]
        if mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(mem_fraction_static)]
        if random_seed is not None:
            cmd += ["--random-seed", str(random_seed)]
        if memory_saver:
            cmd += ["--enable-memory-saver"]
        cmd += list(extra_args)
        proc_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(cmd, env=proc_env)  # noqa: S603 - the command is built from typed arguments
        backend = cls(
            f"http://{host}:{port}",
            memory_saver=memory_saver,
            model_path=model_path,
            process=proc,
            **kwargs,
        )
        try:
            backend.wait_until_healthy(startup_timeout)
        except BaseException:
            backend.close()
            raise
        return backend

    def wait_until_healthy(self, timeout: float = 300.0, poll: float = 0.5) -> None:
        """Poll ``GET /health`` until it answers 200.

        Raises:
            TimeoutError: no healthy answer within ``timeout`` seconds.
            RuntimeError: the owned server process exited meanwhile.
        """
        import httpx

        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"SGLang server process exited with code {self._process.returncode} during start-up; "
                    "see its log above"
                )
            try:
                r = self.client.get("/health")
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(poll)
        raise TimeoutError(f"SGLang server at {self.url} not healthy after {timeout:.0f}s (last: {last})")

    # -- HTTP plumbing -----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, payload: Any = None) -> httpx.Response:
        import httpx

        delay = self.retry_backoff
        for attempt in range(1, self.connect_retries + 1):
            try:
                # the timeout lives on the client (set from `timeout` when this backend creates it)
                return self.client.request(method, path, json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                # the request never reached the server, so repeating it cannot double-apply anything
                if attempt == self.connect_retries:
                    raise ConnectionError(
                        f"cannot reach the SGLang server at {self.url}{path} after {attempt} attempts "
                        f"({type(e).__name__}: {e}); is `python -m sglang.launch_server --port ...` running?"
                    ) from e
                logger.warning(
                    "SGLang %s%s unreachable (%s); retry %d in %.1fs", self.url, path, e, attempt, delay
                )
                time.sleep(delay)
                delay *= 2
            except httpx.TimeoutException as e:
                raise TimeoutError(
                    f"SGLang {method} {self.url}{path} did not answer within {self.timeout:.0f}s; raise "
                    "backend_kwargs.timeout for long generations"
                ) from e
        raise AssertionError("unreachable")

    def _post_ok(self, path: str, payload: Any, what: str) -> httpx.Response:
        r = self._request("POST", path, payload)
        if r.status_code >= 400:
            raise RuntimeError(f"SGLang {what} failed: HTTP {r.status_code} from {path}: {r.text[:2000]}")
        try:
            body = r.json() if r.content else None
        except ValueError:
            body = None
        _check(body, what)
        return r

    # -- GenerationBackend -------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        """Sample one completion per prompt with one batched ``POST /generate``.

        Raises:
            RuntimeError: HTTP error status, a malformed or aborted answer, or the backend is asleep/closed.
            ConnectionError / TimeoutError: the server cannot be reached / did not answer in time.
        """
        self._check_usable()
        prompts = _validate_prompts(prompt_ids)
        samplings = _per_prompt_sampling(prompts, sampling)
        if not prompts:
            return []
        version = self.weight_version
        payload = {
            "input_ids": prompts,
            "sampling_params": [to_sglang_sampling_params(s) for s in samplings],
            "return_logprob": True,
        }
        r = self._request("POST", "/generate", payload)
        if r.status_code >= 400:
            raise RuntimeError(f"SGLang /generate failed: HTTP {r.status_code}: {r.text[:2000]}")
        outs = r.json()
        if isinstance(outs, Mapping):
            if "error" in outs:
                raise RuntimeError(f"SGLang /generate error: {outs['error']}")
        return parse_sglang_outputs(outs, samplings, weight_version=version, tokenizer=self.tokenizer)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Write the weights to ``weight_dir/v<N>``, ``POST /update_weights_from_disk``, ``POST /flush_cache``.

        Returns:
            The new ``weight_version``.

        Raises:
            RuntimeError: the server answered ``success: false`` or an error status (message included).
        """
        self._check_usable()
        items = _named_tensor_list(named_tensors)
        target = self.weight_dir / f"v{self.weight_version + 1}"
        write_hf_checkpoint(items, target, model_config=self.model_config, source_dir=self.model_path)
        try:
            self._post_ok(
                "/update_weights_from_disk", {"model_path": str(target)}, "update_weights_from_disk"
            )
            r = self._request("POST", "/flush_cache")
            if r.status_code >= 400:
                raise RuntimeError(f"SGLang flush_cache failed: HTTP {r.status_code}: {r.text[:500]}")
        finally:
            # the previous checkpoint is no longer needed once the server loaded (or refused) this one
            previous = self.weight_dir / f"v{self.weight_version}"
            if previous.is_dir():
                shutil.rmtree(previous, ignore_errors=True)
        self.weight_version += 1
        return self.weight_version

    def sleep(self) -> None:
        """``POST /release_memory_occupation`` (needs ``--enable-memory-saver``; otherwise a no-op)."""
        if self._closed or self._asleep or not self.memory_saver:
            return
        self._post_ok("/release_memory_occupation", {}, "release_memory_occupation")
        self._asleep = True

    def wake(self) -> None:
        """``POST /resume_memory_occupation``."""
        if self._closed or not self._asleep:
            return
        self._post_ok("/resume_memory_occupation", {}, "resume_memory_occupation")
        self._asleep = False

    def close(self) -> None:
        """Close the HTTP client (if created here), stop an owned server process, drop temp files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self.client.close()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=30)
        if self._tmp_weight_dir is not None:
            self._tmp_weight_dir.cleanup()

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this SGLang backend is closed")
        if self._asleep:
            raise RuntimeError("this SGLang backend is asleep (memory released); call wake() first")


# ----------------------------------------------------------------------------------------------------------
# Factory from a model group's config
# ----------------------------------------------------------------------------------------------------------

#: ``backend_kwargs`` understood by :func:`make_sglang_backend`, with what each means.
SGLANG_BACKEND_KWARGS: dict[str, str] = {
    "mem_fraction_static": "share of each GPU SGLang reserves for weights + KV cache (both backends)",
    "tp_size": "tensor-parallel size (default len(gpu_ids) or 1)",
    "gpu_ids": "GPU indices for this group's engine, e.g. [0] or [2, 3]; the first is SGLang's base_gpu_id",
    "random_seed": "engine sampling seed",
    "enable_memory_saver": "release weights/KV cache while training (colocated; default False)",
    "weight_sync": "sglang_engine: auto | tensor | disk",
    "engine_kwargs": "sglang_engine: further sglang.ServerArgs fields (dict)",
    "url": "sglang_http: an already running server, e.g. http://10.0.0.5:30000 (else one is launched)",
    "port": "sglang_http: port of the server launched on 127.0.0.1 when no url is given (default 30000)",
    "timeout": "sglang_http: seconds per request (default 600)",
    "startup_timeout": "sglang_http: seconds to wait for /health (default 900 when launching, 60 otherwise)",
    "weight_dir": "sglang_http: folder the server can read for weight updates (default a temp folder)",
    "extra_args": "sglang_http: further `sglang.launch_server` flags (list of strings)",
}


def make_sglang_backend(group: Any, model: Any = None, tokenizer: Any = None) -> Any:
    """Build the SGLang backend a model group asks for.

    Args:
        group: a model-group config with ``backend`` (``"sglang_engine"`` or ``"sglang_http"``), ``model`` (hub
            id, folder or builtin alias), ``backend_kwargs`` (keys in :data:`SGLANG_BACKEND_KWARGS`) and
            optionally ``dtype`` and ``name`` (``mas_train.config.ResolvedModelGroup`` has them all).
        model: the trainer's model; its ``config`` is written next to the weights on disk syncs.
        tokenizer: the group's tokenizer (for the defensive stop-string cut).

    Returns:
        An :class:`SGLangEngineBackend` or :class:`SGLangHTTPBackend`.

    Raises:
        ValueError: an unknown backend name or ``backend_kwargs`` key, or ``gpu_ids`` that disagree with
            ``tp_size``.
    """
    from mas_train.models import resolve_model_path

    kind = getattr(group, "backend", None)
    name = getattr(group, "name", "") or "<group>"
    kw = dict(getattr(group, "backend_kwargs", None) or {})
    unknown = sorted(set(kw) - set(SGLANG_BACKEND_KWARGS))
    if unknown:
        raise ValueError(
            f"model_groups.{name}.backend_kwargs: unknown keys {unknown} for backend {kind!r}; known: "
            + ", ".join(sorted(SGLANG_BACKEND_KWARGS))
        )
    gpu_ids = [int(g) for g in kw.get("gpu_ids") or []]
    tp_size = int(kw.get("tp_size") or (len(gpu_ids) if gpu_ids else 1))
    if gpu_ids and len(gpu_ids) != tp_size:
        raise ValueError(
            f"model_groups.{name}.backend_kwargs: gpu_ids {gpu_ids} must list tp_size={tp_size} GPUs"
        )
    base_gpu_id = gpu_ids[0] if gpu_ids else 0
    model_path = resolve_model_path(group.model)
    model_config = getattr(model, "config", None)
    dtype = getattr(group, "dtype", None)
    if kind == "sglang_engine":
        engine_kwargs = dict(kw.get("engine_kwargs") or {})
        if dtype and dtype != "auto":
            engine_kwargs.setdefault("dtype", dtype)
        return SGLangEngineBackend(
            model_path,
            tokenizer=tokenizer,
            mem_fraction_static=kw.get("mem_fraction_static"),
            tp_size=tp_size,
            base_gpu_id=base_gpu_id,
            random_seed=kw.get("random_seed"),
            enable_memory_saver=bool(kw.get("enable_memory_saver", False)),
            weight_sync=kw.get("weight_sync", "auto"),
            model_config=model_config,
            engine_kwargs=engine_kwargs,
        )
    if kind == "sglang_http":
        common = {
            "tokenizer": tokenizer,
            "timeout": float(kw.get("timeout", 600.0)),
            "weight_dir": kw.get("weight_dir"),
            "model_config": model_config,
        }
        if kw.get("url"):
            backend = SGLangHTTPBackend(
                kw["url"], model_path=model_path, memory_saver=bool(kw.get("enable_memory_saver")), **common
            )
            try:
                backend.wait_until_healthy(float(kw.get("startup_timeout", 60.0)))
            except BaseException:
                backend.close()
                raise
            return backend
        extra = list(kw.get("extra_args") or [])
        if dtype and dtype != "auto":
            extra += ["--dtype", dtype]
        return SGLangHTTPBackend.launch(
            model_path,
            port=int(kw.get("port", 30000)),
            mem_fraction_static=kw.get("mem_fraction_static"),
            tp_size=tp_size,
            base_gpu_id=base_gpu_id,
            random_seed=kw.get("random_seed"),
            memory_saver=bool(kw.get("enable_memory_saver", False)),
            extra_args=extra,
            startup_timeout=float(kw.get("startup_timeout", 900.0)),
            **common,
        )
    raise ValueError(f"make_sglang_backend: backend must be 'sglang_engine' or 'sglang_http', got {kind!r}")

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
* LoRA (``docs/advanced_features/lora.ipynb``, ``srt/entrypoints/engine.py``, ``srt/entrypoints/http_server.py``,
  ``srt/managers/io_struct.py``): ``ServerArgs`` ``enable_lora``, ``max_lora_rank``, ``lora_target_modules``,
  ``max_loras_per_batch`` (``--enable-lora`` ...); a request selects adapters by *name* with
  ``lora_path`` (a list, one name or ``None`` per prompt); ``Engine.load_lora_adapter(lora_name, lora_path,
  pinned=False)`` / ``Engine.unload_lora_adapter(lora_name)`` and ``POST /load_lora_adapter``
  ``{"lora_name", "lora_path"}`` / ``POST /unload_lora_adapter`` ``{"lora_name"}`` answer
  ``LoRAUpdateOutput`` ``{"success", "error_message", "loaded_adapters"}`` (HTTP 200 or 400). Loading a name
  that is loaded fails, so a new adapter version is unload + load of a new PEFT folder.
* ``flush_cache`` (``GET|POST /flush_cache``: 200, or 400 while requests are running),
  ``release_memory_occupation(tags=None)`` / ``resume_memory_occupation(tags=None)`` (need
  ``enable_memory_saver`` and an idle engine), ``GET /health`` (200 once the server is up).

Modules: :mod:`.wire` (request/answer mapping shared by both), :mod:`.engine`, :mod:`.http`; this module
holds the factory from typed options (:class:`~mas_train.backends.options.SGLangEngineOptions`, ``SGLangHTTPOptions``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

from mas_train.backends.options import SGLangEngineOptions, SGLangHTTPOptions
from mas_train.backends.sglang.engine import SGLangEngineBackend
from mas_train.backends.sglang.http import SGLangHTTPBackend
from mas_train.backends.sglang.wire import (
    parse_sglang_output,
    parse_sglang_outputs,
    to_sglang_sampling_params,
    write_hf_checkpoint,
    write_peft_adapter,
)
from mas_train.backends.weight_sync import load_initial_adapter as _load_initial_adapter

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from mas_train.config import ResolvedModelGroup

__all__ = [
    "SGLANG_BACKEND_KWARGS",
    "SGLangEngineBackend",
    "SGLangHTTPBackend",
    "make_from_options",
    "make_sglang_backend",
    "parse_sglang_output",
    "parse_sglang_outputs",
    "to_sglang_sampling_params",
    "write_hf_checkpoint",
    "write_peft_adapter",
]

_OPTION_CLASSES = {"sglang_engine": SGLangEngineOptions, "sglang_http": SGLangHTTPOptions}

#: Option names of the SGLang kinds with their help (the fields of the two options dataclasses).
SGLANG_BACKEND_KWARGS: dict[str, str] = {
    f.name: f.metadata["help"] for cls in _OPTION_CLASSES.values() for f in dataclasses.fields(cls)
}


def make_from_options(
    options: SGLangEngineOptions | SGLangHTTPOptions,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    group: ResolvedModelGroup | None = None,
) -> SGLangEngineBackend | SGLangHTTPBackend:
    """The registry factory of both SGLang kinds (see :func:`mas_train.backends.make_backend`).

    Args:
        options: the kind's options; the class decides the kind.
        model: the trainer's model; its ``config`` is written next to the weights on disk syncs, and without a
            ``group`` its ``name_or_path`` is the folder served.
        tokenizer: the group's tokenizer (for the defensive stop-string cut).
        group: the resolved model group: its ``model`` (hub id, folder or builtin alias) is served and its
            ``dtype`` (unless ``auto``) is passed to SGLang. With a ``lora`` section the backend serves the
            group's adapter under the group's name: SGLang starts with the LoRA server args of
            :meth:`~mas_train.backends.options.SGLangEngineOptions.lora_server_args`, and when ``model`` holds
            the adapter (the group's PeftModel) its current weights are loaded before the first request.

    Raises:
        ValueError: nothing names the model to serve; LoRA options inconsistent with the group's ``lora``
            (one line, before SGLang starts); a given server that cannot serve the adapter.
    """
    model_config = getattr(model, "config", None)
    dtype = getattr(group, "dtype", None)
    model_path = getattr(options, "model_path", None)
    if model_path is None and group is not None:
        from mas_train.models import resolve_model_path

        model_path = resolve_model_path(group.model)
    if model_path is None:
        model_path = getattr(model, "name_or_path", None)
    lora = getattr(group, "lora", None)
    lora_name = (getattr(group, "name", "") or None) if lora is not None else None
    if lora is not None and lora_name is None:
        raise ValueError("a LoRA model group needs a name: SGLang serves its adapter under it")
    lora_args = options.lora_server_args(lora, lora_name or getattr(group, "name", "") or "<group>")
    lora_kw = {"lora_name": lora_name, "lora": lora}
    if isinstance(options, SGLangEngineOptions):
        engine_kwargs = dict(options.engine_kwargs)
        if dtype and dtype != "auto":
            engine_kwargs.setdefault("dtype", dtype)
        engine_kwargs.update(lora_args)
        backend = SGLangEngineBackend(
            model_path,
            tokenizer=tokenizer,
            mem_fraction_static=options.mem_fraction_static,
            tp_size=options.resolved_tp_size,
            base_gpu_id=options.base_gpu_id,
            random_seed=options.random_seed,
            enable_memory_saver=options.enable_memory_saver,
            weight_sync=options.weight_sync,
            model_config=model_config,
            bucket_bytes=options.bucket_bytes,
            engine_kwargs=engine_kwargs,
            **lora_kw,
        )
        return _load_initial_adapter(backend, model)
    common: dict[str, Any] = {  # the keyword arguments both SGLang HTTP constructors take
        "tokenizer": tokenizer,
        "timeout": options.timeout,
        "connect_retries": options.connect_retries,
        "weight_dir": options.weight_dir,
        "model_config": model_config,
        **lora_kw,
    }
    if options.url:
        http = SGLangHTTPBackend(
            options.url, model_path=model_path, memory_saver=options.enable_memory_saver, **common
        )
        try:
            http.wait_until_healthy(options.startup_timeout or 60.0)
            http.check_lora_server()
        except BaseException:
            http.close()
            raise
        return _load_initial_adapter(http, model)
    if model_path is None:
        raise ValueError(
            "sglang_http without backend_options.url launches a server: it needs the model to serve"
        )
    extra = list(options.extra_args)
    if dtype and dtype != "auto":
        extra += ["--dtype", dtype]
    extra += _server_flags(lora_args)
    launched = SGLangHTTPBackend.launch(
        model_path,
        port=options.port,
        mem_fraction_static=options.mem_fraction_static,
        tp_size=options.resolved_tp_size,
        base_gpu_id=options.base_gpu_id,
        random_seed=options.random_seed,
        memory_saver=options.enable_memory_saver,
        extra_args=extra,
        startup_timeout=options.startup_timeout or 900.0,
        **common,
    )
    return _load_initial_adapter(launched, model)


def _server_flags(args: dict[str, Any]) -> list[str]:
    """``sglang.launch_server`` flags of ServerArgs fields (``enable_lora=True`` -> ``--enable-lora``; a list
    is one flag with several values, as SGLang's ``nargs="*"`` arguments take it)."""
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list | tuple):
            flags += [flag, *[str(v) for v in value]]
        else:
            flags += [flag, str(value)]
    return flags


def make_sglang_backend(
    group: ResolvedModelGroup,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> SGLangEngineBackend | SGLangHTTPBackend:
    """Build the SGLang backend a model group asks for: ``group.backend`` (``sglang_engine`` or
    ``sglang_http``) with ``group.backend_options`` (an options object or a mapping).

    Raises:
        ValueError: not an SGLang kind, an unknown option (with close matches) or an invalid value.
    """
    from mas_train.backends import build_options

    kind = getattr(group, "backend", None)
    if kind not in _OPTION_CLASSES:
        raise ValueError(
            f"make_sglang_backend: backend must be 'sglang_engine' or 'sglang_http', got {kind!r}"
        )
    options = getattr(group, "backend_options", None)
    name = getattr(group, "name", "") or "<group>"
    try:
        options = build_options(kind, options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"model_groups.{name}.backend_options: {err}") from None
    # build_options gave the kind's class: SGLangEngineOptions or SGLangHTTPOptions
    return make_from_options(
        cast("SGLangEngineOptions | SGLangHTTPOptions", options), model, tokenizer, group
    )

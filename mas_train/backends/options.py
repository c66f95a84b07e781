"""Typed options of each generation-backend kind: ``model_groups.<group>.backend_options`` in a run config.

One dataclass per kind; a field's ``help`` metadata is its documentation (``mas-train --help`` and
``docs/scaling.md`` show it). The config validates a group's ``backend_options`` mapping against the dataclass
of the group's backend kind when the config is built (unknown option: an error with close matches), and
:func:`mas_train.backends.make_backend` hands the instance to the backend's factory.

This module imports nothing heavy (no torch, httpx, sglang or openai), so a config can be checked on a machine
without the backend's packages. Raises (every ``__post_init__``): ``ValueError`` with the option name and the
allowed values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mas_train.config.sections import LoraConfig

__all__ = [
    "SGLANG_LORA_ARGS",
    "HFOptions",
    "OpenAIOptions",
    "SGLangEngineOptions",
    "SGLangHTTPOptions",
    "VLLMHTTPOptions",
]


def _help(text: str, **kw: Any) -> Any:  # a field whose help text is its documentation
    return field(metadata={"help": text}, **kw)


@dataclass
class HFOptions:
    """Options of ``backend: hf`` (:class:`~mas_train.backends.hf.HFBackend`, the CPU default)."""

    share_model: bool | None = _help(
        "Sample with the trained model itself instead of a private copy (saves one copy of the weights; a "
        "forgotten weight sync is then invisible). None = share on CPU, where sampling and training never "
        "overlap and the copy costs ~1 GB of RSS for SmolLM2-135M; keep a copy on GPUs.",
        default=None,
    )
    max_batch_size: int | None = _help(
        "Most prompts per forward pass (bounds KV-cache memory). None = all at once.", default=None
    )
    seed: int = _help("Seeds the per-request seeds of requests that carry none.", default=0)
    device: str | None = _help(
        "Device of the private copy (e.g. cuda:1). None = the trained model's device.", default=None
    )
    dtype: str | None = _help(
        "dtype of the private copy: float32, bfloat16 or float16. None = the trained model's dtype.",
        default=None,
    )
    packed_linears: bool | None = _help(
        "Sample through oneDNN-packed copies of the large linear layers (1.6-2.3x faster decode GEMMs on CPU, "
        "logits equal up to float rounding, +1 copy of those weights; docs/performance.md). None = on when "
        "sampling on CPU with a oneDNN torch build; true off CPU or without oneDNN is refused.",
        default=None,
    )
    fused_decode: bool | None = _help(
        "Run each decode step of a Llama-family model (Llama, Qwen2, Qwen3, Mistral; LoRA included) as ~20 "
        "tensor ops per layer instead of the model's forward (logits equal up to float rounding; "
        "docs/performance.md). None = on when sampling on CPU in fp32 with a supported model; true where "
        "unsupported is refused.",
        default=None,
    )

    def __post_init__(self) -> None:
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {self.max_batch_size}")
        if self.dtype is not None and self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16, float16 or None, got {self.dtype!r}")
        if self.share_model and (self.device is not None or self.dtype is not None):
            raise ValueError("share_model samples with the model as it is: drop device and dtype")


#: The LoRA fields of the SGLang options, under SGLang's own ``ServerArgs`` names.
SGLANG_LORA_ARGS = ("enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch")
# SGLang server arguments the typed LoRA options own (lora_paths: the weight sync loads the group's adapter)
_LORA_PASSTHROUGH = (*SGLANG_LORA_ARGS, "lora_paths")


def _check_no_lora_passthrough(keys: Any, what: str) -> None:
    flags = {f"--{k.replace('_', '-')}": k for k in _LORA_PASSTHROUGH}
    for key in keys:
        name = flags.get(str(key).split("=", 1)[0], key)
        if name in _LORA_PASSTHROUGH:
            typed = "the group's lora section" if name == "lora_paths" else f"backend_options.{name}"
            raise ValueError(
                f"{what} sets {key!r}: use {typed} instead (its value is checked against the lora)"
            )


def _check_gpus(gpu_ids: list[int] | None, tp_size: int | None, mem: float | None) -> None:
    if tp_size is not None and tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if gpu_ids and tp_size is not None and len(gpu_ids) != tp_size:
        raise ValueError(f"gpu_ids {list(gpu_ids)} must list tp_size={tp_size} GPUs")
    if mem is not None and not 0 < mem < 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem}")


@dataclass
class _SGLangCommon:
    mem_fraction_static: float | None = _help(
        "Share of each GPU SGLang reserves for weights + KV cache, in (0, 1). None = SGLang's default.",
        default=None,
    )
    tp_size: int | None = _help("Tensor-parallel size. None = len(gpu_ids), or 1.", default=None)
    gpu_ids: list[int] | None = _help(
        "GPU indices of this group's engine, e.g. [0] or [2, 3]; the first is SGLang's base_gpu_id. Leave unset "
        "under pool: ray (Ray assigns the GPUs).",
        default=None,
    )
    random_seed: int | None = _help("The engine's sampling seed.", default=None)
    enable_memory_saver: bool = _help(
        "Release weights and KV cache while the trainer steps (colocated; needs torch_memory_saver).",
        default=False,
    )

    enable_lora: bool | None = _help(
        "Serve the model group's LoRA adapter (SGLang --enable-lora): each request names the adapter and the "
        "weight sync (re)loads only the adapter. None = on exactly when the group has a lora section.",
        default=None,
    )
    max_lora_rank: int | None = _help(
        "SGLang --max-lora-rank: the largest adapter rank its LoRA memory pool holds. None = the group's lora.r.",
        default=None,
    )
    lora_target_modules: list[str] | None = _help(
        "SGLang --lora-target-modules: modules its LoRA pool covers (['all'] = every one it supports). None = "
        "the group's lora.target_modules.",
        default=None,
    )
    max_loras_per_batch: int | None = _help(
        "SGLang --max-loras-per-batch: adapters one batch may mix. None = SGLang's default (8).", default=None
    )

    def _check_lora_fields(self) -> None:
        for name in ("max_lora_rank", "max_loras_per_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.lora_target_modules is not None and not self.lora_target_modules:
            raise ValueError("lora_target_modules must name at least one module (or ['all']), or be None")

    def lora_server_args(self, lora: LoraConfig | None, group: str = "<group>") -> dict[str, object]:
        """The SGLang ``ServerArgs`` LoRA fields a model group with LoRA config ``lora`` is served with.

        Args:
            lora: the group's :class:`mas_train.config.LoraConfig` (``r``, ``target_modules``), or ``None`` for
                a full fine-tune.
            group: the group's name, for the messages.

        Returns:
            ``{}`` for a group without a ``lora`` section; else ``enable_lora=True``, ``max_lora_rank``,
            ``lora_target_modules`` and, when set, ``max_loras_per_batch`` (SGLang's field names,
            ``srt/server_args.py``).

        Raises:
            ValueError (one line): ``enable_lora: false`` for a group with a ``lora`` section, LoRA options on a
                group without one, ``max_lora_rank`` below ``lora.r``, or ``lora_target_modules`` missing one of
                the group's ``lora.target_modules``.
        """
        if lora is None:
            set_ = [f for f in SGLANG_LORA_ARGS if getattr(self, f) not in (None, False)]
            if set_:
                raise ValueError(
                    f"model group {group!r} has no lora section, so its SGLang backend serves no adapter: drop "
                    f"backend_options {set_} or give the group a lora section"
                )
            return {}
        if self.enable_lora is False:
            raise ValueError(
                f"model group {group!r} trains a LoRA adapter, which SGLang serves only with LoRA enabled: drop "
                "backend_options.enable_lora: false (or the group's lora section)"
            )
        rank = self.max_lora_rank if self.max_lora_rank is not None else int(lora.r)
        if rank < int(lora.r):
            raise ValueError(
                f"model group {group!r}: backend_options.max_lora_rank={rank} is below its lora.r={lora.r}; SGLang "
                "would refuse to load the adapter. Raise max_lora_rank to >= lora.r (or leave it unset)"
            )
        targets = list(lora.target_modules)
        if self.lora_target_modules is not None:
            missing = [t for t in targets if t not in self.lora_target_modules]
            if missing and "all" not in self.lora_target_modules:
                raise ValueError(
                    f"model group {group!r}: backend_options.lora_target_modules {self.lora_target_modules} lack "
                    f"{missing} of its lora.target_modules; SGLang would refuse the adapter. Add them (or leave "
                    "lora_target_modules unset)"
                )
            targets = list(self.lora_target_modules)
        args: dict[str, object] = {"enable_lora": True, "max_lora_rank": rank, "lora_target_modules": targets}
        if self.max_loras_per_batch is not None:
            args["max_loras_per_batch"] = int(self.max_loras_per_batch)
        return args

    @property
    def resolved_tp_size(self) -> int:
        """``tp_size``, else ``len(gpu_ids)``, else 1."""
        return self.tp_size or (len(self.gpu_ids) if self.gpu_ids else 1)

    @property
    def base_gpu_id(self) -> int:
        return int(self.gpu_ids[0]) if self.gpu_ids else 0


@dataclass
class SGLangEngineOptions(_SGLangCommon):
    """Options of ``backend: sglang_engine`` (an in-process ``sglang.Engine`` per model group)."""

    weight_sync: str = _help(
        "auto | tensor (CUDA IPC, trainer on the same node) | disk (safetensors folder). auto = tensor when the "
        "engine has it and CUDA is available.",
        default="auto",
    )
    bucket_bytes: int = _help(
        "Upper bound of one update_weights_from_tensor payload (bytes).", default=512 * 1024**2
    )
    engine_kwargs: dict[str, Any] = _help("Further sglang.ServerArgs fields.", default_factory=dict)
    model_path: str | None = _help(
        "Folder or hub id the engine serves. None = the model group's model.", default=None
    )

    def __post_init__(self) -> None:
        _check_gpus(self.gpu_ids, self.tp_size, self.mem_fraction_static)
        self._check_lora_fields()
        _check_no_lora_passthrough(self.engine_kwargs, "engine_kwargs")
        if self.weight_sync not in ("auto", "tensor", "disk"):
            raise ValueError(f"weight_sync must be 'auto', 'tensor' or 'disk', got {self.weight_sync!r}")
        if self.bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {self.bucket_bytes}")


@dataclass
class SGLangHTTPOptions(_SGLangCommon):
    """Options of ``backend: sglang_http`` (an SGLang server: an existing ``url``, or one launched here)."""

    url: str | None = _help(
        "An already running server, e.g. http://10.0.0.5:30000. None = launch one on 127.0.0.1:port.",
        default=None,
    )
    port: int = _help("Port of the server launched when no url is given.", default=30000)
    timeout: float = _help(
        "Seconds one whole request may take: connect, send and the full reply (generation, weight loading).",
        default=300.0,
    )
    startup_timeout: float | None = _help(
        "Seconds to wait for /health. None = 900 when launching, 60 for a given url.", default=None
    )
    connect_retries: int = _help(
        "Attempts to connect when the server cannot be reached (httpx transport retries; a request that "
        "reached the server is never repeated).",
        default=5,
    )
    weight_dir: str | None = _help(
        "Folder the server can read (same machine or shared filesystem) for weight updates. None = a temp folder.",
        default=None,
    )
    extra_args: list[str] = _help("Further `sglang.launch_server` flags.", default_factory=list)

    def __post_init__(self) -> None:
        _check_gpus(self.gpu_ids, self.tp_size, self.mem_fraction_static)
        self._check_lora_fields()
        _check_no_lora_passthrough(self.extra_args, "extra_args")
        _check_http_client(self)


def _check_http_client(o: Any) -> None:
    """The checks every server-backed options class shares: ``url``, ``timeout``, ``startup_timeout``,
    ``connect_retries``. Raises ``ValueError`` naming the first bad field."""
    if o.url is not None and not o.url.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https://, got {o.url!r}")
    if o.timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {o.timeout}")
    if o.startup_timeout is not None and o.startup_timeout <= 0:
        raise ValueError(f"startup_timeout must be > 0 seconds or None, got {o.startup_timeout}")
    if o.connect_retries < 1:
        raise ValueError(f"connect_retries must be >= 1, got {o.connect_retries}")


def _default_sync_dir() -> str | None:
    # a RAM disk: the full-weight sync writes the whole state dict every step, and the server reads it back
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


#: vLLM server flags the typed options own (a second copy in extra_args would be ambiguous).
_VLLM_OWNED_FLAGS = (
    "--model",
    "--host",
    "--port",
    "--dtype",
    "--max-model-len",
    "--logprobs-mode",
    "--enable-lora",
    "--max-lora-rank",
)


@dataclass
class VLLMHTTPOptions:
    """Options of ``backend: vllm_http`` (a vLLM OpenAI-compatible server: an existing ``url``, or one launched
    here with ``python -m vllm.entrypoints.openai.api_server`` from the ``python`` of a vLLM environment)."""

    url: str | None = _help(
        "An already running vLLM server, e.g. http://127.0.0.1:8000 (started with VLLM_SERVER_DEV_MODE=1 and "
        "--logprobs-mode processed_logprobs, so weight syncs and logprobs work). None = launch one.",
        default=None,
    )
    python: str | None = _help(
        "Python executable of the environment vLLM is installed in (scripts/setup_vllm_cpu.sh prints it); the "
        "server is launched with it on 127.0.0.1 and a free port. None = $MAS_VLLM_PYTHON, else "
        ".venv-vllm/bin/python in the working directory.",
        default=None,
    )
    port: int | None = _help("Port of the launched server. None = a free port.", default=None)
    dtype: str | None = _help(
        "vLLM --dtype: float32, bfloat16 or float16. None = the trained model's dtype (dtype auto: see --dtype).",
        default=None,
    )
    max_model_len: int = _help("vLLM --max-model-len: prompt + completion tokens per sequence.", default=2048)
    kv_cache_gib: float | None = _help(
        "KV cache of a launched CPU server in GiB (VLLM_CPU_KVCACHE_SPACE). None = vLLM's default.",
        default=None,
    )
    enforce_eager: bool = _help(
        "Launch with --enforce-eager: start-up 46 s instead of ~130 s on 2 CPU cores, ~10% slower decoding.",
        default=True,
    )
    logprobs_mode: str = _help(
        "vLLM --logprobs-mode of a launched server: processed_logprobs (after temperature and top-k/top-p: the "
        "distribution sampled from) or raw_logprobs (log_softmax of the raw logits).",
        default="processed_logprobs",
    )
    max_lora_rank: int | None = _help(
        "vLLM --max-lora-rank of a LoRA group's server. None = the group's lora.r (vLLM accepts 8, 16, 32, ...; "
        "the smallest of those >= r is used).",
        default=None,
    )
    extra_args: list[str] = _help(
        "Further api_server flags, e.g. ['--max-num-seqs', '64'].", default_factory=list
    )
    env: dict[str, str] = _help(
        "Environment of a launched server on top of ours (e.g. VLLM_CPU_OMP_THREADS_BIND). VLLM_SERVER_DEV_MODE=1 "
        "is always set (the weight-sync RPC needs it).",
        default_factory=dict,
    )
    timeout: float = _help(
        "Seconds one whole request may take: connect, send and the full reply (generation, weight loading).",
        default=300.0,
    )
    startup_timeout: float | None = _help(
        "Seconds to wait for /health. None = 600 when launching, 60 for a given url.", default=None
    )
    connect_retries: int = _help(
        "Attempts to connect when the server cannot be reached (httpx transport retries; a request that "
        "reached the server is never repeated).",
        default=5,
    )
    sync_dir: str | None = _help(
        "Folder the server can read where each weight sync writes its safetensors checkpoint. None = a temp "
        "folder under /dev/shm (a RAM disk) when present, else the system temp folder.",
        default_factory=_default_sync_dir,
    )

    def __post_init__(self) -> None:
        _check_http_client(self)
        if self.url is not None and self.python is not None:
            raise ValueError("give either url (a running server) or python (launch one), not both")
        if self.dtype is not None and self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16, float16 or None, got {self.dtype!r}")
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0 or None, got {self.kv_cache_gib}")
        if self.logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
            raise ValueError(
                f"logprobs_mode must be processed_logprobs or raw_logprobs, got {self.logprobs_mode!r}"
            )
        if self.max_lora_rank is not None and self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1 or None, got {self.max_lora_rank}")
        if self.port is not None and not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535 or None, got {self.port}")
        for arg in self.extra_args:
            if str(arg).split("=", 1)[0] in _VLLM_OWNED_FLAGS:
                raise ValueError(f"extra_args sets {arg!r}, which a typed option (or the model group) owns")


@dataclass
class OpenAIOptions:
    """Options of ``backend: openai`` (an OpenAI-compatible server; it samples only, so its model group is
    ``trainable: false``): where and how a frozen agent's endpoint is called.

    Attributes:
        base_url: the server's OpenAI API root, e.g. ``http://127.0.0.1:8000/v1`` or
            ``https://api.openai.com/v1``.
        model: the model name the server serves (the request's ``model`` field).
        api_key_env: name of the environment variable holding the API key (sent as ``Authorization: Bearer``
            to ``base_url`` and nowhere else). ``None`` (the default): ``OPENAI_API_KEY`` when ``base_url`` is
            ``https://api.openai.com``, no key (no header) for any other server, so a key meant for one
            provider never reaches another server by default. A key sent over plain ``http://`` to a host
            other than loopback is warned about (it crosses the network in clear text).
        endpoint: ``"chat"`` (``/chat/completions`` with the env's messages; the server applies its template)
            or ``"completions"`` (``/completions`` with the prompt rendered by the group's tokenizer).
        timeout_s: seconds each attempt may take in all: a deadline over connect, send and reading the whole
            reply (not per socket read), default 60.
        max_retries: retries after the first attempt on connection errors, timeouts, 429 and 5xx (default 2):
            a hung server is reported after at most ``(max_retries + 1) * timeout_s`` plus ~2 s of backoff.
        max_concurrency: most requests of one :meth:`OpenAIBackend.generate` call in flight at once.

    Raises:
        ValueError: an empty ``base_url``/``model``, a URL without ``http(s)://``, an unknown ``endpoint``,
            ``timeout_s <= 0``, ``max_retries < 0`` or ``max_concurrency < 1``.
    """

    base_url: str = _help("Server base URL, e.g. http://localhost:8000/v1 (required).")
    model: str = _help("Model name the server knows (required).")
    api_key_env: str | None = _help(
        "Environment variable holding the API key, sent to base_url only. None = OPENAI_API_KEY for "
        "https://api.openai.com, no key for any other server.",
        default=None,
    )
    endpoint: str = _help("chat (/chat/completions) or completions (/completions).", default="chat")
    timeout_s: float = _help(
        "Seconds one attempt may take in all (connect, send, wait, read the whole reply).", default=60.0
    )
    max_retries: int = _help(
        "Retries of a failed attempt (the openai client's own retry); a hung server is reported after "
        "(max_retries + 1) * timeout_s plus at most ~2 s of backoff.",
        default=2,
    )
    max_concurrency: int = _help("Requests in flight at once.", default=8)

    def __post_init__(self) -> None:
        if not self.base_url or not str(self.base_url).startswith(("http://", "https://")):
            raise ValueError(f"openai base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.model:
            raise ValueError("openai model is empty; set the model name the server serves")
        if self.endpoint not in ("chat", "completions"):
            raise ValueError(f"openai endpoint must be one of ['chat', 'completions'], got {self.endpoint!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"openai timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"openai max_retries must be >= 0, got {self.max_retries}")
        if self.max_concurrency < 1:
            raise ValueError(f"openai max_concurrency must be >= 1, got {self.max_concurrency}")

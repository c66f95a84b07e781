"""The ``vllm_http`` backend: :class:`VLLMHTTPBackend`, a client of one vLLM OpenAI-compatible server (launched
here or already running); needs only ``httpx`` on this side."""

from __future__ import annotations

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
from mas_train.backends.checks import named_tensor_list, per_prompt_sampling, validate_prompts
from mas_train.backends.server import HTTPServerClient, free_port, start_server_process
from mas_train.backends.vllm.wire import (
    VLLM_SERVER_MODULE,
    find_vllm_python,
    parse_vllm_choice,
    to_vllm_request,
)
from mas_train.backends.weight_sync import LoRAAdapterSync, write_hf_checkpoint

if TYPE_CHECKING:
    import httpx
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["VLLMHTTPBackend"]


class VLLMHTTPBackend(LoRAAdapterSync, HTTPServerClient):
    """Generation through a vLLM OpenAI-compatible server, with only ``httpx`` here.

    Args:
        url: server base URL, e.g. ``http://127.0.0.1:8000`` (no ``/v1``).
        tokenizer: the model group's tokenizer (EOS id and the defensive stop-string cut).
        client: an ``httpx.Client`` to use; default a new one for ``url`` with ``connect_retries``.
        timeout: seconds one whole request may take (connect, send, the full reply), default 300.
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
        tokenizer: PreTrainedTokenizerBase | None = None,
        client: httpx.Client | None = None,
        timeout: float = 300.0,
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
                raise RuntimeError(
                    f"vLLM GET {self.url}/v1/models failed: HTTP {r.status_code}: {r.text[:500]}"
                )
            try:
                self._served_model = str(self._json(r, "/v1/models")["data"][0]["id"])
            except (KeyError, IndexError, TypeError) as err:
                raise RuntimeError(
                    f"vLLM {self.url}/v1/models answered an unexpected shape ({err!r}); is it a vLLM server?"
                ) from None
        return self._served_model

    def _post_ok(self, path: str, payload: Any, what: str) -> httpx.Response:
        r = self._request("POST", path, payload)
        if r.status_code >= 400:
            raise RuntimeError(
                f"vLLM {what} failed: HTTP {r.status_code} from {self.url}{path}: {r.text[:2000]}"
            )
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
            body = self._json(r, "/v1/completions")
            try:
                choices = sorted(body.get("choices", []), key=lambda c: c["index"])
            except (AttributeError, KeyError, TypeError) as err:
                raise RuntimeError(
                    f"vLLM {self.url}/v1/completions answered an unexpected shape ({err!r}): {str(body)[:120]}"
                ) from None
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

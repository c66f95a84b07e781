"""SGLang HTTP-server backend (``python -m sglang.launch_server``); needs only ``httpx`` on this side."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas_train.backends.base import GenerationOutput, SamplingParams
from mas_train.backends.checks import named_tensor_list, per_prompt_sampling, validate_prompts
from mas_train.backends.server import HTTPServerClient, start_server_process
from mas_train.backends.sglang.wire import (
    check_result,
    parse_sglang_outputs,
    to_sglang_sampling_params,
    write_hf_checkpoint,
)
from mas_train.backends.weight_sync import LoRAAdapterSync

if TYPE_CHECKING:
    import httpx
    import torch
    from transformers import PreTrainedTokenizerBase


__all__ = ["SGLangHTTPBackend"]


class SGLangHTTPBackend(LoRAAdapterSync, HTTPServerClient):
    """Generation through an SGLang HTTP server (``python -m sglang.launch_server``), with only ``httpx`` here.

    Args:
        url: server base URL, e.g. ``http://127.0.0.1:30000``.
        tokenizer: the model group's tokenizer; used to cut completions at stop strings defensively.
        client: an ``httpx.Client`` to use (tests pass a ``fastapi.testclient.TestClient``); default: a new
            client for ``url``.
        timeout: seconds one whole request may take (connect, send, the full reply; generation and weight
            loading can take minutes), default 300.
        connect_retries: attempts when the server cannot be reached, done by the client's transport
            (``httpx.HTTPTransport(retries=connect_retries - 1)``: only connection failures are retried, with
            httpcore's exponential backoff, so a request that reached the server is never repeated). A client
            passed in keeps its own transport.
        weight_dir: folder the server can read (same machine or shared filesystem) where
            :meth:`update_weights` writes the checkpoint it asks the server to load; default a temp folder.
        model_config / model_path: config source for that checkpoint (see :func:`write_hf_checkpoint`).
        memory_saver: the server was started with ``--enable-memory-saver``; otherwise sleep/wake are no-ops.
        process: a ``subprocess.Popen`` of a server this backend owns; :meth:`close` terminates it.
        lora_name / lora: a LoRA model group's adapter name (the group's name) and
            :class:`mas_train.config.LoraConfig`: requests carry ``"lora_path": [lora_name, ...]`` and
            :meth:`update_weights` writes only the adapter, as a PEFT folder ``weight_dir/<lora_name>-v<N>``,
            then ``POST /unload_lora_adapter`` + ``POST /load_lora_adapter`` (the server must run with
            ``--enable-lora`` and a ``--max-lora-rank`` >= ``lora.r``; see :meth:`check_lora_server`).

    Weights are synced through disk (``/update_weights_from_disk``): ``update_weights_from_tensor`` passes
    CUDA IPC handles, which only work for a server on the same GPU node as the trainer.
    """

    server_name = "SGLang"
    launch_hint = "is `python -m sglang.launch_server --port ...` running?"

    def __init__(
        self,
        url: str = "http://127.0.0.1:30000",
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        client: httpx.Client | None = None,
        timeout: float = 300.0,
        connect_retries: int = 5,
        weight_dir: str | os.PathLike | None = None,
        model_config: Any = None,
        model_path: str | os.PathLike | None = None,
        memory_saver: bool = False,
        process: subprocess.Popen | None = None,
        lora_name: str | None = None,
        lora: Any = None,
    ) -> None:
        if (lora_name is None) != (lora is None):
            raise ValueError("SGLangHTTPBackend: pass lora_name and lora together (a LoRA group), or neither")
        self.lora_name = lora_name
        self.lora = lora
        self.adapter_path = None

        self._init_http(url, client, timeout, connect_retries, process)
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.model_path = None if model_path is None else str(model_path)
        self.memory_saver = bool(memory_saver)
        self.weight_version = 0
        self._tmp_weight_dir: tempfile.TemporaryDirectory | None = None
        if weight_dir is None:
            self._tmp_weight_dir = tempfile.TemporaryDirectory(prefix="mas_sglang_http_weights_")
            weight_dir = self._tmp_weight_dir.name
        self.weight_dir = Path(weight_dir)
        self.adapter_root = self.weight_dir
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
        proc = start_server_process(cmd, env)
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

    # -- HTTP plumbing (wait_until_healthy, _request: HTTPServerClient) ---------------------------------

    def _post_ok(self, path: str, payload: Any, what: str) -> httpx.Response:
        r = self._request("POST", path, payload)
        if r.status_code >= 400:
            raise RuntimeError(
                f"SGLang {what} failed: HTTP {r.status_code} from {self.url}{path}: {r.text[:2000]}"
            )
        try:
            body = r.json() if r.content else None
        except ValueError:
            body = None
        check_result(body, what)
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
        prompts = validate_prompts(prompt_ids)
        samplings = per_prompt_sampling(prompts, sampling)
        if not prompts:
            return []
        version = self.weight_version
        payload = {
            "input_ids": prompts,
            "sampling_params": [to_sglang_sampling_params(s) for s in samplings],
            "return_logprob": True,
            **self._lora_request_field(len(prompts)),
        }
        r = self._request("POST", "/generate", payload)
        if r.status_code >= 400:
            raise RuntimeError(f"SGLang {self.url}/generate failed: HTTP {r.status_code}: {r.text[:2000]}")
        outs = self._json(r, "/generate")
        if isinstance(outs, Mapping):
            if "error" in outs:
                raise RuntimeError(f"SGLang /generate error: {outs['error']}")
        return parse_sglang_outputs(outs, samplings, weight_version=version, tokenizer=self.tokenizer)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Write the weights to ``weight_dir/v<N>``, ``POST /update_weights_from_disk``, ``POST /flush_cache``.

        LoRA group (``lora_name`` set): only the adapter's tensors, written as the PEFT folder
        ``weight_dir/<lora_name>-v<N>`` and swapped in with ``POST /unload_lora_adapter`` +
        ``POST /load_lora_adapter``, then ``POST /flush_cache``; no base weight is sent.

        Returns:
            The new ``weight_version``.

        Raises:
            RuntimeError: the server answered ``success: false`` or an error status (message included).
        """
        self._check_usable()
        items = named_tensor_list(named_tensors)
        if self.lora_name is not None:
            self._push_adapter(items, self.weight_version + 1)
            self._flush()
            self.weight_version += 1
            return self.weight_version
        target = self.weight_dir / f"v{self.weight_version + 1}"
        write_hf_checkpoint(items, target, model_config=self.model_config, source_dir=self.model_path)
        try:
            self._post_ok(
                "/update_weights_from_disk", {"model_path": str(target)}, "update_weights_from_disk"
            )
            self._flush()
        finally:
            # the previous checkpoint is no longer needed once the server loaded (or refused) this one
            previous = self.weight_dir / f"v{self.weight_version}"
            if previous.is_dir():
                shutil.rmtree(previous, ignore_errors=True)
        self.weight_version += 1
        return self.weight_version

    def _flush(self) -> None:
        r = self._request("POST", "/flush_cache")
        if r.status_code >= 400:
            raise RuntimeError(f"SGLang flush_cache failed: HTTP {r.status_code}: {r.text[:500]}")

    def _load_lora(self, name: str, path: str) -> None:
        # LoadLoRAAdapterReqInput fields (srt/managers/io_struct.py); 200 or 400 with LoRAUpdateOutput
        self._post_ok("/load_lora_adapter", {"lora_name": name, "lora_path": path}, "load_lora_adapter")

    def _unload_lora(self, name: str) -> None:
        self._post_ok("/unload_lora_adapter", {"lora_name": name}, "unload_lora_adapter")

    def check_lora_server(self) -> None:
        """Check an already running server can serve this group's adapter, from ``GET /get_server_info``
        (SGLang's ``ServerArgs`` as a dict): ``enable_lora`` on and ``max_lora_rank`` (when the server reports
        one) >= ``lora.r``. A server without that endpoint or those keys is not checked here (its
        ``/load_lora_adapter`` answer then says what is wrong).

        Raises:
            ValueError: the server runs without ``--enable-lora`` or with a smaller ``--max-lora-rank``.
        """
        if self.lora_name is None:
            return
        r = self._request("GET", "/get_server_info")
        if r.status_code != 200:
            return
        try:
            info = r.json()
        except ValueError:
            return
        if not isinstance(info, Mapping) or "enable_lora" not in info:
            return
        if not info.get("enable_lora"):
            raise ValueError(
                f"the SGLang server at {self.url} runs without --enable-lora, so it cannot serve LoRA group "
                f"{self.lora_name!r}: restart it with --enable-lora --max-lora-rank {self.lora.r}"
            )
        rank = info.get("max_lora_rank")
        if isinstance(rank, int) and rank < int(self.lora.r):
            raise ValueError(
                f"the SGLang server at {self.url} has --max-lora-rank {rank} < lora.r={self.lora.r} of group "
                f"{self.lora_name!r}: restart it with --max-lora-rank >= {self.lora.r}"
            )

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
        self._close_http()
        if self._tmp_weight_dir is not None:
            self._tmp_weight_dir.cleanup()

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this SGLang backend is closed")
        if self._asleep:
            raise RuntimeError("this SGLang backend is asleep (memory released); call wake() first")

"""What the HTTP-server backends (``sglang_http``, ``vllm_http``) share: launching the server as a subprocess
on a free port, waiting for its health endpoint, an ``httpx`` client with connect retries and clear errors,
stopping the process, and writing the folders a disk weight sync hands the server (a Hugging Face checkpoint,
a PEFT adapter). Also the request-side checks every token-id backend makes (prompts, per-prompt sampling,
the defensive stop-string cut).

Nothing here imports torch, httpx or safetensors at module import time.
The client of :class:`HTTPServerClient` bounds each whole request by ``timeout`` (``mas_envs.deadline_http``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas_train.backends.base import SamplingParams

if TYPE_CHECKING:
    import httpx
    import torch

logger = logging.getLogger(__name__)

__all__ = [
    "HTTPServerClient",
    "LoRAAdapterSync",
    "earliest_stop",
    "free_port",
    "load_initial_adapter",
    "named_tensor_list",
    "per_prompt_sampling",
    "start_server_process",
    "stop_server_process",
    "validate_prompts",
    "write_hf_checkpoint",
    "write_peft_adapter",
]


# -- request-side checks ------------------------------------------------------------------------------------


def per_prompt_sampling(
    prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    """One :class:`SamplingParams` per prompt.

    Raises:
        ValueError: a list of another length than the prompts.
    """
    if isinstance(sampling, SamplingParams):
        return [sampling] * len(prompt_ids)
    sampling = list(sampling)
    if len(sampling) != len(prompt_ids):
        raise ValueError(
            f"got {len(prompt_ids)} prompts but {len(sampling)} SamplingParams; pass one, or one per prompt"
        )
    return sampling


def validate_prompts(prompt_ids: Sequence[Sequence[int]], engine: str = "SGLang") -> list[list[int]]:
    """The prompts as ``list[list[int]]``.

    Raises:
        ValueError: an empty prompt (engines need at least one input token).
    """
    prompts = [[int(t) for t in p] for p in prompt_ids]
    for k, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {k} is empty; {engine} needs at least one input token")
    return prompts


def named_tensor_list(
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs from a mapping or an iterable of pairs.

    Raises:
        ValueError: no tensors.
    """
    items = list(named_tensors.items()) if isinstance(named_tensors, Mapping) else list(named_tensors)
    if not items:
        raise ValueError("update_weights got no tensors")
    return items


def earliest_stop(
    completion_ids: Sequence[int], stops: Sequence[str], tokenizer: Any
) -> tuple[int, str] | None:
    """Index ``i`` of the first token after which the decoded completion contains a stop string, and that string.

    Guards against servers that let generation run past a stop string (e.g. one that ends inside a
    multi-character token). Containing a stop string is monotone in the prefix length, so after one full
    decode (the common no-stop case) a binary search needs O(log T) more decodes. ``None`` when no stop string
    occurs (or there is no tokenizer to decode with).
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


# -- folders a disk weight sync writes -----------------------------------------------------------------------


def write_hf_checkpoint(
    named_tensors: Sequence[tuple[str, torch.Tensor]],
    out_dir: str | os.PathLike,
    *,
    model_config: Any = None,
    source_dir: str | os.PathLike | None = None,
) -> Path:
    """Write ``named_tensors`` as a Hugging Face checkpoint folder a server reloads its weights from (SGLang's
    ``update_weights_from_disk``, vLLM's ``reload_weights``).

    Weights go to ``model.safetensors`` (on CPU and contiguous; a tensor sharing memory with an earlier one,
    e.g. tied embeddings, is written as its own copy, which safetensors requires). The config comes from ``model_config.save_pretrained`` when
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
            "cannot write a checkpoint for a disk weight sync without a config: pass model_config= "
            "(e.g. model.config) or a model_path folder that has config.json"
        )
    state: dict[str, Any] = {}
    seen: set[int] = set()
    for name, t in named_tensors:
        t = t.detach().to("cpu")
        ptr = t.untyped_storage().data_ptr()
        # safetensors refuses tensors sharing memory (tied embeddings): copy only those, not all 0.5 GB
        if ptr in seen or not t.is_contiguous():
            t = t.contiguous().clone()
        seen.add(t.untyped_storage().data_ptr())
        state[name] = t
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_peft_adapter(
    named_tensors: Sequence[tuple[str, torch.Tensor]],
    adapter_name: str,
    lora: Any,
    out_dir: str | os.PathLike,
) -> Path:
    """Write one adapter's tensors as a PEFT adapter folder (what SGLang's and vLLM's ``load_lora_adapter`` read).

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


# -- the server process --------------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_server_process(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` (a server) in its own process group, with ``env`` on top of this process's environment.

    Its own group so :func:`stop_server_process` also stops the workers the server forks (vLLM's engine core),
    and a Ctrl-C in the terminal reaches only us; the server's output goes to our stdout/stderr.
    """
    proc_env = {**os.environ, **(env or {})}
    return subprocess.Popen(list(cmd), env=proc_env, start_new_session=True)  # noqa: S603 - typed arguments


def stop_server_process(process: subprocess.Popen | None, timeout: float = 30.0, grace: float = 10.0) -> None:
    """Stop a server started by :func:`start_server_process`, and every process it forked.

    SIGTERM goes to the server alone first, so it shuts its workers down in order (vLLM's engine core and
    workers free their shared-memory queues then; a SIGTERM to all at once can leak them in ``/dev/shm``).
    After it exits (SIGKILL after ``timeout`` seconds), processes left in its group get ``grace`` seconds to
    finish, then SIGKILL. Nothing happens for a process that has already exited.
    """
    if process is None or process.poll() is not None:
        return
    try:
        pgid = os.getpgid(process.pid)
    except ProcessLookupError:
        return
    own = pgid != os.getpgid(0)  # a process started without its own group: only it is ours to signal
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
    if not own:
        return
    deadline = time.monotonic() + grace
    try:
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)  # raises once no process of the group is left
            time.sleep(0.2)
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class HTTPServerClient:
    """HTTP plumbing of a backend that talks to one generation server.

    Subclasses call :meth:`_init_http` and set ``server_name`` (for messages, e.g. ``"SGLang"``) and
    ``launch_hint`` (how to start the server by hand).

    Connect retries are the client transport's (``httpx.HTTPTransport(retries=connect_retries - 1)``: only
    connection failures are retried, with httpcore's exponential backoff, so a request that reached the server
    is never repeated). A client passed in keeps its own transport.
    """

    server_name = "generation"
    launch_hint = "is the server running?"

    def _init_http(
        self,
        url: str,
        client: httpx.Client | None,
        timeout: float,
        connect_retries: int,
        process: subprocess.Popen | None,
    ) -> None:
        from mas_envs.deadline_http import deadline_client

        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.connect_retries = max(1, int(connect_retries))
        self._owns_client = client is None
        if client is None:  # the timeout bounds each whole request, not one socket read
            client = deadline_client(self.timeout, retries=self.connect_retries - 1, base_url=self.url)
        self.client = client
        self._process = process

    def wait_until_healthy(self, timeout: float = 300.0, poll: float = 0.5) -> None:
        """Poll ``GET /health`` until it answers 200.

        A readiness wait, not a connect retry: a server loading its weights answers nothing for minutes, and an
        owned server process that dies must end the wait at once, which httpx's transport retries cannot do.

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
                    f"{self.server_name} server process exited with code {self._process.returncode} during "
                    "start-up; see its log above"
                )
            try:
                r = self.client.get("/health")
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(poll)
        raise TimeoutError(
            f"{self.server_name} server at {self.url} not healthy after {timeout:.0f}s (last: {last})"
        )

    def _request(self, method: str, path: str, payload: Any = None) -> httpx.Response:
        """One request; the timeout and the connect retries live on the client.

        Raises:
            ConnectionError: the server cannot be reached after ``connect_retries`` attempts.
            TimeoutError: no answer within ``timeout`` seconds.
        """
        import httpx

        try:
            return self.client.request(method, path, json=payload)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise ConnectionError(
                f"cannot reach the {self.server_name} server at {self.url}{path} after {self.connect_retries} "
                f"attempts ({type(e).__name__}: {e}); {self.launch_hint}"
            ) from None
        except httpx.TimeoutException:
            raise TimeoutError(
                f"{self.server_name} {method} {self.url}{path} did not send its whole answer within "
                f"{self.timeout:g} s; raise backend_options.timeout for long generations, or check the server"
            ) from None
        except httpx.TransportError as e:  # the connection closed mid-answer, a malformed HTTP reply...
            raise ConnectionError(
                f"{self.server_name} {method} {self.url}{path} failed: {type(e).__name__}: {e}; the server closed "
                "the connection or is not an HTTP server; check its log, or that the URL names it"
            ) from None

    def _json(self, response: httpx.Response, path: str) -> Any:
        """The reply's JSON body.

        Raises:
            RuntimeError: the body is not JSON (one line naming the URL and the start of the body).
        """
        try:
            return response.json()
        except ValueError:
            raise RuntimeError(
                f"{self.server_name} {self.url}{path} answered HTTP {response.status_code} with a body that is "
                f"not JSON ({response.text[:120]!r}); check that the URL names a {self.server_name} server"
            ) from None

    def _close_http(self) -> None:
        """Close the client (if created here) and stop an owned server process."""
        if self._owns_client:
            self.client.close()
        stop_server_process(self._process)


class LoRAAdapterSync:
    """Adapter-only weight sync of a LoRA model group, shared by the SGLang backends and ``vllm_http``.

    A new version is written as a fresh PEFT folder ``adapter_root/<name>-v<N>`` and made the served one; the
    previous folder is deleted once the new one is loaded. SGLang has no in-place update of a loaded adapter
    from a folder: ``load_lora_adapter`` refuses a name that is loaded ("... because it is already loaded",
    ``srt/lora/lora_manager.py::validate_new_adapter``), so there a new version is
    ``unload_lora_adapter(lora_name)`` then ``load_lora_adapter(lora_name, lora_path)``. Subclasses set ``lora_name``, ``lora`` and ``adapter_root`` and implement
    ``_load_lora`` / ``_unload_lora`` with the transport's call. A server that replaces a loaded adapter in
    place (vLLM's ``load_inplace``) sets ``reload_in_place = True``: no unload before the load.
    """

    reload_in_place = False

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
                f"LoRA adapter {self.lora_name!r} is not loaded into the server yet: call load_adapter() or "
                "update_weights() with the adapter's tensors first"
            )
        return {"lora_path": [self.lora_name] * n}

    def _push_adapter(self, items: Sequence[tuple[str, torch.Tensor]], version: int) -> Path:
        """Write ``items`` to ``adapter_root/<name>-v<version>`` and make it the served version of the adapter:
        unload the old one (if loaded), load the new one; on a failed load the old version is loaded back."""
        target = self.adapter_root / f"{self.lora_name}-v{version}"
        write_peft_adapter(items, self.lora_name, self.lora, target)
        previous = self.adapter_path
        if previous is not None and not self.reload_in_place:
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
        ``weight_version``; returns the PEFT folder the server loaded.

        Raises:
            RuntimeError: this backend serves no adapter, or the server refused the load (its message
                included).
            ValueError: a tensor that is not the adapter's.
        """
        if self.lora_name is None:
            raise RuntimeError("this backend serves no LoRA adapter (no lora_name)")
        return self._push_adapter(named_tensor_list(named_tensors), int(getattr(self, "weight_version", 0)))


def load_initial_adapter(backend: Any, model: Any) -> Any:
    """Load a LoRA group's adapter as it is at start-up (the PeftModel's), so the first requests already
    select it; nothing for a full fine-tune or without a model. Returns ``backend``.

    Raises:
        ValueError: the model has no adapter of the group's name (the backend is closed).
        RuntimeError: the server refused the load (the backend is closed).
    """
    if backend.lora_name is None or model is None:
        return backend
    from mas_train.lora import adapter_state

    tensors = adapter_state(model, backend.lora_name)
    if not tensors:
        backend.close()
        raise ValueError(
            f"model group {backend.lora_name!r} has a lora section but its model has no adapter of that name"
        )
    try:
        backend.load_adapter(tensors)
    except BaseException:
        backend.close()
        raise
    return backend

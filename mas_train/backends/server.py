"""What the HTTP-server backends (``sglang_http``, ``vllm_http``) share: launching the server as a subprocess
on a free port, waiting for its health endpoint, an ``httpx`` client with connect retries and clear errors, and
stopping the process.

The folders a disk weight sync hands the server (a Hugging Face checkpoint, a PEFT adapter) and the LoRA
adapter sync live in :mod:`mas_train.backends.weight_sync`, the request-side checks every token-id backend makes
(prompts, per-prompt sampling, the defensive stop-string cut) in :mod:`mas_train.backends.checks`; both are
importable from here too.

Nothing here imports torch, httpx or safetensors at module import time.
The client of :class:`HTTPServerClient` bounds each whole request by ``timeout`` (``retrieval_index.deadline_http``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mas_train.backends.checks import earliest_stop, named_tensor_list, per_prompt_sampling, validate_prompts
from mas_train.backends.weight_sync import (
    LoRAAdapterSync,
    load_initial_adapter,
    write_hf_checkpoint,
    write_peft_adapter,
)
from mas_train.net import free_port

if TYPE_CHECKING:
    import httpx

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
        from retrieval_index.deadline_http import deadline_client

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

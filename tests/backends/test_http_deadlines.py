"""The HTTP clients' timeout bounds a whole request, and every failure is one error naming the URL.

Local misbehaving servers on 127.0.0.1 (raw sockets, each bounded in time so a test of the old per-read
timeouts ends too): one that trickles its reply a byte at a time (headers or body), one that never answers,
one that answers garbage, one that closes the connection. Clients: the vLLM and SGLang HTTP backends, the
OpenAI backend and the retrieval client.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from retrieval_index.deadline_http import DeadlineTransport, deadline_client

LIFETIME_S = 8.0  # each connection is dropped after this, so a client without a deadline still ends


class BadServer:
    """Accepts connections on 127.0.0.1 and misbehaves per ``mode`` on each one."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> None:
        conn.settimeout(2.0)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0
        )
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk

    def _trickle(self, conn: socket.socket, data: bytes, end: float) -> None:
        for i in range(len(data)):
            if self._stop.is_set() or time.monotonic() > end:
                return
            conn.sendall(data[i : i + 1])
            time.sleep(0.05)

    def _handle(self, conn: socket.socket) -> None:
        end = time.monotonic() + LIFETIME_S
        try:
            self._read_request(conn)
            if self.mode == "hang":
                while not self._stop.is_set() and time.monotonic() < end:
                    time.sleep(0.05)
            elif self.mode == "close":
                pass
            elif self.mode == "garbage":
                body = b"<html>this is not json"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % len(body)
                    + body
                )
            elif self.mode == "trickle_body":  # endless: a body far longer than the lifetime
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                )
                self._trickle(conn, b" " * 100000, end)
            elif self.mode == "trickle_headers":
                self._trickle(conn, b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 100000 + b"\r\n\r\n{}", end)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(2)

    def __enter__(self) -> BadServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the test inspects it
        return time.monotonic() - t0, err
    return time.monotonic() - t0, None


# -- the transport itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["trickle_body", "trickle_headers", "hang"])
def test_deadline_transport_bounds_the_whole_request(mode):
    with BadServer(mode) as srv, deadline_client(1.0) as client:
        took, err = _timed(lambda: client.get(srv.url + "/x"))
    assert isinstance(err, httpx.TimeoutException), err
    assert took < 1.5, took


def test_deadline_transport_serves_a_normal_request_and_reuses_the_connection():
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app = FastAPI()

    @app.get("/hi")
    def hi():
        return PlainTextResponse("hello")

    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        _wait_port(port)
        with httpx.Client(transport=DeadlineTransport(2.0)) as client:
            assert [client.get(f"http://127.0.0.1:{port}/hi").text for _ in range(3)] == ["hello"] * 3
    finally:
        server.should_exit = True
        t.join(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int) -> None:
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("server did not start")


# -- generation backends -------------------------------------------------------------------------------------


def _vllm(url):
    from mas_train.backends.base import SamplingParams
    from mas_train.backends.vllm.http import VLLMHTTPBackend

    b = VLLMHTTPBackend(url, timeout=1.0, connect_retries=1, served_model="m")
    return lambda: b.generate([[1, 2]], SamplingParams(max_new_tokens=1))


def _sglang(url):
    from mas_train.backends.base import SamplingParams
    from mas_train.backends.sglang.http import SGLangHTTPBackend

    b = SGLangHTTPBackend(url, timeout=1.0, connect_retries=1)
    return lambda: b.generate([[1, 2]], SamplingParams(max_new_tokens=1))


BACKENDS = {"vllm": (_vllm, "/v1/completions"), "sglang": (_sglang, "/generate")}


@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize("mode", ["trickle_body", "trickle_headers", "hang"])
def test_backend_times_out_on_the_whole_request_naming_the_url(name, mode):
    make, path = BACKENDS[name]
    with BadServer(mode) as srv:
        took, err = _timed(make(srv.url))
    assert isinstance(err, TimeoutError), repr(err)
    assert f"{srv.url}{path}" in str(err) and "1 s" in str(err) and "backend_options.timeout" in str(err)
    assert took < 1.5, took


@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize(
    "mode, kind, needle", [("garbage", RuntimeError, "not JSON"), ("close", ConnectionError, "closed")]
)
def test_backend_garbage_or_closed_connection_is_one_error_naming_the_url(name, mode, kind, needle):
    make, path = BACKENDS[name]
    with BadServer(mode) as srv:
        took, err = _timed(make(srv.url))
    assert isinstance(err, kind), repr(err)
    assert f"{srv.url}{path}" in str(err) and needle in str(err)
    assert err.__cause__ is None and err.__suppress_context__  # one error, not a chained traceback
    assert took < 1.5


@pytest.mark.parametrize("mode", ["trickle_body", "hang"])
def test_openai_backend_attempt_is_bounded_by_timeout_s(mode):
    pytest.importorskip("openai")
    from mas_train.backends.base import SamplingParams
    from mas_train.backends.openai import OpenAIBackend, OpenAIBackendError, OpenAIOptions

    with BadServer(mode) as srv:
        opts = OpenAIOptions(base_url=srv.url + "/v1", model="m", timeout_s=1.0, max_retries=1)
        backend = OpenAIBackend(opts, tokenizer=None)
        took, err = _timed(
            lambda: backend.generate_messages([[{"role": "user", "content": "hi"}]], SamplingParams())
        )
        backend.close()
    assert isinstance(err, OpenAIBackendError), repr(err)
    assert srv.url + "/v1" in str(err) and "timeout_s=1.0" in str(err)
    assert took < 2 * 1.0 + 1.5, took  # two attempts of 1 s plus the client's backoff (<= 1 s)


def test_openai_defaults_are_stated_and_bounded():
    from mas_train.backends.openai import OpenAIOptions

    o = OpenAIOptions(base_url="http://127.0.0.1:1/v1", model="m")
    assert (o.timeout_s, o.max_retries) == (60.0, 2)


# -- the retrieval client ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["trickle_body", "hang"])
def test_remote_retriever_is_bounded_by_its_timeout(mode):
    from retrieval_index.client import RemoteRetriever, RetrieverUnavailableError

    with BadServer(mode) as srv:
        r = RemoteRetriever(srv.url, timeout=1.0, max_retries=0)
        took, err = _timed(lambda: r.search(["q"]))
    assert isinstance(err, RetrieverUnavailableError), repr(err)
    assert f"{srv.url}/retrieve -> no whole answer within timeout=1 s" in str(err)
    assert took < 1.5, took


def test_remote_retriever_garbage_names_the_url():
    from retrieval_index.client import RemoteRetriever

    with BadServer("garbage") as srv:
        r = RemoteRetriever(srv.url, timeout=1.0, max_retries=0)
        took, err = _timed(lambda: r.search(["q"]))
    assert isinstance(err, ValueError) and f"{srv.url}/retrieve" in str(err) and "not JSON" in str(err), err


def test_remote_retriever_defaults_fail_a_hung_server_in_about_20_s():
    from retrieval_index.client import RemoteRetriever

    r = RemoteRetriever("http://127.0.0.1:1")
    assert (r.timeout, r.max_retries, r.backoff) == (10.0, 1, 0.5)

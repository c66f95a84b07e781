"""An ``httpx`` transport whose timeout bounds a whole request: connect, send, and reading the full reply.

httpx's own timeouts bound each socket operation, so a peer that trickles one byte per second (or sends an
endless body) keeps a request with ``timeout=5`` alive for as long as it likes. :class:`DeadlineTransport` sets
a deadline when a request starts and gives every connect, TLS handshake, write and read of that request only
the time left (``min(per-operation timeout, deadline - now)``); once it has passed, the next operation raises
``httpx.ConnectTimeout`` / ``WriteTimeout`` / ``ReadTimeout`` (the text says the deadline passed). So a
request returns or fails within ``timeout_s`` plus the scheduling slack of one socket call (milliseconds),
whatever the peer does.

It speaks HTTP/1.1 through ``httpcore.ConnectionPool`` (public API) with a network backend that wraps
``httpcore.SyncBackend``; no proxy support (the servers it is used for are local or named directly). Used by
the HTTP generation backends (``mas_train.backends``), the OpenAI backend's client and
``retrieval_index.RemoteRetriever``.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

__all__ = ["DeadlineTransport", "deadline_client"]

# The deadline of the request this thread is running (monotonic seconds). The transport sets it when a request
# starts and again before each chunk of its body is read, so pooled connections shared by sequential requests
# and bodies read after the headers all see their own request's deadline.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("mas_rl_http_deadline", default=None)


def _left(timeout: float | None, exc: type[Exception], what: str) -> float | None:
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise exc(f"the request's deadline passed before {what}")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout, "the reply was read"))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout, "the request was sent"))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None):
        t = _left(timeout, httpcore.ConnectTimeout, "the TLS handshake")
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, t))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        t = _left(timeout, httpcore.ConnectTimeout, "a connection was made")
        return _Stream(self._inner.connect_tcp(host, port, t, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        t = _left(timeout, httpcore.ConnectTimeout, "a connection was made")
        return _Stream(self._inner.connect_unix_socket(path, t, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@contextlib.contextmanager
def _as_httpx(request: httpx.Request) -> Iterator[None]:
    """httpcore's exceptions as httpx's of the same name (httpx's own transport does the same)."""
    try:
        yield
    except httpcore.TimeoutException as err:
        cls = getattr(httpx, type(err).__name__, httpx.TimeoutException)
        raise cls(str(err) or type(err).__name__, request=request) from err
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as err:
        cls = getattr(httpx, type(err).__name__, httpx.TransportError)
        raise cls(str(err) or type(err).__name__, request=request) from err


class _Body(httpx.SyncByteStream):
    def __init__(self, inner: Iterable[bytes], deadline: float, request: httpx.Request) -> None:
        self._inner, self._deadline, self._request = inner, deadline, request

    def __iter__(self) -> Iterator[bytes]:
        it = iter(self._inner)
        while True:
            _DEADLINE.set(self._deadline)
            with _as_httpx(self._request):
                try:
                    chunk = next(it)
                except StopIteration:
                    return
            yield chunk

    def close(self) -> None:
        if hasattr(self._inner, "close"):
            self._inner.close()


_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's defaults


class DeadlineTransport(httpx.BaseTransport):
    """HTTP/1.1 transport with a deadline of ``timeout_s`` seconds over each whole request.

    Args:
        timeout_s: seconds from the start of a request to the last byte of its reply, > 0. The client's own
            per-operation timeouts still apply inside it.
        retries: connection attempts after the first one fails (httpcore's connect retries, with its
            backoff), all inside the deadline.
        verify: TLS verification, as httpx's ``verify``.
        limits: connection-pool limits.

    Raises:
        ValueError: ``timeout_s <= 0`` or ``retries < 0``.
    """

    def __init__(
        self,
        timeout_s: float,
        *,
        retries: int = 0,
        verify: bool | str = True,
        limits: httpx.Limits = _LIMITS,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.timeout_s = float(timeout_s)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            retries=retries,
            network_backend=_Backend(),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = time.monotonic() + self.timeout_s
        _DEADLINE.set(deadline)
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx(request):
            resp = self._pool.handle_request(req)
        stream = resp.stream
        # a synchronous connection pool answers with a synchronous body
        assert isinstance(stream, Iterable), "httpcore's sync pool returned an async body"
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_Body(stream, deadline, request),
            extensions=resp.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def deadline_client(timeout_s: float, *, retries: int = 0, **kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` whose requests each finish (or fail) within ``timeout_s`` seconds in all.

    Args:
        timeout_s: the whole-request deadline (also the client's per-operation timeout).
        retries: connection attempts after a failed one (see :class:`DeadlineTransport`).
        kwargs: other ``httpx.Client`` arguments (``base_url``, ``headers``...).
    """
    return httpx.Client(timeout=timeout_s, transport=DeadlineTransport(timeout_s, retries=retries), **kwargs)

"""FastAPI retrieval service, wire-compatible with Search-R1's ``retrieval_server.py``.

``POST /retrieve`` accepts both request shapes in use:

* Search-R1 batch: ``{"queries": ["q1", "q2"], "topk": 3, "return_scores": true}``
* single query (SkyRL / Dr. MAS search tool): ``{"query": "q1", "topk": 3, "return_scores": true}``

and answers ``{"result": [[{"document": {"id", "title", "contents"}, "score": s}, ...], ...]}`` (one list
per query; a single query gives a list of one list). With ``return_scores`` false (the Search-R1 default)
each hit is the bare document ``{"id", "title", "contents"}``.

``GET /health`` returns ``{"status": "ok", "num_documents", "encoder", "index_type"}``.

Limits (:class:`Limits`, all per request; ``mas-index serve --help`` sets them):

* the body: at most ``max_body_bytes`` (1 MiB) or **413**, refused from its ``Content-Length`` before it is
  read, or as soon as a streamed body passes the limit (so a 200 MB body never reaches memory);
* fields, strictly typed (**422**): ``queries`` a list of strings or ``query`` a string (exactly one),
  ``topk`` an integer (not ``"3"``, not ``true``), ``return_scores`` a boolean; every query non-empty after
  stripping, valid Unicode (a lone surrogate such as ``"\\ud800"`` is refused), at most ``max_query_chars``;
  1 to ``max_queries`` queries; ``topk`` 1 to ``max_topk``;
* the work: ``max_total_chars`` characters over all queries (**422**); encoding costs about linear time in it.

Fairness: the queries of a request are encoded and searched in chunks of at most ``chunk_chars`` characters
(and ``chunk_queries`` queries), shortest first, and each chunk takes its turn at the index in arrival order
(a FIFO ticket lock), so a short request that arrives while a long one runs waits for at most the chunk in
progress plus one chunk of each request queued before it, never for the whole long request.

Authentication: with ``token`` set every route needs ``Authorization: Bearer <token>`` (**401** otherwise);
use it whenever the service is bound beyond loopback. A failing search is answered **500**; none of these
stop the server. :func:`serve` binds ``127.0.0.1`` unless told otherwise (Search-R1 binds ``0.0.0.0``, which
exposes the index to the network) and warns when bound elsewhere without a token.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

__all__ = ["FairLock", "Limits", "chunk_queries", "create_app", "serve"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Per-request limits of the service."""

    max_queries: int = 512
    """queries per request (Search-R1 clients send one rollout batch at a time)"""
    max_query_chars: int = 1024
    """characters per query (the search envs already cut queries to 512)"""
    max_total_chars: int = 65536
    """characters over all queries of one request: encoding costs ~1 ms per character on a CPU, so this bounds
    how long one request can hold the (serialised) index"""
    max_topk: int = 100
    """passages per query"""
    default_topk: int = 3
    """topk when the request does not name one (Search-R1's default)"""
    max_body_bytes: int = 1 << 20
    """bytes of request body (1 MiB: 65536 characters of queries take at most ~400 kB as JSON)"""
    chunk_chars: int = 1024
    """characters of queries encoded per turn at the index (the fairness unit; see the module docstring)"""
    chunk_queries: int = 64
    """queries encoded per turn at the index"""


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    queries: list[StrictStr] | None = None
    query: StrictStr | None = None
    topk: StrictInt | None = None
    return_scores: StrictBool = False


class FairLock:
    """A FIFO (ticket) lock: threads get it in the order they asked, unlike ``threading.Lock``, whose
    releasing thread often takes it straight back, so a request looping over chunks would starve others."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> FairLock:
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            while self._serving != ticket:
                self._cond.wait()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


def chunk_queries(queries: Sequence[str], max_chars: int, max_queries: int) -> list[list[int]]:
    """Indices of ``queries`` in chunks, shortest queries first (less padding in a batch), each chunk at most
    ``max_queries`` queries and ``max_chars`` characters (a longer single query is a chunk of its own)."""
    order = sorted(range(len(queries)), key=lambda i: len(queries[i]))
    chunks: list[list[int]] = []
    cur: list[int] = []
    chars = 0
    for i in order:
        n = len(queries[i])
        if cur and (chars + n > max_chars or len(cur) >= max_queries):
            chunks.append(cur)
            cur, chars = [], 0
        cur.append(i)
        chars += n
    if cur:
        chunks.append(cur)
    return chunks


class _BodyLimit:
    """ASGI middleware: 413 for a body over ``limit`` bytes, by ``Content-Length`` or while it streams."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(send)
            return
        state = {"seen": 0, "refused": False, "sent": False}

        async def counting_receive() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                state["seen"] += len(message.get("body", b""))
                if state["seen"] > self.limit:
                    state["refused"] = True
                    raise _TooLarge
            return message

        async def guarded_send(message: dict) -> None:
            if state["refused"]:  # the app's answer to a body it could not read becomes the 413
                return
            state["sent"] = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not state["refused"]:
                raise
        if state["refused"] and not state["sent"]:
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(
            {"detail": f"request body over {self.limit} bytes; split the queries over several requests"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),  # never read (and discard) the rest of a huge body
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def _check_text(queries: Sequence[str]) -> str | None:
    for i, q in enumerate(queries):
        if not q.strip():
            return f"query {i} is empty; every query needs some text"
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"query {i} is not valid Unicode ({err.reason} at character {err.start}); send UTF-8 text"
    return None


def create_app(retriever, limits: Limits = Limits(), token: str | None = None):
    """Build the FastAPI app around any object with ``search(queries, topk) -> list[list[Passage]]``.

    Args:
        retriever: a :class:`retrieval_index.Retriever` (or anything implementing the protocol).
        limits: request limits (see the module docstring).
        token: when given, every route needs ``Authorization: Bearer <token>``.

    Returns:
        A ``fastapi.FastAPI`` instance (run it with uvicorn, or test it with ``fastapi.testclient.TestClient``).
    """
    from fastapi import Depends, FastAPI, Header, HTTPException

    def authorised(authorization: str = Header("")) -> None:
        if token is None:
            return
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": 'Bearer realm="retrieval"'}
            )

    app = FastAPI(
        title="mas-rl retrieval",
        description="Search-R1-compatible dense retrieval",
        dependencies=[Depends(authorised)],
    )
    meta = getattr(retriever, "meta", {}) or {}
    turn = FairLock()

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "num_documents": len(retriever) if hasattr(retriever, "__len__") else None,
            "encoder": meta.get("encoder", {}).get("name"),
            "index_type": meta.get("index", {}).get("type"),
        }

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> dict[str, Any]:
        # A sync handler runs in FastAPI's thread pool; Retriever.search holds its own lock.
        if (request.queries is None) == (request.query is None):
            raise HTTPException(
                422, 'send exactly one of "queries" (a list of strings) or "query" (a string)'
            )
        queries = request.queries if request.queries is not None else [request.query]
        topk = limits.default_topk if request.topk is None else request.topk
        problem = _check_text(queries)
        if problem is not None:
            raise HTTPException(422, problem)
        if not 1 <= len(queries) <= limits.max_queries:
            raise HTTPException(
                422, f"queries per request must be between 1 and {limits.max_queries}, got {len(queries)}"
            )
        longest = max(len(q) for q in queries)
        if longest > limits.max_query_chars:
            raise HTTPException(
                422, f"a query has {longest} characters; the limit is {limits.max_query_chars}"
            )
        total = sum(len(q) for q in queries)
        if total > limits.max_total_chars:
            raise HTTPException(
                422,
                f"the queries have {total} characters in all; the limit per request is {limits.max_total_chars}: "
                "split them over several requests",
            )
        if not 1 <= topk <= limits.max_topk:
            raise HTTPException(422, f"topk must be between 1 and {limits.max_topk}, got {topk}")
        hits: list[Any] = [None] * len(queries)
        try:
            for chunk in chunk_queries(queries, limits.chunk_chars, limits.chunk_queries):
                with turn:
                    found = retriever.search([queries[i] for i in chunk], topk)
                for i, h in zip(chunk, found, strict=True):
                    hits[i] = h
        except Exception as err:  # the service must keep running whatever one search does
            raise HTTPException(500, f"search failed: {type(err).__name__}: {err}") from err
        result = []
        for passages in hits:
            docs = [{"id": p.id, "title": p.title, "contents": p.contents} for p in passages]
            if request.return_scores:
                result.append(
                    [{"document": d, "score": p.score} for d, p in zip(docs, passages, strict=True)]
                )
            else:
                result.append(docs)
        return {"result": result}

    app.add_middleware(_BodyLimit, limit=limits.max_body_bytes)
    return app


def serve(
    retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits = Limits(),
    log_level: str = "warning",
    token: str | None = None,
):
    """Run the service with uvicorn until interrupted (blocks).

    Args:
        retriever: see :func:`create_app`.
        host: bind address; keep the loopback default unless the index may be reached from the network.
        port: TCP port.
        limits: request limits.
        log_level: uvicorn log level (per-request logging to a terminal slows the service down).
        token: require ``Authorization: Bearer <token>`` (see :func:`create_app`); a bind beyond loopback
            without one is warned about.
    """
    import ipaddress

    import uvicorn

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and token is None:
        log.warning(
            "retrieval server bound to %s without a token: anyone who can reach it can query the index; "
            "pass --token-env VAR (mas-index serve) or token= to require a bearer token",
            host,
        )
    uvicorn.run(create_app(retriever, limits, token=token), host=host, port=port, log_level=log_level)

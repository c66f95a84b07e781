"""FastAPI retrieval service, wire-compatible with Search-R1's ``retrieval_server.py``.

``POST /retrieve`` accepts both request shapes in use:

* Search-R1 batch: ``{"queries": ["q1", "q2"], "topk": 3, "return_scores": true}``
* single query (SkyRL / Dr. MAS search tool): ``{"query": "q1", "topk": 3, "return_scores": true}``

and answers ``{"result": [[{"document": {"id", "title", "contents"}, "score": s}, ...], ...]}`` (one list
per query; a single query gives a list of one list). With ``return_scores`` false (the Search-R1 default)
each hit is the bare document ``{"id", "title", "contents"}``.

``GET /health`` returns ``{"status": "ok", "num_documents", "encoder", "index_type"}``.

Requests over the limits (queries per request, characters per query, topk) are answered 422 with a message;
a failing search is answered 500; neither stops the server. :func:`serve` binds ``127.0.0.1`` unless told
otherwise (Search-R1 binds ``0.0.0.0``, which exposes the index to the network).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["Limits", "create_app", "serve"]


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


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    queries: list[str] | None = None
    query: str | None = None
    topk: int | None = None
    return_scores: bool = False


def create_app(retriever, limits: Limits = Limits()):
    """Build the FastAPI app around any object with ``search(queries, topk) -> list[list[Passage]]``.

    Args:
        retriever: a :class:`retrieval_index.Retriever` (or anything implementing the protocol).
        limits: request limits.

    Returns:
        A ``fastapi.FastAPI`` instance (run it with uvicorn, or test it with ``fastapi.testclient.TestClient``).
    """
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="mas-rl retrieval", description="Search-R1-compatible dense retrieval")
    meta = getattr(retriever, "meta", {}) or {}

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
        try:
            hits = retriever.search(queries, topk)
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

    return app


def serve(
    retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits = Limits(),
    log_level: str = "warning",
):
    """Run the service with uvicorn until interrupted (blocks).

    Args:
        retriever: see :func:`create_app`.
        host: bind address; keep the loopback default unless the index may be reached from the network.
        port: TCP port.
        limits: request limits.
        log_level: uvicorn log level (per-request logging to a terminal slows the service down).
    """
    import uvicorn

    uvicorn.run(create_app(retriever, limits), host=host, port=port, log_level=log_level)

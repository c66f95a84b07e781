"""HTTP client for a Search-R1-compatible retrieval service (``POST /retrieve``).

:class:`RemoteRetriever` implements the ``retrieval_index.types.Retriever`` protocol, so a search env can use
a server started with ``mas-index serve`` (or Search-R1's own ``retrieval_server.py``) instead of an
in-process index.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence

from .types import Passage

__all__ = ["RemoteRetriever", "RetrieverUnavailableError", "check_health"]


class RetrieverUnavailableError(RuntimeError):
    """Every URL failed on every attempt (connection refused, timeout or 5xx)."""


class RemoteRetriever:
    """Search through one or more retrieval servers speaking the Search-R1 wire format.

    Request: ``{"queries": [...], "topk": k, "return_scores": true}``;
    response: ``{"result": [[{"document": {"id", "title"?, "contents"}, "score": s}, ...], ...]}``.

    Args:
        urls: one URL or several (``http://host:port/retrieve``; a bare ``http://host:port`` gets ``/retrieve``
            appended). Calls start at the next URL in round-robin order, spreading load across servers.
        timeout: seconds per HTTP attempt in all (connect, send and the whole reply: a deadline, not a
            per-read timeout; ``retrieval_index.deadline_http``), default 10.
        max_retries: extra rounds after the first; each round tries every URL once. Total attempts =
            ``(max_retries + 1) * len(urls)``, default 1: a hung single server fails a search after
            ``2 * timeout + backoff`` = 20.5 s by default.
        backoff: seconds slept before retry round ``r`` is ``backoff * 2**(r-1)`` (exponential back-off).
        token: sent as ``Authorization: Bearer <token>`` to these URLs (``mas-index serve --token-env``).

    Retries cover connection errors, timeouts and HTTP 5xx. A 4xx answer (e.g. a request over the server's
    limits) is the caller's fault and is raised at once as ``ValueError`` with the server's message.
    """

    def __init__(
        self,
        urls: str | Sequence[str] = "http://127.0.0.1:8000/retrieve",
        *,
        timeout: float = 10.0,
        max_retries: int = 1,
        backoff: float = 0.5,
        token: str | None = None,
    ) -> None:
        import httpx

        from retrieval_index.deadline_http import deadline_client

        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("RemoteRetriever needs at least one URL")
        self.urls = [u if u.rstrip("/").endswith("/retrieve") else u.rstrip("/") + "/retrieve" for u in urls]
        if max_retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError("need max_retries >= 0, timeout > 0 and backoff >= 0")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self._token = token
        self._httpx = httpx
        self._client = deadline_client(timeout, headers=self._headers())
        self._next = itertools.count()
        self._lock = threading.Lock()

    def search(self, queries: list[str], topk: int = 3) -> list[list[Passage]]:
        """POST the queries and parse the ranked passages (see the class docstring for errors).

        Raises:
            RetrieverUnavailableError: all attempts on all URLs failed; the message lists the last error per URL.
            ValueError: the server answered 4xx, or the response is not in the expected format.
        """
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, not a single string; wrap it: [query]")
        queries = list(queries)
        if not queries:
            return []
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        with self._lock:
            first = next(self._next) % len(self.urls)
        order = self.urls[first:] + self.urls[:first]
        errors: dict[str, str] = {}
        for round_ in range(self.max_retries + 1):
            if round_:
                time.sleep(self.backoff * 2 ** (round_ - 1))
            for url in order:
                try:
                    response = self._client.post(url, json=payload)
                except self._httpx.TimeoutException:
                    errors[url] = f"no whole answer within timeout={self.timeout:g} s"
                    continue
                except self._httpx.HTTPError as err:  # connect errors, closed connections, protocol errors
                    errors[url] = f"{type(err).__name__}: {err}"
                    continue
                if response.status_code >= 500:
                    errors[url] = f"HTTP {response.status_code}: {response.text[:200]}"
                    continue
                if response.status_code >= 400:
                    raise ValueError(
                        f"retrieval server {url} rejected the request: HTTP {response.status_code} {response.text[:500]}"
                    )
                try:
                    body = response.json()
                except ValueError:
                    raise ValueError(
                        f"retrieval server {url} answered HTTP {response.status_code} with a body that is not "
                        f"JSON ({response.text[:120]!r}); check that the URL names a retrieval server"
                    ) from None
                return _parse(body, len(queries))
        attempts = (self.max_retries + 1) * len(self.urls)
        detail = "; ".join(f"{u} -> {e}" for u, e in errors.items())
        raise RetrieverUnavailableError(
            f"retrieval failed after {attempts} attempts over {len(self.urls)} URL(s): {detail}. "
            "Is the server running? Start one with `mas-index serve --index DIR`; a slow one: raise the "
            "retriever's timeout (retriever: {urls: [...], timeout: S})."
        ) from None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def __repr__(self) -> str:  # never the token
        return f"RemoteRetriever({self.urls!r}, timeout={self.timeout}, max_retries={self.max_retries})"

    def close(self) -> None:
        self._client.close()

    # The HTTP connection pool cannot be pickled; a copy (e.g. an env sent to a Ray worker) opens its own.
    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_client", "_httpx", "_next", "_lock")}

    def __setstate__(self, state: dict) -> None:
        import httpx

        from retrieval_index.deadline_http import deadline_client

        self.__dict__.update(state)
        self._httpx = httpx
        self._client = deadline_client(self.timeout, headers=self._headers())
        self._next = itertools.count()
        self._lock = threading.Lock()

    def __enter__(self) -> RemoteRetriever:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/retrieve")] if url.endswith("/retrieve") else url


def check_health(retriever: object, timeout: float = 5.0) -> str | None:
    """Probe the retrieval server(s) a search env will use; a warning message if any is down, else ``None``.

    Meant for start-up (the trainer calls it before the first rollout): the server may still be loading
    its index and come up later, so the caller warns rather than fails, and searches that fail meanwhile
    become ``Search error`` observations counted as ``retrieval_errors``.

    Args:
        retriever: the env's ``retriever`` argument. Only a URL (``http(s)://``) or a list of URLs is
            probed; anything else (``None`` for the bundled index, an index directory, an object) has no
            server to check and gives ``None``.
        timeout: seconds per URL request in all (connect, send, whole reply), > 0.

    Returns:
        ``None`` when every URL answers ``GET /health`` with 200 (``mas-index serve``), or, for servers
        without that route (Search-R1's ``retrieval_server.py`` answers 404), a one-query ``POST /retrieve``
        in the expected format. Otherwise one line naming each failing URL and why, and how to start a server.
    """
    if isinstance(retriever, dict):  # {"urls": [...], "timeout": s} (mas_envs.envs.search.resolve_retriever)
        retriever = retriever.get("urls", retriever.get("url"))
    urls = [retriever] if isinstance(retriever, str) else retriever
    if not isinstance(urls, (list, tuple)) or not urls:
        return None
    if not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
        return None
    import httpx

    from retrieval_index.deadline_http import deadline_client

    problems = []
    with deadline_client(timeout) as client:
        for url in urls:
            base = _base(url)
            try:
                response = client.get(base + "/health")
                if response.status_code == 404:  # a Search-R1 server: no /health, so ask it one query
                    response = client.post(
                        base + "/retrieve",
                        json={"queries": ["health check"], "topk": 1, "return_scores": True},
                    )
                    if response.status_code == 200:
                        _parse(response.json(), 1)
                if response.status_code != 200:
                    problems.append(f"{url} -> HTTP {response.status_code}")
            except httpx.HTTPError as err:
                problems.append(f"{url} -> {type(err).__name__}: {err}")
            except ValueError as err:  # JSON that is not the Search-R1 format
                problems.append(f"{url} -> {err}")
    if not problems:
        return None
    return (
        f"retrieval server not answering: {'; '.join(problems)}. Searches will return 'Search error' "
        "observations (logged as env/retrieval_errors) until it is up; start one with "
        "`mas-index serve --index DIR --port PORT`."
    )


def _parse(body: dict, num_queries: int) -> list[list[Passage]]:
    try:
        result = body["result"]
        if len(result) != num_queries:
            raise ValueError(f"expected {num_queries} result lists, got {len(result)}")
        out = []
        for hits in result:
            passages = []
            for hit in hits:
                # With return_scores=false Search-R1 returns bare documents instead of {"document", "score"}.
                doc, score = (hit["document"], hit.get("score")) if "document" in hit else (hit, None)
                contents = doc["contents"]
                title = doc.get("title") or contents.partition("\n")[0].strip().strip('"')
                passages.append(
                    Passage(
                        id=str(doc.get("id", "")),
                        title=title,
                        contents=contents,
                        score=None if score is None else float(score),
                    )
                )
            out.append(passages)
        return out
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(
            f"retrieval server answered in an unexpected format: {err!r}; body starts {str(body)[:200]}"
        ) from err

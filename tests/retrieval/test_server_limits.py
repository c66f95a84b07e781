"""The retrieval server bounds what one request can cost: body size (413), strict field types and text
(422), work per request (422), a fair share of the index for short requests behind long ones, and an optional
bearer token."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from _retrieval_fakes import HashEncoder, LiveServer
from fastapi.testclient import TestClient

from retrieval_index import server as srv
from retrieval_index.client import RemoteRetriever
from retrieval_index.index import Retriever
from retrieval_index.server import Limits, create_app


@pytest.fixture
def retriever(corpus_path):
    return Retriever.from_corpus(corpus_path, HashEncoder(), progress=False)


def test_a_body_over_the_limit_is_413_before_it_is_read(retriever):
    client = TestClient(create_app(retriever, Limits(max_body_bytes=1000)))
    r = client.post(
        "/retrieve",
        content=b'{"query": "' + b"x" * 2000 + b'"}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and "over 1000 bytes" in r.json()["detail"]

    def streamed():  # no Content-Length: counted while it arrives
        yield b'{"queries": ['
        for _ in range(500):
            yield b'"a",'
        yield b'"a"]}'

    r = client.post("/retrieve", content=streamed(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert client.post("/retrieve", json={"query": "Nile"}).status_code == 200  # still serving


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"query": "x", "topk": "3"}, "topk"),
        ({"query": "x", "topk": True}, "topk"),
        ({"query": "x", "topk": 2.0}, "topk"),
        ({"query": "x", "return_scores": "yes"}, "return_scores"),
        ({"queries": ["a", 1]}, "queries"),
        ({"query": 5}, "query"),
    ],
)
def test_field_types_are_strict(retriever, body, needle):
    r = TestClient(create_app(retriever)).post("/retrieve", json=body)
    assert r.status_code == 422 and needle in str(r.json()["detail"])


@pytest.mark.parametrize(
    "raw, message",
    [
        (b'{"query": ""}', "query 0 is empty"),
        (b'{"queries": ["Nile", "   "]}', "query 1 is empty"),
        (b'{"query": "ab\\ud800cd"}', "query 0 is not valid Unicode (surrogates not allowed at character 2)"),
    ],
)
def test_empty_queries_and_invalid_unicode_are_422(retriever, raw, message):
    client = TestClient(create_app(retriever))
    r = client.post("/retrieve", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and message in r.json()["detail"]


def test_chunks_cover_every_query_once_within_the_limits():
    queries = ["a" * n for n in (5, 300, 1, 50, 50, 120, 7, 2000)]
    chunks = srv.chunk_queries(queries, max_chars=200, max_queries=3)
    assert sorted(i for c in chunks for i in c) == list(range(len(queries)))
    for c in chunks:
        assert len(c) <= 3 and (len(c) == 1 or sum(len(queries[i]) for i in c) <= 200)
    assert chunks[0] == [2, 0, 6]  # shortest first


def test_results_of_a_chunked_request_keep_the_query_order(retriever):
    queries = ["capital of Mongolia", "Dookie", "Nile river Africa", "George Orwell novel", "x"]
    client = TestClient(create_app(retriever, Limits(chunk_chars=20, chunk_queries=2)))
    got = client.post("/retrieve", json={"queries": queries, "topk": 2, "return_scores": True}).json()[
        "result"
    ]
    want = retriever.search(queries, 2)
    assert [[h["document"]["id"] for h in hits] for hits in got] == [[p.id for p in hits] for hits in want]


def test_fair_lock_serves_in_arrival_order():
    lock, order = srv.FairLock(), []
    lock.__enter__()
    threads = []
    for i in range(5):
        t = threading.Thread(target=lambda i=i: (lock.__enter__(), order.append(i), lock.__exit__()))
        t.start()
        threads.append(t)
        time.sleep(0.05)  # each asks after the previous one
    lock.__exit__()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3, 4]


class _SlowRetriever:
    """Costs 1 ms per query character, like a CPU encoder (E5-base: ~1 ms per character on a loaded box)."""

    def __init__(self, inner):
        self.inner = inner

    def search(self, queries, topk):
        time.sleep(0.001 * sum(len(q) for q in queries))
        return self.inner.search(queries, topk)


def test_a_short_request_behind_a_long_one_waits_for_one_chunk_not_the_whole(retriever):
    app = create_app(_SlowRetriever(retriever), Limits(chunk_chars=200))
    with LiveServer(app) as server:
        long_body = {"queries": ["capital of Mongolia " * 5] * 30}  # 3000 characters: ~3 s of work
        took = {}

        def run(name, body):
            t0 = time.monotonic()
            r = httpx.post(server.url, json=body, timeout=30)
            took[name] = (time.monotonic() - t0, r.status_code)

        long_t = threading.Thread(target=run, args=("long", long_body))
        long_t.start()
        time.sleep(0.5)
        run("short", {"query": "Nile"})
        long_t.join(30)
    assert took["long"][1] == took["short"][1] == 200
    assert took["long"][0] >= 2.5
    # one chunk of 200 characters (0.2 s) plus its own 4 (0.004 s) and the HTTP round trip; the whole long
    # request would be ~2.5 s more
    assert took["short"][0] < 1.0, took


def test_bearer_token(retriever):
    client = TestClient(create_app(retriever, token="t0k3n"))
    assert client.post("/retrieve", json={"query": "Nile"}).status_code == 401
    assert client.get("/health").status_code == 401
    bad = client.post("/retrieve", json={"query": "Nile"}, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.headers["www-authenticate"].startswith("Bearer")
    ok = client.post("/retrieve", json={"query": "Nile"}, headers={"Authorization": "Bearer t0k3n"})
    assert ok.status_code == 200
    with LiveServer(create_app(retriever, token="t0k3n")) as server:
        assert RemoteRetriever(server.url, token="t0k3n").search(["Nile"], 1)[0][0].id == "d6"
        with pytest.raises(ValueError, match="HTTP 401"):
            RemoteRetriever(server.url).search(["Nile"], 1)
        assert "t0k3n" not in repr(RemoteRetriever(server.url, token="t0k3n"))

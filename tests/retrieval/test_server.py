"""The HTTP service (both request shapes, limits, health) and the RemoteRetriever client."""

from __future__ import annotations

import socket
import time

import pytest
from _retrieval_fakes import HashEncoder, LiveServer
from fastapi.testclient import TestClient

from retrieval_index.client import RemoteRetriever, RetrieverUnavailableError
from retrieval_index.index import Retriever
from retrieval_index.server import Limits, create_app


@pytest.fixture
def retriever(corpus_path):
    return Retriever.from_corpus(corpus_path, HashEncoder(), progress=False)


@pytest.fixture
def client(retriever):
    return TestClient(
        create_app(retriever, Limits(max_queries=4, max_query_chars=50, max_total_chars=120, max_topk=5))
    )


def test_search_r1_batch_shape_with_scores(client, retriever):
    r = client.post(
        "/retrieve", json={"queries": ["capital of Mongolia", "Dookie"], "topk": 2, "return_scores": True}
    )
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and [len(hits) for hits in result] == [2, 2]
    top = result[0][0]
    assert top["document"] == {
        "id": "d0",
        "title": "Ulaanbaatar",
        "contents": '"Ulaanbaatar"\nUlaanbaatar is the capital of Mongolia.',
    }
    expected = retriever.search(["capital of Mongolia"], 2)[0]
    assert [h["score"] for h in result[0]] == pytest.approx([p.score for p in expected])
    assert result[1][0]["document"]["id"] == "d3"


def test_single_query_shape_and_scores_off(client):
    r = client.post("/retrieve", json={"query": "who wrote Animal Farm"})
    assert r.status_code == 200
    result = r.json()["result"]
    # one list for the one query, default topk 3, bare documents because return_scores defaults to false
    assert len(result) == 1 and len(result[0]) == 3
    assert result[0][0] == {
        "id": "d2",
        "title": "Animal Farm",
        "contents": '"Animal Farm"\nAnimal Farm is a novel by George Orwell.',
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"queries": ["a"] * 5}, "between 1 and 4, got 5"),
        ({"queries": []}, "between 1 and 4, got 0"),
        ({"query": "x" * 51}, "51 characters; the limit is 50"),
        ({"queries": ["x" * 50, "y" * 50, "z" * 21]}, "121 characters in all; the limit per request is 120"),
        ({"query": "x", "topk": 6}, "topk must be between 1 and 5, got 6"),
        ({"query": "x", "topk": 0}, "topk must be between 1 and 5, got 0"),
        ({"query": "x", "queries": ["y"]}, "exactly one of"),
        ({"topk": 3}, "exactly one of"),
    ],
)
def test_limits_are_422_not_crashes(client, body, message):
    r = client.post("/retrieve", json=body)
    assert r.status_code == 422 and message in r.json()["detail"]
    assert client.get("/health").status_code == 200  # still serving


def test_malformed_body_is_422(client):
    assert client.post("/retrieve", json={"queries": "not a list"}).status_code == 422
    assert (
        client.post(
            "/retrieve", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 422
    )


def test_search_failure_is_500(corpus_path):
    class Broken:
        def search(self, queries, topk):
            raise RuntimeError("index corrupted")

    r = TestClient(create_app(Broken())).post("/retrieve", json={"query": "x"})
    assert r.status_code == 500 and "RuntimeError: index corrupted" in r.json()["detail"]


def test_health(client):
    body = client.get("/health").json()
    assert body == {"status": "ok", "num_documents": 7, "encoder": "test-hash-encoder", "index_type": "flat"}


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/retrieve"  # nothing listens here once the socket is closed


def test_remote_retriever_round_trip_and_round_robin(retriever):
    with LiveServer(create_app(retriever)) as server:
        remote = RemoteRetriever([_dead_url(), server.url], timeout=5, max_retries=0, backoff=0)
        for _ in range(3):  # whichever URL a call starts at, the live one answers
            hits = remote.search(["capital of Mongolia", "Dookie"], topk=2)
            assert [[p.id for p in h] for h in hits] == [
                [p.id for p in h] for h in retriever.search(["capital of Mongolia", "Dookie"], 2)
            ]
            assert hits[0][0].title == "Ulaanbaatar" and hits[0][0].score == pytest.approx(
                retriever.search(["capital of Mongolia"], 1)[0][0].score
            )
        remote.close()
        with RemoteRetriever(server.url) as other, pytest.raises(ValueError, match="HTTP 422"):
            other.search(["x"], topk=10_000)


def test_killed_server_fails_clearly_after_retries(retriever):
    with LiveServer(create_app(retriever)) as server:
        remote = RemoteRetriever(server.url, timeout=2, max_retries=2, backoff=0.05)
        assert remote.search(["Nile"], 1)[0][0].id == "d6"
    started = time.monotonic()
    with pytest.raises(RetrieverUnavailableError, match=r"after 3 attempts over 1 URL\(s\).*mas-index serve"):
        remote.search(["Nile"], 1)
    remote.close()
    assert time.monotonic() - started >= 0.05 + 0.1  # back-off 0.05 s then 0.1 s between the rounds


def test_remote_retriever_bare_base_url_and_validation():
    assert RemoteRetriever("http://127.0.0.1:9").urls == ["http://127.0.0.1:9/retrieve"]
    with pytest.raises(ValueError, match="at least one URL"):
        RemoteRetriever([])


def test_env_with_a_url_string_searches_through_the_server(retriever):
    import mas_envs
    from mas_envs.envs.search import Retriever as RetrieverProtocol

    assert isinstance(retriever, RetrieverProtocol)
    assert isinstance(RemoteRetriever("http://127.0.0.1:9"), RetrieverProtocol)
    with LiveServer(create_app(retriever)) as server:
        env = mas_envs.make("search-1agent", retriever=server.url)  # plain data, as a YAML config gives it
        env.reset(options={"task": {"question": "Capital of Mongolia?", "golden_answers": ["Ulaanbaatar"]}})
        env.step("<think>look it up</think><search>capital of Mongolia</search>")
        assert (
            "<information>Doc 1(Title: Ulaanbaatar) Ulaanbaatar is the capital of Mongolia."
            in env.observe("agent")
        )
    from mas_envs.envs.search import common

    common.resolve_retriever(server.url).close()  # the process-wide client made from the URL string
    common._cached_retriever.cache_clear()

"""`check_health`: the start-up probe of a retriever URL (issue 9, item 12). It did not exist before."""

from __future__ import annotations

import socket

import pytest
from _retrieval_fakes import HashEncoder, LiveServer
from fastapi import FastAPI

from retrieval_index import check_health
from retrieval_index.index import Retriever
from retrieval_index.server import create_app


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/retrieve"


@pytest.fixture
def live(corpus_path):
    with LiveServer(create_app(Retriever.from_corpus(corpus_path, HashEncoder(), progress=False))) as server:
        yield server


def test_a_live_mas_index_server_is_healthy(live):
    assert check_health(live.url) is None
    assert check_health(live.url.removesuffix("/retrieve")) is None  # a bare base URL works too
    assert check_health([live.url, live.url]) is None


def test_a_closed_port_gives_one_warning_line_naming_the_url():
    url = _closed_port_url()
    warning = check_health(url, timeout=2)
    assert warning.startswith(f"retrieval server not answering: {url} -> ConnectError")
    assert "mas-index serve" in warning and "\n" not in warning


def test_only_the_dead_url_of_several_is_named(live):
    dead = _closed_port_url()
    warning = check_health([live.url, dead], timeout=2)
    assert f"{dead} -> ConnectError" in warning and live.url not in warning


def test_a_search_r1_server_without_health_is_probed_with_one_query():
    app = FastAPI()
    seen = []

    @app.post("/retrieve")
    def retrieve(body: dict):
        seen.append(body)
        return {"result": [[{"document": {"id": "1", "contents": '"T"\nx'}, "score": 0.5}]]}

    with LiveServer(app) as server:
        assert check_health(server.url) is None
    assert seen == [{"queries": ["health check"], "topk": 1, "return_scores": True}]


def test_a_server_answering_500_or_a_wrong_format_is_reported():
    app = FastAPI()

    @app.get("/health")
    def health():
        from fastapi.responses import JSONResponse

        return JSONResponse({"status": "loading"}, status_code=503)

    with LiveServer(app) as server:
        assert check_health(server.url).startswith(
            f"retrieval server not answering: {server.url} -> HTTP 503"
        )

    other = FastAPI()

    @other.post("/retrieve")
    def retrieve(body: dict):
        return {"hits": []}

    with LiveServer(other) as server:
        assert "unexpected format" in check_health(server.url)


@pytest.mark.parametrize("spec", [None, "indexes/wiki18", [], ["indexes/a"], object()])
def test_specs_without_a_server_are_not_probed(spec):
    assert check_health(spec) is None

"""A URL retriever's client options are configurable, and a hung retrieval service fails a search with one
clear error after that timeout (an observation for the agents; the episode goes on)."""

from __future__ import annotations

import time

import pytest

import mas_envs
from mas_envs.envs.search.common import check_retriever_arg, resolve_retriever, run_search
from tests.backends.test_http_deadlines import BadServer


def test_a_mapping_retriever_sets_the_client_timeout():
    r = resolve_retriever({"urls": ["http://127.0.0.1:9/retrieve"], "timeout": 2.5, "max_retries": 0})
    assert (r.urls, r.timeout, r.max_retries) == (["http://127.0.0.1:9/retrieve"], 2.5, 0)
    with pytest.raises(TypeError, match=r"retriever options \['timeoutt'\] are unknown"):
        check_retriever_arg({"url": "http://127.0.0.1:9", "timeoutt": 1})
    with pytest.raises(TypeError, match="needs urls"):
        check_retriever_arg({"timeout": 1})


def test_a_hung_service_fails_a_search_after_the_timeout():
    with BadServer("hang") as srv:
        spec = {"url": srv.url, "timeout": 1.0, "max_retries": 0}
        env = mas_envs.make(
            "search-1agent", retriever=spec, tasks=[{"question": "q?", "golden_answers": ["a"]}]
        )
        env.reset(seed=0)
        t0 = time.monotonic()
        _, body = run_search(spec, "who", 3)
        took = time.monotonic() - t0
    assert took < 1.5, took
    assert body == (
        f"Search error: RetrieverUnavailableError: retrieval failed after 1 attempts over 1 URL(s): "
        f"{srv.url}/retrieve -> no whole answer within timeout=1 s. Is the server running? Start one with "
        "`mas-index serve --index DIR`; a slow one: raise the retriever's timeout (retriever: {urls: [...], "
        "timeout: S})."
    )

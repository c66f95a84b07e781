"""Shared fixtures: a tiny corpus, a cheap deterministic encoder, an isolated embedding cache."""

from __future__ import annotations

import json

import pytest
from _retrieval_fakes import CORPUS, HashEncoder


@pytest.fixture
def corpus_path(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    return path


@pytest.fixture
def hash_encoder():
    return HashEncoder()


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    # Never write embeddings into the real ~/.cache from tests.
    monkeypatch.setenv("MAS_RL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

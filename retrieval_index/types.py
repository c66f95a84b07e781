"""The retrieval contract: one retrieved :class:`Passage`, and the :class:`Retriever` protocol the search envs
call. Plain dataclass and typing only (no faiss, torch or httpx), so ``mas_envs`` imports it from here and stays
light, and ``retrieval_index`` needs nothing from ``mas_envs``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Passage", "Retriever"]


@dataclass(frozen=True)
class Passage:
    """One retrieved passage.

    Attributes:
        id: corpus id of the passage (a string, as in FlashRAG / Search-R1 corpora).
        title: page title.
        contents: FlashRAG ``contents`` field: ``'"<title>"\\n<text>'`` (title line, then the text).
        score: inner product of the L2-normalised query and passage embeddings (cosine similarity,
            in [-1, 1]); ``None`` when the source did not return scores.
    """

    id: str
    title: str
    contents: str
    score: float | None = None

    @property
    def text(self) -> str:
        """The passage body without its title line (``contents`` after the first newline)."""
        head, sep, rest = self.contents.partition("\n")
        return rest if sep else head


@runtime_checkable
class Retriever(Protocol):
    """Anything that maps queries to ranked passages.

    ``search(queries, topk)`` returns one list per query, best first, at most ``topk`` passages each.
    Implementations may raise any exception on failure; the search envs turn it into an error observation.
    """

    def search(self, queries: list[str], topk: int) -> list[list[Passage]]: ...

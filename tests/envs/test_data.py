"""Task loaders: bundled real sets, local files through `datasets`, field mapping."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from mas_envs.data import BUNDLED, load_tasks, normalize_rows

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.mark.parametrize(
    ("name", "rows", "first_id", "first_answer"),
    [
        ("gsm8k-train", 7473, "gsm8k/train/0", "72"),
        ("gsm8k-test", 1319, "gsm8k/test/0", "18"),
        ("math-train", 7498, "train/algebra/0.json", "0"),
        ("math500", 500, "test/precalculus/807.json", r"\left( 3, \frac{\pi}{2} \right)"),
    ],
)
def test_bundled_sets(name, rows, first_id, first_answer):
    tasks = load_tasks(name)
    assert len(tasks) == rows
    assert tasks[0]["id"] == first_id and tasks[0]["answer"] == first_answer
    assert len({t["id"] for t in tasks}) == rows
    assert all(isinstance(t["question"], str) and t["question"] and str(t["answer"]).strip() for t in tasks)
    assert {t["data_source"] for t in tasks} == {BUNDLED[name].data_source}


def test_gsm8k_keeps_the_worked_solution():
    t = load_tasks("gsm8k-test", limit=1)[0]
    assert t["answer"] == "18" and t["solution"].endswith("#### 18")


def test_bundled_licence_notice_ships():
    notice = Path(__file__).resolve().parents[2] / "mas_envs" / "bundled" / "NOTICE.md"
    text = notice.read_text()
    assert "MIT" in text and "grade-school-math" in text and "hendrycks" in text.lower()


def test_bundled_files_load_through_datasets_too(tmp_path):
    pytest.importorskip("datasets")
    from mas_envs.data import _bundled_path

    path = str(_bundled_path("math500"))
    tasks = load_tasks(path, fields={"question": "problem"}, data_source="math500", id_field="unique_id")
    assert tasks == load_tasks("math500")
    assert load_tasks(path, limit=2)[1]["id"] == "math500_test/1"  # no id column given: file stem / row index


def test_jsonl_and_parquet_with_field_mapping(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"prompt_text": "1+1?", "gold": "2", "uid": "a"},
        {"prompt_text": "2+2?", "gold": "4", "uid": "b"},
    ]
    jsonl = tmp_path / "toy.jsonl.gz"
    with gzip.open(jsonl, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    fields = {"question": "prompt_text", "answer": "gold"}
    a = load_tasks(jsonl, fields=fields)
    assert [(t["question"], t["answer"], t["data_source"], t["id"]) for t in a] == [
        ("1+1?", "2", "toy", "toy/0"),
        ("2+2?", "4", "toy", "toy/1"),
    ]
    parquet = tmp_path / "toy.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    b = load_tasks(parquet, fields=fields, data_source="mine", limit=1)
    assert b == [{"uid": "a", "question": "1+1?", "answer": "2", "data_source": "mine", "id": "mine/0"}]


def test_user_supplied_aime_from_shared_data():
    path = SHARED / "aime24" / "test.jsonl"
    if not path.exists():
        pytest.skip("shared/data not present")
    pytest.importorskip("datasets")
    tasks = load_tasks(path, data_source="aime24")
    assert len(tasks) == 30 and all(t["data_source"] == "aime24" for t in tasks)
    assert tasks[0]["question"] and str(tasks[0]["answer"]).strip()


def test_normalize_rows_autodetects_and_keeps_golden_answers():
    out = normalize_rows([{"question": "who?", "golden_answers": ["Ada"], "id": 7}], data_source="nq")
    assert out == [{"question": "who?", "golden_answers": ["Ada"], "data_source": "nq", "id": "7"}]
    out = normalize_rows([{"problem": "p", "final_answer": "1", "answer": "worked"}], id_prefix="x")
    assert out[0]["answer"] == "1" and out[0]["solution"] == "worked" and out[0]["id"] == "x/0"


def test_clear_errors():
    with pytest.raises(KeyError, match="no question field"):
        normalize_rows([{"text": "?", "answer": "1"}])
    with pytest.raises(KeyError, match="no gold answer field"):
        normalize_rows([{"question": "?"}])
    with pytest.raises(FileNotFoundError, match="bundled sets"):
        load_tasks("./nope.jsonl")


def test_broken_files_and_misspelled_names_are_one_clear_error(tmp_path):
    # Regression: a broken JSONL line gave an ~85-line `datasets` traceback, an empty file a bare StopIteration,
    # and "gsm8k-trian" "Couldn't reach 'gsm8k-trian' on the Hub".
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", answer: 2}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 3: not valid JSON \(.*column 19\)"):
        load_tasks(bad)
    listed = tmp_path / "list.jsonl"
    listed.write_text('{"question": "a", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"list\.jsonl, line 2: a JSON list, not an object"):
        load_tasks(listed)
    for name, text in (("empty.jsonl", ""), ("blank.json", "\n  \n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=f"{name} is empty: it holds no task rows"):
            load_tasks(tmp_path / name)
    with gzip.open(tmp_path / "bad.jsonl.gz", "wt") as f:
        f.write('{"question": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz, line 2"):
        load_tasks(tmp_path / "bad.jsonl.gz")
    # a .json file may be one JSON document (an array of rows) as well as JSON Lines
    (tmp_path / "rows.json").write_text(json.dumps([{"question": "a", "answer": "1"}]))
    assert [t["question"] for t in load_tasks(tmp_path / "rows.json")] == ["a"]
    with pytest.raises(ValueError, match=r"unknown data set 'gsm8k-trian': did you mean 'gsm8k-train'"):
        load_tasks("gsm8k-trian")
    with pytest.raises(
        FileNotFoundError, match=r"'no-such-thing' is not a named set \(gsm8k-test, gsm8k-train"
    ):
        load_tasks("no-such-thing")


def test_rows_without_a_gold_answer_are_skipped_with_a_warning(tmp_path):
    # The math envs refuse such a task at reset (every reward would be 0): drop them at load time instead of
    # failing hours into a run. A JSON null used to become the answer "None".
    pytest.importorskip("datasets")
    path = tmp_path / "user.jsonl"
    rows = [
        {"question": "1+1?", "answer": "2"},
        {"question": "2+2?", "answer": ""},
        {"question": "3+3?", "answer": None},
        {"question": "4+4?", "answer": " "},
        {"question": "5+5?", "answer": "10"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning, match="skipped 3 of 5 rows with no gold answer"):
        tasks = load_tasks(path)
    assert [(t["question"], t["answer"], t["id"]) for t in tasks] == [
        ("1+1?", "2", "user/0"),
        ("5+5?", "10", "user/4"),
    ]
    out = normalize_rows([{"question": "q", "golden_answers": []}], drop_empty_answers=True)
    assert out == []


def test_negative_limit_is_an_error():
    with pytest.raises(ValueError, match="limit"):
        load_tasks("gsm8k-test", limit=-1)


def test_a_rows_own_data_source_wins_over_the_file_stem(tmp_path):
    # regression (issue 9): the file stem used to overwrite every row's data_source, so a mixed file
    # reported avg@k as one source
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"question": "1+1?", "answer": "2", "data_source": "aime24"},
        {"question": "2+2?", "answer": "4", "data_source": "amc23"},
        {"question": "3+3?", "answer": "6"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_tasks(path)
    assert [(t["data_source"], t["id"]) for t in got] == [
        ("aime24", "mixed/0"),
        ("amc23", "mixed/1"),
        ("mixed", "mixed/2"),
    ]
    assert [t["data_source"] for t in load_tasks(path, data_source="all")] == ["all", "all", "all"]

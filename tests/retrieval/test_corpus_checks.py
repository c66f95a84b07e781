"""Corpus mistakes `mas-index build` refuses, and the BOM it accepts (issue 9, item 9).

Before: duplicate ids and empty passages were indexed silently (an empty passage then ranked first for a
short query, score 0.87), and a UTF-8 byte-order mark made line 1 "not valid JSON".
"""

from __future__ import annotations

import json

import pytest
from _retrieval_fakes import CORPUS

from retrieval_index.cli import main
from retrieval_index.corpus import iter_corpus
from retrieval_index.index import Retriever, build_index


def _write(path, rows, bom: bool = False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


def test_duplicate_id_names_the_repeating_line_and_the_first_use(tmp_path):
    rows = [*CORPUS[:3], {"id": CORPUS[1]["id"], "title": "Other", "text": "another text"}, *CORPUS[3:]]
    path = _write(tmp_path / "dup.jsonl", rows)
    with pytest.raises(ValueError) as err:
        list(iter_corpus(path))
    assert str(err.value) == (
        f"{path}:4: duplicate id {CORPUS[1]['id']!r} (first used on line 2); ids must be unique: "
        "remove or renumber one of the two"
    )


def test_an_implicit_row_number_id_can_collide_with_an_explicit_one(tmp_path):
    # a missing id is the 0-based row number: row 1 without an id is "1", as is the explicit id on line 1
    path = _write(tmp_path / "dup.jsonl", [{"id": "1", "text": "a"}, {"text": "b"}])
    with pytest.raises(ValueError, match=r"dup.jsonl:2: duplicate id '1' \(first used on line 1\)"):
        list(iter_corpus(path))


@pytest.mark.parametrize(
    "row",
    [
        {"id": "e", "title": "Empty", "text": ""},
        {"id": "e", "title": "Blank", "text": "  \n\t "},
        {"id": "e", "contents": '"Title only"\n'},
        {"id": "e", "contents": "   "},
    ],
    ids=["empty-text", "whitespace-text", "title-line-only", "blank-contents"],
)
def test_a_passage_without_text_is_an_error(tmp_path, row):
    path = _write(tmp_path / "empty.jsonl", [CORPUS[0], CORPUS[1], row])
    with pytest.raises(ValueError) as err:
        list(iter_corpus(path))
    assert str(err.value) == f"{path}:3: passage id 'e' has no text; remove the line or give it text"


def test_unique_ids_and_real_texts_pass(tmp_path):
    path = _write(tmp_path / "ok.jsonl", CORPUS)
    assert [d[0] for d in iter_corpus(path)] == [str(r["id"]) for r in CORPUS]


def test_a_byte_order_mark_is_accepted(tmp_path, hash_encoder):
    plain = list(iter_corpus(_write(tmp_path / "plain.jsonl", CORPUS)))
    path = _write(tmp_path / "bom.jsonl", CORPUS, bom=True)
    assert list(iter_corpus(path)) == plain
    meta = build_index(path, tmp_path / "idx", encoder=hash_encoder, progress=False)
    assert meta["corpus"]["num_documents"] == len(CORPUS)
    hits = Retriever.load(tmp_path / "idx", encoder=hash_encoder).search(["Dookie"], 1)
    assert hits[0][0].id == "d3"


def test_build_refuses_before_embedding(tmp_path, hash_encoder):
    path = _write(tmp_path / "dup.jsonl", [*CORPUS, CORPUS[0]])
    with pytest.raises(ValueError, match="duplicate id 'd0'"):
        build_index(path, tmp_path / "idx", encoder=hash_encoder, progress=False)
    assert hash_encoder.passages_embedded == 0
    assert not (tmp_path / "idx" / "meta.json").exists()
    with pytest.raises(ValueError, match="duplicate id 'd0'"):
        Retriever.from_corpus(path, hash_encoder, progress=False)


def test_mas_index_build_prints_one_error_line(tmp_path, capsys):
    path = _write(tmp_path / "empty.jsonl", [CORPUS[0], {"id": "x", "text": " "}])
    assert main(["build", "--corpus", str(path), "--out", str(tmp_path / "idx"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"mas-index build: error: {path}:2: passage id 'x' has no text; remove the line or give it text\n"
    )

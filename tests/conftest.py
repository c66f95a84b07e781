"""Session-wide test setup: no network, one torch thread, and the tiny Qwen3 test model shared by every test that needs one.

Fixtures:
    tiny_qwen3_path: folder of the builtin ``"tiny-qwen3"`` model (random-init 2-layer Qwen3 + the real Qwen
        tokenizer), built once into the mas-rl cache (``$MAS_RL_CACHE`` or ``~/.cache/mas-rl``; ~6 s the first
        time, reused afterwards).
    tiny_model_and_tokenizer: ``(model, tokenizer)`` loaded from it once per session, fp32, CPU, eval mode,
        left padding. Shared: treat it as read-only (``copy.deepcopy(model)`` before training or changing it).
"""

from __future__ import annotations

import os

# Before anything imports huggingface_hub/transformers: tests must never reach a hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# One intra-op thread unless told otherwise: the test models are tiny, and on a loaded 2-core box two OpenMP
# threads per process oversubscribe badly (SmolLM2 decoding measured 4 tok/s with 2 threads vs 27 with 1).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_qwen3_path() -> str:
    pytest.importorskip("transformers")
    from mas_train.models import resolve_model_path

    return resolve_model_path("tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tiny_qwen3_path):
    from mas_train.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_qwen3_path, dtype="float32", device="cpu")


@pytest.fixture(autouse=True)
def _fp32_unless_asked(monkeypatch):
    """Every test sees a CPU without native bf16, so ``dtype: auto`` resolves to fp32 on any machine: tests that
    compare two generation or update paths for exact token equality hold on an AVX2 box and on a Zen 5 / Xeon
    with ``avx512_bf16`` alike. The bf16 tests mock the detection themselves (tests/train/test_precision.py)."""
    from mas_train import precision

    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: (False, "tests run fp32 unless a test asks"))

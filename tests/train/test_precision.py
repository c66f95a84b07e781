"""``dtype: auto`` per model group (mas_train.precision): bf16 where the CPU computes it natively, fp32 elsewhere;
the detection is mocked, so the rule is tested on any CPU."""

from __future__ import annotations

import io
import types
from pathlib import Path

import pytest
import torch

import mas_train.precision as precision
from mas_train.precision import Precision, cpu_native_bf16, native_bf16_from_flags, resolve_precision

NATIVE = (True, "CPU has amx_bf16")
AVX2 = (False, "CPU has no native bf16 (AVX2)")


def test_native_bf16_verdicts_from_cpu_flags():
    assert native_bf16_from_flags({"avx2", "avx512f", "amx_bf16", "amx_tile", "avx512_bf16"}, True) == (
        True,
        "CPU has amx_bf16, avx512_bf16",
    )
    assert native_bf16_from_flags({"avx2", "avx512f", "avx512_bf16"}, True) == (True, "CPU has avx512_bf16")
    assert native_bf16_from_flags({"avx2", "fma"}, False) == AVX2
    assert native_bf16_from_flags({"avx2", "avx512f"}, True) == (
        False,
        "CPU has no native bf16 (AVX-512 without BF16)",
    )
    assert native_bf16_from_flags({"avx512_bf16"}, False) == (
        False,
        "CPU has avx512_bf16 but this torch build's oneDNN has no bf16 path",
    )
    assert native_bf16_from_flags({"sse2"}, False) == (False, "CPU has no native bf16 (no AVX2)")
    assert native_bf16_from_flags((), False) == (False, "CPU has no native bf16 (CPU flags not readable)")


def test_this_cpu_is_read_from_its_flags_and_onednn():
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        line = next((x for x in cpuinfo.read_text().splitlines() if x.startswith("flags")), "flags :")
        flags = set(line.split(":", 1)[1].split())
    onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    native, why = cpu_native_bf16()
    assert native == (bool(flags & {"amx_bf16", "avx512_bf16"}) and onednn)
    assert why.startswith("CPU has")


def test_auto_picks_per_group_and_device():
    assert resolve_precision("auto", "cpu", lora=True, native=AVX2) == Precision(
        "float32", False, "fp32: CPU has no native bf16 (AVX2)"
    )
    assert resolve_precision("auto", "cpu", lora=False, native=AVX2) == Precision(
        "float32", False, "fp32: CPU has no native bf16 (AVX2)"
    )
    assert resolve_precision("auto", "cpu", lora=True, native=NATIVE) == Precision(
        "bfloat16", False, "bf16 base weights, fp32 LoRA adapters and AdamW: CPU has amx_bf16"
    )
    assert resolve_precision("auto", "cpu", lora=False, native=NATIVE) == Precision(
        "float32", True, "fp32 master weights and AdamW, bf16 autocast: CPU has amx_bf16"
    )
    # a GPU and explicit settings: what they were before the CPU rule (bf16 weights and bf16=True on a GPU)
    assert resolve_precision("auto", "cuda:1", lora=True, native=AVX2) == Precision(
        "bfloat16", True, "bf16 weights and autocast: GPU"
    )
    for native in (AVX2, NATIVE):
        assert resolve_precision("float32", "cpu", lora=True, native=native) == Precision(
            "float32", False, "float32: as set (dtype: float32)"
        )
        assert resolve_precision("bfloat16", "cpu", lora=False, native=native).autocast is True
        assert resolve_precision("float16", "cpu", lora=False, native=native) == Precision(
            "float16", False, "float16: as set (dtype: float16)"
        )
    assert resolve_precision("auto", "cpu", lora=False, native=AVX2).computes_fp32
    assert not resolve_precision("auto", "cpu", lora=False, native=NATIVE).computes_fp32


pytest.importorskip("trl")
pytest.importorskip("peft")

from mas_train.config import TrainConfig  # noqa: E402
from mas_train.hosting.worker import make_policy  # noqa: E402
from mas_train.progress import print_banner  # noqa: E402
from mas_train.rollout import Sample  # noqa: E402


def _resolved(tmp_path, model, **extra):
    cfg = TrainConfig.from_dict(
        dict(
            env="parity",
            model=model,
            max_steps=4,
            output_dir=str(tmp_path),
            run_name="run",
            learning_rate=1e-2,
            device="cpu",
            sampling={"max_new_tokens": 4},
            **extra,
        )
    )
    return cfg, cfg.resolve(["solver", "verifier"])


def _samples():
    g = torch.Generator().manual_seed(0)
    return [
        Sample(
            f"t{i % 2}",
            f"r{i}",
            "solver",
            "shared",
            0,
            torch.randint(0, 5000, (6 + i % 3,), generator=g).tolist(),
            torch.randint(0, 5000, (3,), generator=g).tolist(),
            [-9.0] * 3,
            False,
            1.0,
            True,
            0,
            "stop",
            "x",
        )  # fmt: skip
        for i in range(4)
    ]


@pytest.mark.parametrize(
    ("native", "lora", "weights", "autocast"),
    [
        (NATIVE, True, torch.bfloat16, False),
        (NATIVE, False, torch.float32, True),
        (AVX2, True, torch.float32, False),
        (AVX2, False, torch.float32, False),
    ],
)
def test_make_policy_loads_and_trains_in_the_chosen_dtype(
    monkeypatch, tmp_path, tiny_qwen3_path, native, lora, weights, autocast
):
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: native)
    extra = {"lora": {"r": 4, "alpha": 8}} if lora else {}
    cfg, resolved = _resolved(tmp_path, tiny_qwen3_path, **extra)
    policy = make_policy(resolved, "shared")
    trainer = policy.trainer
    assert trainer.args.bf16 is autocast
    model = trainer.model
    base = {n: p.dtype for n, p in model.named_parameters() if "lora_" not in n}
    adapters = {n: p.dtype for n, p in model.named_parameters() if "lora_" in n}
    assert set(base.values()) == {weights}
    assert set(adapters.values()) == ({torch.float32} if lora else set())
    m = trainer.update(_samples(), [1.0, -1.0, 0.5, -0.5])
    assert torch.isfinite(torch.tensor(m["loss"])) and m["grad_norm"] > 0
    # AdamW's moments are fp32 in every case: the adapters' under LoRA, the master weights' otherwise
    moments = {t.dtype for s in trainer.optimizer.state.values() for k, t in s.items() if k != "step"}
    assert moments == {torch.float32}
    out = io.StringIO()
    plan = types.SimpleNamespace(
        config=cfg, resolved=resolved, run_dir=tmp_path / "run", changes={}, warnings=[]
    )
    print_banner(plan, out)
    line = next(x for x in out.getvalue().splitlines() if x.startswith("  model group"))
    prec = resolve_precision("auto", "cpu", lora=lora, native=native)
    tis = "off: fp32 HF sampler and fp32 trainer" if prec.computes_fp32 else "on: HF sampler in "
    assert f"; {prec.reason}; importance-sampling correction {tis}" in line
    assert trainer.args.vllm_importance_sampling_correction is not prec.computes_fp32


def test_dtype_float32_forces_fp32_on_a_native_bf16_cpu(monkeypatch, tmp_path, tiny_qwen3_path):
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: NATIVE)
    _, resolved = _resolved(tmp_path, tiny_qwen3_path, dtype="float32", lora={"r": 4, "alpha": 8})
    policy = make_policy(resolved, "shared")
    assert {p.dtype for p in policy.trainer.model.parameters()} == {torch.float32}
    assert policy.trainer.args.bf16 is False

"""Every benchmark script runs in its ``--tiny`` mode and prints its JSON keys, so a refactor cannot rot one.

The numbers of a tiny run mean nothing (random tiny model, busy CI machine); only that each script runs end to
end, measures its roof or baseline and reports the documented keys with sane values is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mas_train.precision import cpu_native_bf16 as real_cpu_native_bf16

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> the keys its --json line must hold (besides the raw numbers)
EXPECTED = {
    "step.py": {"gen_roof_frac", "update_roof_frac", "peak_rss_gb", "step_s", "bf16_update_speedup"},
    "train_step.py": {"ratio_vs_trl", "ratio_agent_norms_vs_trl", "ratio_shared_prefix", "update_roof_frac"},
    "rollout.py": {"speedup", "speedup_tokens_per_s", "eval_rollout_ratio"},
    "generate.py": {
        "tok_s",
        "roof_frac",
        "ratio_vs_generate",
        "ratio_vs_forward",
        "roof_tok_s",
        "bf16_decode_speedup",
        "decode_roof_frac_bf16",
    },
    "retrieval.py": {"search_speedup", "same_ids", "p50_ms", "req_s"},
    "task_pool.py": {"ratio_update_tokens_per_step", "ratio_wall"},
}
# flags a script's tiny run adds, so its optional paths run too
EXTRA_ARGS = {"step.py": ["--profile", "3"]}


def test_every_script_is_covered():
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_benchmark_tiny_mode_reports_its_keys(script, tiny_qwen3_path, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--tiny", "--json", *EXTRA_ARGS.get(script, [])],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert EXPECTED[script] <= result.keys()
    if script in ("step.py", "generate.py"):  # what the CPU reported, either way (AVX2: False; Zen 5: True)
        # the real detection, imported at collection (tests/conftest.py mocks the module attribute per test)
        assert result["native_bf16"] is real_cpu_native_bf16()[0]
    if script == "step.py":  # the update profile of each dtype: shares of self CPU time that add up to 1
        for name in ("profile_bf16", "profile_fp32"):
            shares = [v for k, v in result[name].items() if k.startswith("share_")]
            assert sum(shares) == pytest.approx(1.0) and result[name]["share_gemm"] > 0, result[name]
            assert result[name]["gemm_gflop_s"] > 0 and result[name]["self_cpu_s"] > 0
        assert result["update_done_gflop_s"] > 0
    for key in EXPECTED[script]:
        value = result[key]
        if isinstance(value, bool):
            assert value  # same_ids: FAISS and numpy agree
        else:
            assert value > 0 and value == value, f"{script}: {key} = {value}"

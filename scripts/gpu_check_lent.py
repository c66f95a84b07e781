"""Part 1 of scripts/gpu_check.sh: what a lent single-GPU machine can check with a random-init model.

    python3 scripts/gpu_check_lent.py --device cuda            # what gpu_check.sh runs (bf16, qwen3-180m)
    python3 scripts/gpu_check_lent.py --device cpu --model tiny-qwen3 --small   # the CPU dry run (the test)

Three checks, each ending in one line that starts with ``CHECK`` (and a non-zero exit if it fails):

a. ``generate``: :class:`~mas_train.backends.hf.HFBackend` samples ``prompts x max_new_tokens`` tokens (no EOS
   ids, so every row runs to its cap and the token count is exact); prints tokens/s after one warm-up batch.
b. ``lora``: ``mas-train --env math-2agent --model_sharing shared_lora`` (one model group, one LoRA adapter per
   agent on a shared base) for 2 steps; prints seconds per step from the run's ``metrics.jsonl``.
c. ``sharded``: the same run with full fine-tuning on the sharded hosting (:mod:`mas_train.hosting.sharded`:
   a rank process, FSDP2 ``fully_shard``, the weight gather to the worker) over NCCL on one GPU (gloo on CPU).
   The hosting shards only groups with ``num_ranks > 1``, and NCCL cannot put two ranks on one GPU, so the
   run is configured with ``num_ranks 2`` and its ranks are started with ``num_ranks = 1`` (see
   :func:`_one_rank`); prints seconds per step.

Models (nothing is downloaded): ``qwen3-180m`` is built here, random-init, on the shipped Qwen tokenizer
(:func:`mas_train.tiny_models.build_tiny_qwen3` with hidden 512, 8 layers, 8 heads, 4 KV heads, MLP 1536:
180.5 M parameters, 155.3 M of them the untied embeddings and LM head over 151,669 tokens; 361 MB in bf16);
``tiny-qwen3`` is the 19.5 M-parameter test model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "qwen3-180m": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1536,
    )
}


def build_model(name: str, out_dir: Path) -> str:
    """A local folder for ``name``: a builtin alias (``tiny-qwen3``), one of :data:`MODELS` (built, seeded), or
    a folder as given."""
    if name in MODELS:
        from mas_train.tiny_models import build_tiny_qwen3

        folder = out_dir / "models" / name
        if not (folder / "config.json").exists():
            build_tiny_qwen3(folder, seed=0, **MODELS[name])
        return str(folder)
    from mas_train.models import resolve_model_path

    return resolve_model_path(name)


def check_generate(model_path: str, device: str, dtype: str, prompts: int, new_tokens: int) -> float:
    """Sample ``prompts`` completions of exactly ``new_tokens`` tokens; returns tokens/s (after a warm-up)."""
    import torch

    from mas_train.backends.base import SamplingParams
    from mas_train.backends.hf import HFBackend
    from mas_train.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(model_path, dtype=dtype, device=device)
    backend = HFBackend(model, tok, share_model=True, eos_token_ids=(), seed=0)
    try:
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "Count from 1 to 100, one number per line."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        batch = [list(prompt)] * prompts
        sp = [SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i) for i in range(prompts)]
        backend.generate(batch[:2], sp[:2])  # warm-up: kernels, allocator
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        outs = backend.generate(batch, sp)
        dt = time.perf_counter() - t
    finally:
        backend.close()
    n = sum(len(o.completion_ids) for o in outs)
    if n != prompts * new_tokens:
        raise SystemExit(f"CHECK generate FAILED: {n} tokens, expected {prompts} x {new_tokens}")
    print(
        f"CHECK generate ok: HFBackend on {device} ({dtype}), {prompts} prompts x {new_tokens} new tokens = {n} "
        f"tokens in {dt:.2f} s: {n / dt:,.0f} tokens/s",
        flush=True,
    )
    return n / dt


def _train_args(model_path: str, device: str, dtype: str, run_dir: Path, name: str, sizes: dict) -> list[str]:
    return [
        "--env", "math-2agent", "--model", model_path, "--backend", "hf", "--device", device, "--dtype", dtype,
        "--max_steps", "2", "--num_generations", str(sizes["num_generations"]),
        "--tasks_per_step", str(sizes["tasks_per_step"]),
        "--sampling.max_new_tokens", str(sizes["max_new_tokens"]), "--learning_rate", "1e-4",
        "--save_steps", "0", "--eval_steps", "0", "--report_to", "jsonl",
        "--output_dir", str(run_dir), "--run_name", name,
    ]  # fmt: skip


def _run_train(args: list[str], sharded: bool) -> None:
    """Run mas-train in a child process (``_sharded`` starts its ranks with ``num_ranks = 1``)."""
    code = "import sys; from mas_train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
    cmd = (
        [sys.executable, str(Path(__file__).resolve()), "_sharded", *args]
        if sharded
        else [sys.executable, "-c", code, *args]
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)


def _step_summary(metrics: Path, what: str, trajectories: int) -> float:
    """Print each step's time split and generated tokens; returns step 2's seconds."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "time/step" in r]
    if [r["step"] for r in steps] != [1, 2]:
        raise SystemExit(
            f"CHECK {what} FAILED: {metrics} has steps {[r.get('step') for r in steps]}, not [1, 2]"
        )
    for r in steps:
        agents = sorted(k.split("/", 2)[2] for k in r if k.startswith("charts/tokens/"))
        # mean turns per trajectory x mean completion tokens per turn, summed over agents, x trajectories
        tokens = trajectories * sum(r[f"charts/turns/{a}"] * r[f"charts/tokens/{a}"] for a in agents)
        print(
            f"  step {r['step']}: {tokens:,.0f} generated tokens ({tokens / r['time/generate']:,.0f} tokens/s), "
            f"generate {r['time/generate']:.2f} s, update {r['time/update']:.2f} s, "
            f"sync {r['time/sync']:.2f} s, step {r['time/step']:.2f} s",
            flush=True,
        )
    return steps[-1]["time/step"]  # step 1 includes the first-use costs (kernels, allocator)


def check_lora(model_path: str, device: str, dtype: str, run_dir: Path, sizes: dict) -> float:
    args = _train_args(model_path, device, dtype, run_dir, "lora", sizes) + ["--model_sharing", "shared_lora"]
    _run_train(args, sharded=False)
    n = sizes["tasks_per_step"] * sizes["num_generations"]
    s = _step_summary(run_dir / "lora" / "metrics.jsonl", "lora", n)
    print(f"CHECK lora ok: math-2agent, shared_lora (2 adapters, r 16) on {device} ({dtype}), 2 steps: "
          f"{s:.2f} s/step (step 2)", flush=True)  # fmt: skip
    return s


def check_sharded(model_path: str, device: str, dtype: str, run_dir: Path, sizes: dict) -> float:
    args = _train_args(model_path, device, dtype, run_dir, "sharded", sizes)
    args += ["--model_sharing", "shared", "--num_ranks", "2", "--log_agent_grad_norms", "false"]
    _run_train(args, sharded=True)
    n = sizes["tasks_per_step"] * sizes["num_generations"]
    s = _step_summary(run_dir / "sharded" / "metrics.jsonl", "sharded", n)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    print(f"CHECK sharded ok: math-2agent, full fine-tune on 1 FSDP2 rank over {backend} ({dtype}), 2 steps: "
          f"{s:.2f} s/step (step 2)", flush=True)  # fmt: skip
    return s


_STARTED: list[str] = []  # groups whose ranks _one_rank started


def _one_rank(resolved, group):
    """:class:`~mas_train.hosting.sharded.ShardedRanks` for ``group`` with one rank (on GPU 0, or the CPU)."""
    from mas_train.hosting.sharded import ShardedRanks

    _STARTED.append(group)

    g = dataclasses.replace(resolved.model_groups[group], num_ranks=1)
    return ShardedRanks(
        dataclasses.replace(resolved, model_groups={**resolved.model_groups, group: g}), group
    )


def _sharded_main(argv: list[str]) -> int:
    import mas_train.hosting.worker as worker
    from mas_train.cli import train_main

    worker.ShardedRanks = _one_rank  # make_policy's default for a group with num_ranks > 1
    rc = train_main(argv)
    if not _STARTED:
        raise SystemExit("CHECK sharded FAILED: no group ran on the sharded hosting")
    print(f"sharded hosting ran group(s) {_STARTED} on 1 rank each", flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=os.environ.get("MAS_GPU_CHECK_DEVICE", "cuda"))
    p.add_argument("--model", default=None, help="qwen3-180m (default on cuda), tiny-qwen3, or a folder")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--small", action="store_true", help="CPU-sized batches (the dry run)")
    p.add_argument("--run_dir", default=str(ROOT / "runs" / "gpu_check_lent"))
    p.add_argument("--only", default="generate,lora,sharded")
    a = p.parse_args(argv)
    cuda = a.device.startswith("cuda")
    model = a.model or ("qwen3-180m" if cuda else "tiny-qwen3")
    dtype = a.dtype or ("bfloat16" if cuda else "float32")
    if a.small:
        gen, sizes = (4, 16), dict(num_generations=2, tasks_per_step=2, max_new_tokens=16)
    else:
        gen, sizes = (256, 256), dict(num_generations=8, tasks_per_step=8, max_new_tokens=256)
    import torch

    if cuda and not torch.cuda.is_available():
        raise SystemExit("CHECK FAILED: --device cuda, but torch sees no CUDA device (use --device cpu)")
    where = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(f"== part 1 on {where}: torch {torch.__version__}, model {model}, {dtype}", flush=True)
    run_dir = Path(a.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    path = build_model(model, run_dir)
    print(f"model folder {path} ready in {time.perf_counter() - t:.1f} s", flush=True)
    only = set(a.only.split(","))
    if "generate" in only:
        check_generate(path, a.device, dtype, *gen)
    if "lora" in only:
        check_lora(path, a.device, dtype, run_dir, sizes)
    if "sharded" in only:
        check_sharded(path, a.device, dtype, run_dir, sizes)
    print(f"part 1 took {time.perf_counter() - t:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_sharded"]:
        sys.exit(_sharded_main(sys.argv[2:]))
    sys.exit(main())

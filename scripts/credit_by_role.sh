#!/usr/bin/env bash
# Issue 24, part 4: team reward only vs team + verifier role score on the math learning default, 3 seeds.
#
#   scripts/credit_by_role.sh [OUT] [SEEDS]        e.g. scripts/credit_by_role.sh runs/credit "0 1 2"
#
# Per seed: two runs of `mas-train --env math-2agent` (the laptop setting), "team" (the default) and "role"
# (`agents.verifier.reward_weights: {team: 1, role: 1}`), each evaluated by the run itself on the default eval
# set before and after training; then `mas-eval --checkpoint RUN` and `--initial` on 48 differently phrased
# one- and two-digit problems (reasoning-gym's natural phrasing, seed 2002, which the training data never
# uses). Two runs at a time, one torch thread each. A finished run is skipped; an unfinished one resumes.
# Every number lands in OUT/*.json and OUT/runs/*/metrics.jsonl; docs/results.md reads them.
set -euo pipefail
out=${1:-runs/credit_by_role}
seeds=${2:-"0 1 2"}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
held_out='rg:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=2&operators=+,-&allow_negation=false&allow_parentheses=false&format_style=natural&size=48&seed=2002'
mkdir -p "$out"

train() {  # train NAME SEED [flags...]: one run, resumed when it has a checkpoint, skipped when finished
  local name=$1 seed=$2; shift 2
  local dir="$out/runs/$name"
  if [ -d "$dir/checkpoints/step-000014" ]; then return; fi
  if [ -d "$dir/checkpoints" ]; then
    mas-train --resume "$dir" > "$out/$name.log" 2>&1
  else
    mas-train --env math-2agent --seed "$seed" --output_dir "$out/runs" --run_name "$name" "$@" > "$out/$name.log" 2>&1
  fi
}

for seed in $seeds; do
  train "team_s$seed" "$seed" &
  train "role_s$seed" "$seed" --agents.verifier.reward_weights.team 1 --agents.verifier.reward_weights.role 1 &
  wait
  for arm in team role; do
    mas-eval --checkpoint "$out/runs/${arm}_s$seed" --data "$held_out" --output "$out/${arm}_s$seed.held_out.json" \
      > "$out/${arm}_s$seed.held_out.log" 2>&1 &
  done
  wait
  # the untrained weights are the same for both arms of a seed (LoRA B = 0): one --initial per seed
  mas-eval --checkpoint "$out/runs/team_s$seed" --initial --data "$held_out" --output "$out/initial_s$seed.held_out.json" \
    > "$out/initial_s$seed.held_out.log" 2>&1
done
echo "done: $out"

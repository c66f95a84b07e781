"""Generations spent per unit of evaluation gain, data order against the task pool + dynamic sampling.

Learning is the measure here, so the two sides are training runs: "before" trains in data order with every
task group kept, "after" with the task pool and dynamic sampling (``mas_train.task_pool``), from the same start,
on the same tasks and evaluation set. For each run it reads RUN/metrics.jsonl and reports

* ``episodes``: episodes generated for training (``sampling/episodes_generated``; summed over steps);
* ``gain``: last evaluation's avg@k minus the step-0 evaluation's (same tasks, same k);
* ``episodes_per_gain``: episodes per +0.01 of avg@k (lower is better; ``inf`` when the run did not gain);
* ``update_tokens_per_step``: prompt + completion tokens of the turns that reached a loss (``sampling/
  update_tokens``), the update's work;
* ``saturated_frac``: the share of generated episodes in task groups without signal for any trainable agent;
* ``train_s`` / ``eval_s``: seconds in training steps / in evaluations.

and, over the runs of each side, the means and the ratios after / before (``ratio_episodes_per_gain``,
``ratio_update_tokens_per_step``, ``ratio_wall``).

    python benchmarks/task_pool.py --before runs/base_s0 runs/base_s1 --after runs/pool_s0 runs/pool_s1
    python benchmarks/task_pool.py --tiny --json     # trains both sides 2 steps on tiny-qwen3 (CI)

JSON keys: ``before``, ``after`` (means), ``ratio_episodes_per_gain``, ``ratio_update_tokens_per_step``,
``ratio_wall``, ``runs`` (per run).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from _common import emit

AFTER = {"task_pool": {"enabled": True}, "dynamic_sampling": {"enabled": True}}


def run_summary(run: Path) -> dict[str, float]:
    """The numbers of one finished run (module docstring).

    Raises:
        ValueError: the run has no step-0 and later evaluation, or no training step.
    """
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = {r["step"]: r for r in rows if "time/step" in r}  # a resumed step logs again: keep the last
    evals = [r for r in rows if any(k.startswith("eval/avg@") for k in r)]
    if not steps or len(evals) < 2 or evals[0]["step"] != 0:
        raise ValueError(
            f"{run}: needs training steps and evaluations at step 0 and later (eval_before_training)"
        )
    key = next(k for k in evals[0] if k.startswith("eval/avg@") and k.count("/") == 1)
    gain = float(evals[-1][key] - evals[0][key])
    if all("sampling/episodes_generated" in r for r in steps.values()):
        n_gen = sum(r["sampling/episodes_generated"] for r in steps.values())
    else:  # a run from before the sampling/ metrics: tasks_per_step x num_generations episodes a step
        cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}
        n_gen = len(steps) * float(cfg.get("tasks_per_step", 1) * cfg.get("num_generations", 1))
    tokens = [r["sampling/update_tokens"] for r in steps.values() if "sampling/update_tokens" in r]
    saturated = sum(r.get("sampling/saturated_episodes", 0.0) for r in steps.values())
    return {
        "episodes": float(n_gen),
        "gain": gain,
        "episodes_per_gain": n_gen / (100 * gain) if gain > 0 else math.inf,
        "update_tokens_per_step": statistics.mean(tokens) if tokens else math.nan,  # nan: not logged
        "saturated_frac": saturated / n_gen if n_gen else 0.0,
        "train_s": sum(r["time/step"] for r in steps.values()),
        "eval_s": sum(r.get("eval/seconds", 0.0) for r in evals),
        "steps": float(len(steps)),
    }


def _mean(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.mean(r[k] for r in runs) for k in runs[0]}


def _tiny_runs(out: Path) -> tuple[list[Path], list[Path]]:
    """Train both sides for 2 steps on tiny-qwen3 and the scripted parity env (the tests' fixtures)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "train"))
    from _train_fakes import PARITY_TASKS, make_parity_env

    from mas_train.assemble import assemble_trainer
    from mas_train.config import TrainConfig
    from mas_train.models import resolve_model_path
    from mas_train.tracking import RunLogger

    runs: dict[str, list[Path]] = {"before": [], "after": []}
    for side, extra in (("before", {}), ("after", AFTER)):
        cfg = TrainConfig.from_dict(
            {
                "env": "parity",
                "model": resolve_model_path("tiny-qwen3"),
                "num_generations": 2,
                "tasks_per_step": 2,
                "max_steps": 2,
                "eval_steps": 2,
                "eval_num_tasks": 2,
                "save_steps": 0,
                "output_dir": str(out),
                "run_name": side,
                "sampling": {"max_new_tokens": 4},
                **extra,
            }
        )
        trainer = assemble_trainer(
            cfg.resolve(["solver", "verifier"]),
            env_factory=make_parity_env,
            train_tasks=PARITY_TASKS,
            eval_tasks=PARITY_TASKS,
        )
        try:
            logger = RunLogger(trainer.run_dir, report_to=["jsonl"])
            trainer.fit(logger, progress=False)
            logger.close()
        finally:
            trainer.close()
        runs[side].append(trainer.run_dir)
    return runs["before"], runs["after"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", nargs="*", type=Path, default=[], help="finished runs in data order")
    p.add_argument("--after", nargs="*", type=Path, default=[], help="finished runs with the task pool")
    p.add_argument("--tiny", action="store_true", help="train both sides 2 steps on tiny-qwen3 (CI)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before, after = _tiny_runs(Path(tmp)) if a.tiny else (a.before, a.after)
        if not before or not after:
            p.error("give --before and --after run folders (or --tiny)")
        runs = {str(r): run_summary(r) for r in [*before, *after]}
    b = _mean([runs[str(r)] for r in before])
    f = _mean([runs[str(r)] for r in after])

    def ratio(k: str) -> float:
        return f[k] / b[k] if b[k] and math.isfinite(b[k]) and math.isfinite(f[k]) else math.nan

    result = {
        "before": b,
        "after": f,
        "ratio_episodes_per_gain": ratio("episodes_per_gain"),
        "ratio_update_tokens_per_step": ratio("update_tokens_per_step"),
        "ratio_wall": (f["train_s"] + f["eval_s"]) / (b["train_s"] + b["eval_s"]),
        "runs": runs,
    }
    for side, m in (("before", b), ("after", f)):
        print(
            f"{side:>6}: {m['episodes']:.0f} episodes, gain {m['gain']:+.3f}, {m['episodes_per_gain']:.1f} episodes "
            f"per +0.01, update tokens/step {m['update_tokens_per_step']:.0f}, saturated {m['saturated_frac']:.2f}, "
            f"train {m['train_s']:.0f} s + eval {m['eval_s']:.0f} s"
        )
    print(
        f"after/before: episodes per gain {result['ratio_episodes_per_gain']:.2f}, update tokens per step "
        f"{result['ratio_update_tokens_per_step']:.2f}, wall {result['ratio_wall']:.2f}"
    )
    emit(result, a.json)


if __name__ == "__main__":
    main()

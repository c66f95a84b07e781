"""Fake run folders (metrics.jsonl + config.yaml) for the mas-plot and mas-compare tests."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml


def write_fake_run(
    run_dir: Path,
    *,
    mode: str = "drmas",
    seed: int = 0,
    steps: int = 12,
    grad_norms: Mapping[str, Sequence[float]] | None = None,
    evals: Sequence[tuple[int, float, float]] = ((0, 0.25, 0.5), (12, 0.5, 0.75)),
    factor: Mapping[str, float] | None = None,
    extra_keys: bool = True,
    max_steps: int | None = None,
    diversity: bool = False,
    diagnostics: bool = False,
) -> Path:
    """A run folder: ``steps`` training lines, eval lines ``(step, avg@4, pass@4)``, and a ``config.yaml``.

    ``grad_norms[agent][i]`` is ``losses/grad_norm/<agent>`` at step i + 1 (default a smooth curve per agent).
    ``diversity``: also ``diversity/…`` keys (G = 4: the solver's first turns collapse from 4 to 1, its answers
    from 3 to 1; the verifier's stay at 2) and ``num_generations: 4`` in the config.
    ``diagnostics``: per agent in ``grad_norms`` also, at step i + 1, ``charts/advantage/zero_std_frac`` 0.5 on odd
    i else 0 (mean 0.25), ``lemma/noise_share`` 0.02·i (mean 0.11), ``charts/advantage/mean`` −0.1 for the
    verifier else 0, ``lld/success_logp`` −1 − 0.1·i (first three steps −1.1, last three −2.0).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    grad_norms = grad_norms or {
        "solver": [1.0 + 0.1 * i for i in range(steps)],
        "verifier": [0.5 + 0.05 * math.sin(i) for i in range(steps)],
    }
    factor = factor or {"solver": 1.0, "verifier": 1.5}
    lines = []
    by_step = {s: (a, p) for s, a, p in evals}
    if 0 in by_step:
        lines.append({"step": 0, "time": 0.0, "eval/avg@4": by_step[0][0], "eval/pass@4": by_step[0][1]})
    for i in range(steps):
        step = i + 1
        rec = {"step": step, "time": float(step), "charts/reward": 0.1 * step / steps + 0.05 * (seed + 1)}
        rec["charts/success_rate"] = rec["charts/reward"]
        for a, g in grad_norms.items():
            rec[f"losses/grad_norm/{a}"] = g[i]
            if extra_keys:
                rec[f"charts/invalid_rate/{a}"] = max(0.0, 0.5 - 0.03 * step)
                rec[f"lemma/factor/{a}"] = factor.get(a, 1.0) + 0.01 * i
            if diagnostics:
                rec[f"charts/advantage/zero_std_frac/{a}"] = 0.5 * (i % 2)
                rec[f"lemma/noise_share/{a}"] = 0.02 * i
                rec[f"charts/advantage/mean/{a}"] = -0.1 if a == "verifier" else 0.0
                rec[f"lld/success_logp/{a}"] = -1.0 - 0.1 * i
        if diversity:
            rec["diversity/distinct/solver"] = 4.0 - 3.0 * i / max(1, steps - 1)
            rec["diversity/distinct_frac/solver"] = rec["diversity/distinct/solver"] / 4
            rec["diversity/distinct_answers/solver"] = 3.0 - 2.0 * i / max(1, steps - 1)
            rec["diversity/distinct/verifier"] = 2.0
            rec["diversity/distinct_frac/verifier"] = 0.5
        if extra_keys:
            rec["env/verifier_accuracy"] = 0.5 + 0.02 * step
            rec["env/solver_turns"] = 1.5
            rec["charts/reward_null"] = None  # a non-finite value, logged as null
        lines.append(rec)
        if step in by_step and step != 0:
            lines.append({"step": step, "eval/avg@4": by_step[step][0], "eval/pass@4": by_step[step][1]})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    cfg = {"env": "math-2agent", "advantage_mode": mode, "seed": seed, "max_steps": max_steps or steps}
    if diversity:
        cfg["num_generations"] = 4
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return run_dir

"""Draw docs/img/search_run_env.png: per training step of the default search run, one line per seed.

Usage: ``python docs/scripts/search_run_env.py OUT.png RUN_DIR [RUN_DIR ...]`` (each RUN_DIR a
``mas-train --env search-3agent --seed N`` run folder with its ``metrics.jsonl``; the legend says seed 0, 1, ...
in the order given). ``mas-plot`` draws every logged metric; this figure keeps the six that the search
section of docs/training.md discusses.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("env/searches", "searches per episode", (0, 2.2)),
    ("env/evidence_hit", "evidence hit rate", (0, 1.05)),
    ("env/verifier_accuracy", "verifier verdict accuracy", (0, 1.05)),
    ("env/verifier_yes_rate", "verifier yes rate", (0, 1.05)),
    ("losses/grad_norm/searcher", "searcher gradient norm", None),
    ("lemma/factor/searcher", "Lemma 4.2 factor, searcher (1 = no inflation)", None),
]


def main(out: str, runs: list[str]) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(14.5, 7.6))
    n_steps = 0
    for i, run in enumerate(runs):
        rows = [json.loads(line) for line in open(Path(run) / "metrics.jsonl")]
        train = [r for r in rows if "charts/reward" in r]
        steps = [r["step"] for r in train]
        n_steps = max(n_steps, max(steps))
        for ax, (key, _, _) in zip(axes.flat, PANELS, strict=True):
            ax.plot(steps, [r.get(key, float("nan")) for r in train], marker="o", ms=3.5, label=f"seed {i}")
    for ax, (key, title, ylim) in zip(axes.flat, PANELS, strict=True):
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.set_xticks(range(1, n_steps + 1))
        ax.grid(alpha=0.3)
        if ylim:
            ax.set_ylim(*ylim)
        if key == "lemma/factor/searcher":
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    axes.flat[0].legend(loc="lower left")
    fig.suptitle(
        f"search-3agent training steps, {len(runs)} seeds (each point: the step's 16 trajectories of 2 questions)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

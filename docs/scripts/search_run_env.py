"""Draw docs/img/search_run_env.png: per training step of the default search run, one line per seed.

Usage: ``python docs/scripts/search_run_env.py OUT.png RUN_DIR [RUN_DIR ...]`` (each RUN_DIR a
``mas-train --env search-3agent --seed N`` run folder with its ``metrics.jsonl``; the legend says seed 0, 1, ...
in the order given). ``mas-plot`` draws every logged metric with the same loader and panel layout
(:mod:`mas_train.tools.plots`); this figure keeps the six that the search section of docs/training.md discusses.
Exits with one error line when a run lacks ``metrics.jsonl`` or no run logged one of the six metrics.
"""

import sys
from pathlib import Path

from mas_train.tools.plots import load_run, panels_figure

#: (panel title, metric key, y label); a y label with "fraction" gets an axis spanning [0, 1]
PANELS = [
    ("searches per episode", "env/searches", "searches"),
    ("evidence hit rate", "env/evidence_hit", "fraction of episodes"),
    ("verifier verdict accuracy", "env/verifier_accuracy", "fraction of verdicts"),
    ("verifier yes rate", "env/verifier_yes_rate", "fraction of verdicts"),
    ("searcher gradient norm", "losses/grad_norm/searcher", "gradient L2 norm"),
    ("Lemma 4.2 factor, searcher (1 = no inflation)", "lemma/factor/searcher", "factor"),
]


def main(out: str, run_dirs: list[str]) -> int:
    try:
        runs = [load_run(d, label=f"seed {i}") for i, d in enumerate(run_dirs)]
    except (FileNotFoundError, ValueError) as e:
        print(f"search_run_env.py: {e}", file=sys.stderr)
        return 2
    missing = [key for _, key, _ in PANELS if not any(r.get(key)[0] for r in runs)]
    if missing:
        print(
            f"search_run_env.py: no run logged {', '.join(missing)}; pass search-3agent run folders",
            file=sys.stderr,
        )
        return 2
    n = len(runs)
    title = f"search-3agent training steps, {n} seeds (each point: the step's 16 trajectories of 2 questions)"
    panels_figure(runs, PANELS, title, Path(out), marker="o")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python docs/scripts/search_run_env.py OUT.png RUN_DIR [RUN_DIR ...]")
    sys.exit(main(sys.argv[1], sys.argv[2:]))

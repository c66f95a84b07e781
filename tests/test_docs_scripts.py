"""The figure scripts under docs/scripts draw from run folders as mas-train writes them, so none can rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_search_run_env_figure_draws_every_run_and_step(tmp_path):
    from PIL import Image

    runs = []
    for seed in range(2):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        lines = [{"step": 0, "eval/avg@4": 0.25}]  # an eval line: not a training step, skipped
        for step in range(1, 5):
            lines.append(
                {
                    "step": step,
                    "charts/reward": 0.25 * step,
                    "env/searches": 1.5,
                    "env/evidence_hit": 0.5,
                    "env/verifier_accuracy": 0.75,
                    "env/verifier_yes_rate": 0.25,
                    "losses/grad_norm/searcher": 0.1 * step,
                    "lemma/factor/searcher": 1.0,
                }
            )
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        runs.append(str(run))
    out = tmp_path / "env.png"
    script = ROOT / "docs" / "scripts" / "search_run_env.py"
    subprocess.run([sys.executable, str(script), str(out), *runs], check=True, timeout=120)
    assert Image.open(out).size == (1450, 760)  # figsize 14.5 x 7.6 in at 100 dpi

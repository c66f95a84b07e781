"""The figure scripts under docs/scripts draw from run folders as mas-train writes them, so none can rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "scripts" / "search_run_env.py"
KEYS = (
    "env/searches",
    "env/evidence_hit",
    "env/verifier_accuracy",
    "env/verifier_yes_rate",
    "losses/grad_norm/searcher",
    "lemma/factor/searcher",
)


def _run_dir(path: Path, keys=KEYS) -> str:
    path.mkdir()
    lines = [{"step": 0, "eval/avg@4": 0.25}]  # an eval line: drawn in no panel
    lines += [{"step": s, "charts/reward": 0.25 * s, **{k: 0.1 * s for k in keys}} for s in range(1, 5)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def _draw(out: Path, runs: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *runs], capture_output=True, text=True, timeout=120
    )


def test_search_run_env_figure_draws_six_panels_and_refuses_a_run_without_its_metrics(tmp_path):
    from PIL import Image

    out = tmp_path / "env.png"
    done = _draw(out, [_run_dir(tmp_path / "seed0"), _run_dir(tmp_path / "seed1")])
    assert done.returncode == 0, done.stderr
    # mas-plot's panel grid: 3 columns x 2 rows of 4.6 x 3.4 in (+0.5 in for the titles) at 100 dpi; a panel
    # whose metric no run logged would be dropped, so six panels is also what the next case guards
    assert Image.open(out).size == (1380, 730)

    bad = _draw(tmp_path / "bad.png", [_run_dir(tmp_path / "math", keys=KEYS[:4])])
    assert bad.returncode == 2 and not (tmp_path / "bad.png").exists()
    assert bad.stderr.strip().splitlines() == [
        "search_run_env.py: no run logged losses/grad_norm/searcher, lemma/factor/searcher; "
        "pass search-3agent run folders"
    ]
    gone = _draw(tmp_path / "x.png", [str(tmp_path / "nowhere")])
    assert gone.returncode == 2 and "metrics.jsonl not found" in gone.stderr


@pytest.mark.parametrize(
    ("extra", "full"), [(["--layout", "last"], False), (["--full", "--lr", "0.001"], True)]
)
def test_the_kuhn_card_probe_takes_exact_gradient_steps_that_raise_both_seats_value(extra, full):
    """scripts/kuhn_card_probe.py on the tiny model, through a LoRA adapter and through every weight (``--full``):
    the table it reports is a real one (its exploitability within [0, 17/12]), and two Adam steps up the exact
    gradient raise the seats' summed value against uniform."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import kuhn_card_probe
    finally:
        sys.path.pop(0)
    hist = kuhn_card_probe.main(["--model", "tiny-qwen3", "--steps", "2", "--lr", "0.05", *extra])
    assert [h["step"] for h in hist] == [0, 1, 2]
    assert all(0.0 <= h["exploitability"] <= 17 / 12 and 0.0 <= h["card_gap"] <= 1.0 for h in hist)
    assert hist[2]["v0"] + hist[2]["v1"] > hist[0]["v0"] + hist[0]["v1"]
    # --full trains every weight of the model; the adapter run trains only its LoRA matrices
    n, total = hist[0]["trainable_params"], hist[0]["params"]
    assert n == total if full else 0 < n < total / 10

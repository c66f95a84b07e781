"""mas-plot: figures from fake metrics.jsonl files; missing metrics skip a figure, never crash."""

from __future__ import annotations

import json

import pytest
from _fake_runs import write_fake_run

from mas_train.tools.plots import load_run, main, plot_run, plot_runs, trailing_mean

ALL = ["reward.png", "eval.png", "invalid_rate.png", "grad_norm.png", "env.png", "lemma_factor.png"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_load_run_series_skip_nulls_and_text(tmp_path):
    run = load_run(write_fake_run(tmp_path / "r", steps=4, evals=((0, 0.25, 0.5), (4, 0.5, 0.75))))
    assert run.get("eval/avg@4") == ([0, 4], [0.25, 0.5])
    assert run.get("losses/grad_norm/solver")[0] == [1, 2, 3, 4]
    assert "charts/reward_null" not in run.series and "time" not in run.series


def test_plot_run_writes_every_figure_into_run_plots(tmp_path):
    run = write_fake_run(tmp_path / "r")
    paths = plot_run(run)
    assert [p.name for p in paths] == ALL
    for p in paths:
        assert p.parent == run / "plots"
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_overlay_and_missing_metrics_skip_figures(tmp_path):
    full = write_fake_run(tmp_path / "a")
    bare = write_fake_run(tmp_path / "b", extra_keys=False, evals=())  # no eval, env, invalid, lemma keys
    assert [p.name for p in plot_run(bare)] == ["reward.png", "grad_norm.png"]
    paths = plot_runs([full, bare], tmp_path / "out")
    assert [p.name for p in paths] == ALL


def test_truncated_last_line_is_ignored_and_corrupt_middle_line_raises(tmp_path):
    run = write_fake_run(tmp_path / "r", steps=3, evals=())
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 4, "charts/rew')
    assert load_run(run).get("charts/reward")[0] == [1, 2, 3]
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write("\n" + json.dumps({"step": 5, "charts/reward": 1.0}) + "\n")
    with pytest.raises(ValueError, match="metrics.jsonl:4 is not JSON"):
        load_run(run)


def test_cli(tmp_path, capsys):
    a, b = write_fake_run(tmp_path / "a"), write_fake_run(tmp_path / "b", mode="grpo")
    assert main([str(a), str(b), "--out", str(tmp_path / "o"), "--labels", "drmas,grpo"]) == 0
    assert len(capsys.readouterr().out.split()) == len(ALL)
    assert main([str(tmp_path / "nope")]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(a), str(b)])  # several runs need --out
    assert "need --out" in capsys.readouterr().err


def test_trailing_mean_and_a_long_run_draws_it(tmp_path):
    assert trailing_mean([1.0, 0.0, 2.0, 4.0], 2) == [1.0, 0.5, 1.0, 3.0]
    assert trailing_mean([3.0], 5) == [3.0] and trailing_mean([], 5) == []
    paths = plot_run(write_fake_run(tmp_path / "r", steps=12))  # > SMOOTH_STEPS points: the smoothed path
    assert paths[0].name == "reward.png" and paths[0].read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(("steps", "ticks"), [([1], [1]), ([0], [0]), ([0, 1], [0, 1]), ([0, 1, 2, 3], None)])
def test_few_point_panels_get_whole_step_ticks(steps, ticks):
    """A 1-step run's panels autoscaled x to a sliver around the point, ticked -0.04 ... 0.04 (issue 28.13)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mas_train.tools.plots import style_axes

    fig, ax = plt.subplots()
    ax.plot(steps, [0.5] * len(steps), marker="o")
    style_axes(ax, "t", "reward")
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    shown = [t for t in ax.get_xticks() if lo <= t <= hi]
    plt.close(fig)
    assert all(t == int(t) for t in shown), shown
    assert lo < min(steps) and hi > max(steps)
    if ticks is not None:
        assert shown == ticks


def test_a_one_panel_figure_keeps_its_whole_title():
    """lemma_factor.png of a one-agent run: one 4.6-inch panel under a 90-character title, cut at both ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mas_train.tools.plots import fit_suptitle

    title = "Lemma 4.2 factor per agent (1 = global baseline costs nothing; no point where σ = 0)"
    fig, _ = plt.subplots(figsize=(4.6, 3.9), constrained_layout=True)
    text = fit_suptitle(fig, title)
    fig.canvas.draw()
    box = text.get_window_extent()
    plt.close(fig)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox)
    assert " ".join(text.get_text().split()) == title  # wrapped, nothing dropped


def test_diversity_figure_only_for_runs_that_logged_it(tmp_path):
    run = write_fake_run(tmp_path / "r", steps=4, diversity=True)
    paths = plot_run(run)
    assert [p.name for p in paths] == [*ALL, "diversity.png"]
    data = paths[-1].read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert "diversity.png" not in [p.name for p in plot_run(write_fake_run(tmp_path / "plain"))]

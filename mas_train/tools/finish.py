"""What ``mas-train`` (and each run of ``mas-compare``) does at the end of a run: draw the plots and write the
report (:class:`mas_train.run.EndOfRun`; the run layer takes it from its caller and imports no tool)."""

from __future__ import annotations

from pathlib import Path

from mas_train.config import TrainConfig
from mas_train.run import EndOfRun

__all__ = ["draw_plots", "end_of_run", "write_report"]


def draw_plots(run_dir: Path, cfg: TrainConfig) -> list[Path]:
    """Draw the run's plots into ``run_dir/plots`` when its metrics were written as JSONL; their paths (none
    without matplotlib, part of the train extra: a trimmed install just skips the pictures)."""
    if "jsonl" not in cfg.report_to:
        return []
    try:
        from mas_train.tools.plots import plot_run
    except ImportError:
        return []
    return list(plot_run(run_dir, run_dir / "plots"))


def write_report(run_dir: Path) -> str | None:
    """Write ``run_dir/report.html`` (curves, episodes, step 0 vs last evaluation); its path (``None`` without
    jinja2, part of the train extra)."""
    try:
        from mas_train.tools.report import build_run_report

        return str(build_run_report(run_dir))
    except ImportError:
        return None


def end_of_run() -> EndOfRun:
    """The end-of-run work of ``mas-train``: :func:`draw_plots` and :func:`write_report`."""
    return EndOfRun(plots=draw_plots, report=write_report)

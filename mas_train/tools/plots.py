"""``mas-plot``: PNG figures of one or more runs from their ``metrics.jsonl`` (matplotlib, headless).

``mas-plot RUN_DIR [RUN_DIR ...] [--out DIR]`` writes, when the run logged the metrics (a figure or panel whose
metrics no run has is skipped, never an error):

===================  =============================================================================
file                 what
===================  =============================================================================
``reward.png``       ``charts/reward`` and ``charts/success_rate`` over training steps
``eval.png``         ``eval/avg@k`` and ``eval/pass@k`` at each evaluation (step 0 = before training)
``invalid_rate.png`` ``charts/invalid_rate/<agent>``, one panel per agent
``grad_norm.png``    ``losses/grad_norm/<agent>``, one panel per agent
``env.png``          ``env/<name>`` (per-episode env metrics), one panel per metric
``lemma_factor.png`` ``lemma/factor/<agent>`` (Lemma 4.2 inflation factor), one panel per agent
``diversity.png``    ``diversity/distinct/<agent>`` and ``diversity/distinct_answers/<agent>``, one panel each
===================  =============================================================================

Several runs overlay, one colour per run, with a legend. One run writes into ``RUN_DIR/plots`` by default;
several need ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "RunMetrics",
    "fit_suptitle",
    "load_run",
    "main",
    "panels_figure",
    "plot_run",
    "plot_runs",
    "style_axes",
]

_EVAL_KEY = re.compile(r"^eval/(avg|pass)@(\d+)$")


@dataclass
class RunMetrics:
    """The series of one run: ``series[key] = (steps, values)``, non-null values only, in file order.

    Attributes:
        run_dir: the run folder.
        label: the name shown in legends (the folder name).
        series: metric name -> (steps, values).
    """

    run_dir: Path
    label: str
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)

    def get(self, key: str) -> tuple[list[int], list[float]]:
        return self.series.get(key, ([], []))

    def keys(self, prefix: str) -> list[str]:
        """Metric names starting with ``prefix``, in order of first appearance."""
        return [k for k in self.series if k.startswith(prefix)]


def load_run(run_dir: str | Path, label: str | None = None) -> RunMetrics:
    """Read ``RUN_DIR/metrics.jsonl`` (one JSON object a line with ``step`` and metric keys).

    Non-numeric values (e.g. the task ids a line carries) and ``null`` (non-finite) values are skipped; a
    truncated last line (a run killed mid-write) is ignored.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` in ``run_dir`` (the message says what to pass instead).
    """
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found; pass a run folder written by mas-train with the jsonl sink (report_to: jsonl)"
        )
    run = RunMetrics(run_dir=run_dir, label=label or run_dir.name)
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # half-written last line
            raise ValueError(f"{path}:{i + 1} is not JSON; the file is corrupt") from None
        step = rec.get("step")
        if not isinstance(step, int | float):
            continue
        for k, v in rec.items():
            if k in ("step", "time") or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if not math.isfinite(v):
                continue
            steps, values = run.series.setdefault(k, ([], []))
            steps.append(int(step))
            values.append(float(v))
    return run


#: Window of the trailing mean drawn over the per-step training curves (reward, env metrics).
SMOOTH_STEPS = 5


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """``out[i]`` = mean of ``values[max(0, i - window + 1) : i + 1]`` (the first points average what there is)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def style_axes(ax, title: str, ylabel: str, *, hline: float | None = None) -> None:
    """The look every panel of mas-plot and mas-compare shares: title, "training step" on x with whole-number
    ticks, a light grid, an optional dotted reference line, and a fraction's axis spanning at least [0, 1] so a
    flat 0 does not look like noise."""
    from matplotlib.ticker import MaxNLocator

    if hline is not None:
        ax.axhline(hline, color="k", lw=0.8, ls=":")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    # a run of one or two steps autoscales x to a sliver around its points (ticks -0.04 ... 0.04): widen it to
    # half a step either side, and let a single whole-number tick stand alone
    lo, hi = ax.get_xlim()
    first, last = math.ceil(lo), math.floor(hi)
    if last - first < 2:
        ax.set_xlim(first - 0.5, max(last, first) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    if "norm" in ylabel and ax.get_ylim()[0] < 0:  # a norm is >= 0: a flat 0 autoscales to +-0.05
        ax.set_ylim(bottom=-0.03 * ax.get_ylim()[1])
    if ylabel.startswith(
        "distinct"
    ):  # a count of distinct samples is >= 1: keep the collapsed line 1 in view
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 0.8), max(hi, 1.2))
    if "fraction" in ylabel or ylabel in ("reward", "success rate"):
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, -0.02), max(hi, 1.02))


def fit_suptitle(fig, text: str, fontsize: float = 12.0):
    """``fig.suptitle(text)`` with each line wrapped to the figure's width (a one-panel figure is 4.6 in wide:
    a long title would be cut at both edges); returns the title's ``Text``."""
    import textwrap

    # ~0.6 em per character of the default sans-serif font, 72 points per inch, a margin of 5 %
    width = max(20, int(0.95 * fig.get_figwidth() * 72 / (0.6 * fontsize)))
    lines = [textwrap.fill(line, width) for line in text.split("\n")]
    return fig.suptitle("\n".join(lines), fontsize=fontsize)


def panels_figure(
    runs: Sequence[RunMetrics],
    panels: Sequence[tuple[str, str, str]],
    title: str,
    path: Path,
    *,
    marker: str = "",
    hline: float | None = None,
    smooth: int = 0,
    ylim: tuple[float, float] | None = None,
) -> Path | None:
    """One figure, one panel per ``(panel title, metric key, y label)``; a line per run. None if no data.

    ``ylim``: the same y range on every panel (default: each panel its own).

    ``smooth`` W > 1: a run with more than W points is drawn thin (per step) with a thick line over it, the
    trailing mean of the last W steps (a step of a few tasks is noisy: its reward swings with their difficulty).
    """
    panels = [p for p in panels if any(r.get(p[1])[0] for r in runs)]
    if not panels:
        return None
    plt = pyplot()
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows + 0.5), squeeze=False, constrained_layout=True
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    smoothed = False
    for ax, (ptitle, key, ylabel) in zip(axes.flat, panels, strict=False):
        for j, run in enumerate(runs):
            steps, values = run.get(key)
            color = colors[j % len(colors)]
            if steps and smooth > 1 and len(steps) > smooth:
                ax.plot(steps, values, ls="-", lw=0.8, alpha=0.45, color=color)
                ax.plot(steps, trailing_mean(values, smooth), ls="-", lw=2.2, color=color, label=run.label)
                smoothed = True
            elif steps:
                # a one-point series is invisible as a line alone
                dot = marker or ("o" if len(steps) == 1 else None)
                ax.plot(steps, values, marker=dot, ls="-", color=color, label=run.label)
        style_axes(ax, ptitle, ylabel, hline=hline)
        if ylim is not None:
            ax.set_ylim(*ylim)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if len(runs) > 1:
        handles, labels = [], []
        for ax in axes.flat:
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), fontsize=8)
    fit_suptitle(
        fig, f"{title}\nthin: each step; thick: mean of the last {smooth} steps" if smoothed else title
    )
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _agents(runs: Sequence[RunMetrics], prefix: str) -> list[str]:
    seen: list[str] = []
    for r in runs:
        for k in r.keys(prefix):
            a = k[len(prefix) :]
            if a and a not in seen:
                seen.append(a)
    return seen


def _eval_figure(runs: Sequence[RunMetrics], path: Path) -> Path | None:
    keys: list[str] = []
    for r in runs:
        keys += [k for k in r.series if _EVAL_KEY.match(k) and k not in keys]

    def kind_and_n(key: str) -> tuple[str, str]:
        m = _EVAL_KEY.match(key)
        assert m is not None  # keys were filtered by this pattern above
        return m.group(1), m.group(2)

    keys.sort(key=lambda k: (kind_and_n(k)[0], int(kind_and_n(k)[1])))
    panels = []
    for k in keys:
        kind, n = kind_and_n(k)
        what = "mean success over the k samples" if kind == "avg" else "any of the k samples succeeds"
        ptitle = f"{kind}@{n} ({what})"
        if len(runs) == 1:
            steps, values = runs[0].get(k)
            if len(values) >= 2:
                ptitle += f"\nstep {steps[0]} → {steps[-1]}: {values[0]:.3f} → {values[-1]:.3f}"
        panels.append((ptitle, k, "fraction of eval tasks"))
    return panels_figure(runs, panels, "Evaluation (step 0 = before training)", path, marker="o")


def _num_generations(runs: Sequence[RunMetrics]) -> int | None:
    """G (``num_generations`` of ``config.yaml``) when every run has the same one, else None."""
    import yaml

    found = set()
    for r in runs:
        path = r.run_dir / "config.yaml"
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
        found.add(cfg.get("num_generations") if isinstance(cfg, dict) else None)
    g = found.pop() if len(found) == 1 else None
    return g if isinstance(g, int) and not isinstance(g, bool) else None


def _diversity_figure(runs: Sequence[RunMetrics], path: Path) -> Path | None:
    """``diversity/distinct`` (first turns) and ``diversity/distinct_answers`` (the env's parsed final answers)
    per agent, on one y range [1, G] when every run has the same G."""
    panels = []
    for a in _agents(runs, "diversity/distinct/"):
        panels.append((f"{a}: first turns (completions)", f"diversity/distinct/{a}", "distinct of G samples"))
        panels.append(
            (f"{a}: final answers (parsed)", f"diversity/distinct_answers/{a}", "distinct of G samples")
        )
    g = _num_generations(runs)
    title = (
        "Distinct samples per agent among a task's G (mean over the step's tasks)\n"
        f"1 = all G samples alike (collapsed); G{f' = {g}' if g else ''} (num_generations) = all different"
    )
    return panels_figure(
        runs, panels, title, path, hline=1.0, smooth=SMOOTH_STEPS, ylim=(0.8, g + 0.2) if g else None
    )


def plot_runs(
    run_dirs: Sequence[str | Path], out_dir: str | Path, labels: Sequence[str] | None = None
) -> list[Path]:
    """Draw the figures of ``run_dirs`` (overlaid) into ``out_dir``; returns the PNG paths written.

    Args:
        run_dirs: run folders, each with a ``metrics.jsonl``.
        out_dir: where the PNGs go (created).
        labels: legend names, one per run (default: the folder names, made unique).

    Raises:
        FileNotFoundError: a run folder without ``metrics.jsonl``.
        ValueError: ``labels`` of the wrong length, or a corrupt ``metrics.jsonl``.
    """
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"give one label per run: {len(run_dirs)} runs, {len(labels)} labels")
    if labels is None:
        names = [Path(d).name for d in run_dirs]
        labels = [
            n if names.count(n) == 1 else f"{Path(d).parent.name}/{n}"
            for n, d in zip(names, run_dirs, strict=True)
        ]
    runs = [load_run(d, lab) for d, lab in zip(run_dirs, labels, strict=True)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        panels_figure(
            runs,
            [
                ("team reward (mean over trajectories)", "charts/reward", "reward"),
                ("success rate", "charts/success_rate", "fraction of trajectories"),
            ],
            "Training rollouts",
            out / "reward.png",
            smooth=SMOOTH_STEPS,
        ),
        _eval_figure(runs, out / "eval.png"),
        panels_figure(
            runs,
            [
                (a, f"charts/invalid_rate/{a}", "fraction of turns")
                for a in _agents(runs, "charts/invalid_rate/")
            ],
            "Invalid (malformed) turns per agent",
            out / "invalid_rate.png",
        ),
        panels_figure(
            runs,
            [(a, f"losses/grad_norm/{a}", "gradient L2 norm") for a in _agents(runs, "losses/grad_norm/")],
            "Gradient norm per agent",
            out / "grad_norm.png",
        ),
        panels_figure(
            runs,
            [(n, f"env/{n}", "episode mean") for n in _agents(runs, "env/")],
            "Environment metrics (mean over episodes)",
            out / "env.png",
            smooth=SMOOTH_STEPS,
        ),
        panels_figure(
            runs,
            [
                (a, f"lemma/factor/{a}", r"$(\sigma_k^2 + (\mu_k - \mu)^2)/\sigma^2$")
                for a in _agents(runs, "lemma/factor/")
            ],
            "Lemma 4.2 factor per agent\n1 = a global baseline costs nothing; no point where σ = 0",
            out / "lemma_factor.png",
            marker="o",
            hline=1.0,
        ),
        _diversity_figure(runs, out / "diversity.png"),
    ]
    return [p for p in written if p is not None]


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """The figures of one run into ``out_dir`` (default ``RUN_DIR/plots``); returns the PNG paths written.

    Same errors as :func:`plot_runs`.
    """
    run_dir = Path(run_dir)
    return plot_runs([run_dir], out_dir if out_dir is not None else run_dir / "plots")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mas-plot", description="Draw PNG figures of mas-train runs.")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (each with metrics.jsonl)")
    ap.add_argument("--out", default=None, help="output folder (default: RUN_DIR/plots for one run)")
    ap.add_argument("--labels", default=None, help="comma-separated legend names, one per run")
    args = ap.parse_args(argv)
    if args.out is None and len(args.runs) > 1:
        ap.error("several runs need --out DIR (one folder for the overlaid figures)")
    labels = args.labels.split(",") if args.labels else None
    out = args.out if args.out is not None else Path(args.runs[0]) / "plots"
    try:
        paths = plot_runs(args.runs, out, labels)
    except (FileNotFoundError, ValueError) as err:
        print(f"mas-plot: error: {err}", file=sys.stderr)
        return 2
    if not paths:
        print("mas-plot: no known metrics in these runs; nothing drawn", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

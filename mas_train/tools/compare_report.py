"""The ``mas-compare`` report: per-mode numbers over seeds, ``summary.md``, ``summary.json`` and the PNGs.

What the numbers are is listed in :mod:`mas_train.tools.compare` (the command); this module computes them from run
folders (``config.yaml`` + ``metrics.jsonl``) and needs no model or training code.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mas_train.tools.plots import RunMetrics, load_run

__all__ = [
    "LLD_WINDOW",
    "SPIKE_FACTOR",
    "SPIKE_WINDOW",
    "RunSummary",
    "build_report",
    "count_spikes",
    "spearman",
    "summarize_run",
]

SPIKE_FACTOR = 3.0
SPIKE_WINDOW = 10
#: Steps averaged at each end of the LLD curve (``lld/success_logp/<agent>``) for its first / last value.
LLD_WINDOW = 3
EVAL_KEY = re.compile(r"^eval/(avg|pass)@(\d+)$")


def count_spikes(norms: Sequence[float], factor: float = SPIKE_FACTOR, window: int = SPIKE_WINDOW) -> int:
    """Steps whose value exceeds ``factor`` x the median of the up to ``window`` values before it.

    Args:
        norms: one gradient norm per step, in step order.
    """
    x = np.asarray(norms, dtype=np.float64)
    return int(sum(x[i] > factor * np.median(x[max(0, i - window) : i]) for i in range(1, x.size)))


@dataclass
class RunSummary:
    """Numbers of one run for the report.

    Attributes:
        run_dir, mode, seed: the run, its ``advantage_mode`` and ``seed``.
        k: the k of the eval metrics used (None when the run has no eval line).
        final_avg, final_pass: last eval line's ``avg@k``, ``pass@k``.
        gain_avg: ``avg@k`` of the last eval line minus the first (None with fewer than two eval lines).
        grad: per agent ``{"median", "p95", "max", "spikes", "steps"}`` of ``losses/grad_norm/<agent>``.
        factor: per agent, mean of ``lemma/factor/<agent>`` over steps.
        factor_norm: ``(factor, grad norm)`` of every (step, agent) where both are logged and the norm is > 0.
        zero_std: per agent, mean over steps of ``charts/advantage/zero_std_frac/<agent>``: the fraction of the
            agent's samples whose advantage was 0 because the std the mode divides by was 0 (no gradient from
            them), to read beside its norms.
        noise_share: per agent, mean over the steps where it is defined of ``lemma/noise_share/<agent>``
            = (μ_k − μ)² / (σ_k² + (μ_k − μ)²), the constant-offset part of GRPO's E[A²].
        adv_mean: per agent, mean over steps of ``charts/advantage/mean/<agent>`` (the advantage the agent's
            samples were trained on; 0 on average under per-agent normalisation).
        lld: per agent ``{"first", "last", "change"}`` of ``lld/success_logp/<agent>`` (mean per-token
            log-probability, nats, of the agent's turns in successful trajectories): the means of its first and
            last :data:`LLD_WINDOW` logged steps and last − first (negative = falling, the LLD signature).
    """

    run_dir: str
    mode: str
    seed: int
    k: int | None = None
    final_avg: float | None = None
    final_pass: float | None = None
    gain_avg: float | None = None
    grad: dict[str, dict[str, float]] = field(default_factory=dict)
    factor: dict[str, float] = field(default_factory=dict)
    factor_norm: list[tuple[float, float]] = field(default_factory=list)
    zero_std: dict[str, float] = field(default_factory=dict)
    noise_share: dict[str, float] = field(default_factory=dict)
    adv_mean: dict[str, float] = field(default_factory=dict)
    lld: dict[str, dict[str, float]] = field(default_factory=dict)


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equal-length samples (Pearson's r of their ranks; ties averaged).

    Returns:
        rho in [-1, 1], or None with fewer than 3 points or when either sample is constant.
    """
    import pandas as pd  # a dependency of `datasets`; its rank() averages ties as Spearman's rho needs

    if len(x) != len(y):
        raise ValueError(f"spearman needs samples of equal length, got {len(x)} and {len(y)}")
    if len(x) < 3:
        return None
    rx = pd.Series(x, dtype="float64").rank().to_numpy()
    ry = pd.Series(y, dtype="float64").rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _run_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; mas-compare needs run folders written by mas-train")
    cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if "advantage_mode" not in cfg:
        raise ValueError(f"{path} has no advantage_mode; cannot tell which mode the run used")
    return cfg


def summarize_run(run_dir: str | Path, metrics: RunMetrics | None = None) -> RunSummary:
    """The report numbers of one run folder (``config.yaml`` + ``metrics.jsonl``).

    Raises:
        FileNotFoundError: no ``config.yaml`` or ``metrics.jsonl``.
        ValueError: ``config.yaml`` without ``advantage_mode``.
    """
    run_dir = Path(run_dir)
    cfg = _run_config(run_dir)
    m = metrics or load_run(run_dir)
    s = RunSummary(str(run_dir), str(cfg["advantage_mode"]), int(cfg.get("seed", 0)))
    ks = sorted({int(g.group(2)) for k in m.series if (g := EVAL_KEY.match(k))})
    if ks:
        s.k = ks[-1]
        avg = m.get(f"eval/avg@{s.k}")[1]
        pas = m.get(f"eval/pass@{s.k}")[1]
        s.final_avg = avg[-1] if avg else None
        s.final_pass = pas[-1] if pas else None
        s.gain_avg = avg[-1] - avg[0] if len(avg) >= 2 else None
    for key in m.keys("losses/grad_norm/"):
        norms = m.get(key)[1]
        s.grad[key.split("/", 2)[2]] = {
            "median": float(np.median(norms)),
            "p95": float(np.percentile(norms, 95)),
            "max": float(np.max(norms)),
            "spikes": float(count_spikes(norms)),
            "steps": float(len(norms)),
        }
    for key in m.keys("lemma/factor/"):
        agent = key.split("/", 2)[2]
        s.factor[agent] = float(np.mean(m.get(key)[1]))
        norm_at = dict(zip(*m.get(f"losses/grad_norm/{agent}"), strict=True))
        s.factor_norm += [
            (f, norm_at[st]) for st, f in zip(*m.get(key), strict=True) if norm_at.get(st, 0) > 0
        ]
    for attr, prefix in (
        ("zero_std", "charts/advantage/zero_std_frac/"),
        ("noise_share", "lemma/noise_share/"),
        ("adv_mean", "charts/advantage/mean/"),
    ):
        for key in m.keys(prefix):
            if values := m.get(key)[1]:
                getattr(s, attr)[key[len(prefix) :]] = float(np.mean(values))
    for key in m.keys("lld/success_logp/"):
        if values := m.get(key)[1]:
            first, last = float(np.mean(values[:LLD_WINDOW])), float(np.mean(values[-LLD_WINDOW:]))
            s.lld[key.split("/", 2)[2]] = {"first": first, "last": last, "change": last - first}
    return s


def _agg(values: Sequence[float | None]) -> dict[str, Any]:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return {
        "mean": float(np.mean(v)) if v else None,
        "std": float(np.std(v, ddof=1)) if len(v) >= 2 else None,
        "values": [None if x is None else float(x) for x in values],
    }


def _fmt(a: dict[str, Any], digits: int = 3) -> str:
    if a["mean"] is None:
        return "–"
    s = f"{a['mean']:.{digits}f}"
    return s + (f" ± {a['std']:.{digits}f}" if a["std"] is not None else "")


def build_report(run_dirs: Sequence[str | Path], out_dir: str | Path) -> dict[str, Any]:
    """Write ``summary.md``, ``summary.json`` and the PNGs for ``run_dirs`` into ``out_dir``.

    Returns:
        The ``summary.json`` content: ``{"modes": {mode: {"seeds", "runs", "k", "final_avg", "final_pass",
        "gain_avg", "grad": {agent: {stat: agg}}, "factor": {agent: agg}}}, "runs": [per-run numbers], "files":
        [written paths]}``, each ``agg`` being ``{"mean", "std", "values"}`` over seeds.

    Raises:
        ValueError: no run folders, or runs of one mode disagree on the eval k.
        FileNotFoundError: a run folder without ``config.yaml`` or ``metrics.jsonl``.
    """
    if not run_dirs:
        raise ValueError("no run folders given; pass --runs DIR [DIR ...]")
    for d in run_dirs:  # every folder checked before anything is read or written
        _run_config(Path(d))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = {str(d): load_run(d) for d in run_dirs}
    runs = [summarize_run(d, metrics[str(d)]) for d in run_dirs]
    by_mode: dict[str, list[RunSummary]] = {}
    for r in sorted(runs, key=lambda r: (r.mode, r.seed)):
        by_mode.setdefault(r.mode, []).append(r)
    modes: dict[str, Any] = {}
    for mode, rs in by_mode.items():
        k_set = {r.k for r in rs if r.k is not None}
        if len(k_set) > 1:
            raise ValueError(f"runs of mode {mode} were evaluated with different k {sorted(k_set)}")
        agents = list(dict.fromkeys(a for r in rs for a in r.grad))
        f_agents = list(dict.fromkeys(a for r in rs for a in r.factor))

        def agents_of(attr: str, rs: list[RunSummary] = rs) -> list[str]:
            return list(dict.fromkeys(a for r in rs for a in getattr(r, attr)))

        modes[mode] = {
            "seeds": [r.seed for r in rs],
            "runs": [r.run_dir for r in rs],
            "k": next(iter(k_set), None),
            "final_avg": _agg([r.final_avg for r in rs]),
            "final_pass": _agg([r.final_pass for r in rs]),
            "gain_avg": _agg([r.gain_avg for r in rs]),
            "grad": {
                a: {
                    st: _agg([r.grad[a][st] if a in r.grad else None for r in rs])
                    for st in ("median", "p95", "max", "spikes")
                }
                for a in agents
            },
            "factor": {a: _agg([r.factor.get(a) for r in rs]) for a in f_agents},
            **{
                attr: {a: _agg([getattr(r, attr).get(a) for r in rs]) for a in agents_of(attr)}
                for attr in ("zero_std", "noise_share", "adv_mean")
            },
            "lld": {
                a: {
                    st: _agg([r.lld[a][st] if a in r.lld else None for r in rs])
                    for st in ("first", "last", "change")
                }
                for a in agents_of("lld")
            },
            "factor_norm_spearman": {
                "rho": spearman(*zip(*pts, strict=True))
                if (pts := [p for r in rs for p in r.factor_norm])
                else None,
                "points": len(pts),
            },
        }
    files = _report_plots(by_mode, metrics, out)
    ranked = sorted(
        (m["final_avg"]["mean"], mode) for mode, m in modes.items() if m["final_avg"]["mean"] is not None
    )
    ranking = [mode for _, mode in ranked]
    summary: dict[str, Any] = {
        "modes": modes,
        "ranking": ranking,
        "runs": [r.__dict__ for r in runs],
        "files": [str(p) for p in files],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(_markdown(modes, _ranking_text(ranked), files, out), encoding="utf-8")
    summary["files"] = [
        str(out / "summary.md"),
        str(out / "summary.json"),
        *summary["files"],
        *_html(run_dirs, out),
    ]
    return summary


def _html(run_dirs: Sequence[str | Path], out: Path) -> list[str]:
    """The comparison page ``out/report.html`` and each run's own page (:mod:`mas_train.tools.report`)."""
    try:
        from mas_train.tools.report import build_comparison, build_run_report
    except ImportError:  # jinja2 (train extra) missing: the markdown report stands alone
        return []
    if len(run_dirs) == 1:
        return [str(build_run_report(run_dirs[0]))]
    return [str(build_comparison(run_dirs, out / "report.html"))]


def _ranking_text(ranked: Sequence[tuple[float, str]]) -> str:
    """``"grpo < agent_mean = drmas"``: modes sorted by mean final avg@k, ``=`` between equal means."""
    text = ""
    for i, (value, mode) in enumerate(ranked):
        if i:
            text += " = " if value == ranked[i - 1][0] else " < "
        text += mode
    return text


def _markdown(modes: dict[str, Any], ranking: str, files: Sequence[Path], out: Path) -> str:
    lines = ["# mas-compare: advantage modes", ""]
    lines.append("Mean ± std over seeds (sample std; none with one seed). Gain = last − first eval line.")
    lines += ["", "| mode | seeds | final avg@k | final pass@k | gain avg@k |", "|---|---|---|---|---|"]
    for mode, m in modes.items():
        k = m["k"] if m["k"] is not None else "k"
        lines.append(
            f"| {mode} | {','.join(map(str, m['seeds']))} | {_fmt(m['final_avg'])} (k={k}) | "
            f"{_fmt(m['final_pass'])} | {_fmt(m['gain_avg'], 3)} |"
        )
    lines += [
        "",
        f"Gradient norm per agent (`losses/grad_norm/<agent>` over steps). Spike = a step whose norm exceeds "
        f"{SPIKE_FACTOR:g}x the median of the previous {SPIKE_WINDOW} steps. Zero-std = the fraction of the "
        "agent's samples whose advantage was 0 because the std the mode divides by was 0 (they add no gradient; "
        "read the norms beside it). Factor = mean Lemma 4.2 factor `lemma/factor/<agent>` (1 = a global baseline "
        "costs the agent nothing); noise share = mean (μ_k − μ)² / (σ_k² + (μ_k − μ)²), the part of GRPO's E[A²] "
        "that is a constant offset; mean adv. = mean advantage of the agent's samples.",
        "",
        "| mode | agent | median | p95 | max | spike steps | zero-std | lemma factor | noise share | mean adv. |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, m in modes.items():
        for a in dict.fromkeys([*m["grad"], *m["factor"]]):
            g = m["grad"].get(a)
            cells = [_fmt(g[st]) for st in ("median", "p95", "max")] if g else ["–"] * 3
            cells.append(_fmt(g["spikes"], 1) if g else "–")
            cells += [
                _fmt(m[attr][a]) if a in m[attr] else "–" for attr in ("zero_std", "factor", "noise_share")
            ]
            cells.append(_fmt(m["adv_mean"][a]) if a in m["adv_mean"] else "–")
            lines.append(f"| {mode} | {a} | " + " | ".join(cells) + " |")
    if any(m["lld"] for m in modes.values()):
        lines += [
            "",
            "Likelihood of success (`lld/success_logp/<agent>`: mean per-token log-probability, nats, of the agent's "
            f"turns in successful trajectories), mean of the first and last {LLD_WINDOW} steps. A falling value is "
            "the signature of Lazy Likelihood Displacement (arXiv 2512.04220).",
            "",
            "| mode | agent | first | last | change |",
            "|---|---|---|---|---|",
        ]
        for mode, m in modes.items():
            for a, v in m["lld"].items():
                lines.append(
                    f"| {mode} | {a} | {_fmt(v['first'])} | {_fmt(v['last'])} | {_fmt(v['change'])} |"
                )
    lines += [
        "",
        "Does the factor predict the norms? Spearman's ρ between `lemma/factor/<agent>` and "
        "`losses/grad_norm/<agent>` over the (run, step, agent) points with a non-zero norm:",
        "",
        "| mode | ρ | points |",
        "|---|---|---|",
    ]
    for mode, m in modes.items():
        rho, n = m["factor_norm_spearman"]["rho"], m["factor_norm_spearman"]["points"]
        lines.append(f"| {mode} | {'–' if rho is None else f'{rho:.2f}'} | {n} |")
    if ranking:
        lines += ["", f"Modes by mean final avg@k, lowest first: {ranking}."]
    lines += [""] + [f"![{p.stem}]({p.relative_to(out)})" for p in files] + [""]
    return "\n".join(lines)


def _mode_band(rs: Sequence[RunMetrics], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps logged by any seed, and the mean, min and max over the seeds that logged each one (a metric can be
    undefined at a step of one seed, e.g. the Lemma 4.2 factor when every task group's rewards are equal; a
    line that stopped there would read as a missing run)."""
    per = [dict(zip(*r.get(key), strict=True)) for r in rs]
    per = [p for p in per if p]
    if not per:
        return (np.zeros(0),) * 4
    steps = sorted(set().union(*(set(p) for p in per)))
    v = np.array([[p.get(s, np.nan) for s in steps] for p in per])
    return np.array(steps), np.nanmean(v, 0), np.nanmin(v, 0), np.nanmax(v, 0)


def _band_figure(
    by_mode: dict[str, list[RunSummary]],
    metrics: dict[str, RunMetrics],
    panels: Sequence[tuple[str, str, str]],
    title: str,
    path: Path,
    hline: float | None = None,
) -> Path | None:
    from mas_train.tools.plots import pyplot, style_axes

    has = [p for p in panels if any(metrics[r.run_dir].get(p[1])[0] for rs in by_mode.values() for r in rs)]
    if not has:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(has), figsize=(max(7.0, 5.2 * len(has)), 4.2), squeeze=False, constrained_layout=True
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (ptitle, key, ylabel) in zip(axes.flat, has, strict=True):
        for j, (mode, rs) in enumerate(by_mode.items()):
            steps, mean, lo, hi = _mode_band([metrics[r.run_dir] for r in rs], key)
            if not steps.size:
                continue
            c = colors[j % len(colors)]
            ax.plot(
                steps,
                mean,
                "-",
                # evaluations are a few points joined by lines: mark them so the line does not read as measured
                marker="o" if steps.size < 3 or key.startswith("eval/") else None,
                color=c,
                label=f"{mode} (n={len(rs)})",
            )
            if len(rs) > 1:
                ax.fill_between(steps, lo, hi, color=c, alpha=0.2, lw=0)
        style_axes(ax, ptitle, ylabel, hline=hline)
        ax.legend(fontsize=8)
    fig.suptitle(title + "\n(line = mean over seeds, band = min–max over seeds)", fontsize=11)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _report_plots(
    by_mode: dict[str, list[RunSummary]], metrics: dict[str, RunMetrics], out: Path
) -> list[Path]:
    all_runs = list(metrics.values())
    agents = list(dict.fromkeys(k.split("/", 2)[2] for r in all_runs for k in r.keys("losses/grad_norm/")))
    f_agents = list(dict.fromkeys(k.split("/", 2)[2] for r in all_runs for k in r.keys("lemma/factor/")))
    panels = [("team reward (mean over trajectories)", "charts/reward", "reward")]
    # success rate only where it says something the reward does not (in the math envs they are equal)
    if any(r.get("charts/success_rate") != r.get("charts/reward") for r in all_runs):
        panels.append(("success rate", "charts/success_rate", "fraction of trajectories"))
    ks = sorted({int(g.group(2)) for r in all_runs for k in r.series if (g := EVAL_KEY.match(k))})
    if ks:
        panels.append((f"held-out evaluation avg@{ks[-1]}", f"eval/avg@{ks[-1]}", f"avg@{ks[-1]}"))
    figs = [
        _band_figure(
            by_mode,
            metrics,
            panels,
            "Reward per advantage mode: training batches and held-out evaluation",
            out / "reward.png",
        )
    ]
    for a in agents:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", a)
        figs.append(
            _band_figure(
                by_mode,
                metrics,
                [(a, f"losses/grad_norm/{a}", "gradient L2 norm")],
                f"Gradient norm of {a} per advantage mode",
                out / f"grad_norm_{safe}.png",
            )
        )
    figs.append(
        _band_figure(
            by_mode,
            metrics,
            [(a, f"lemma/factor/{a}", r"$(\sigma_k^2 + (\mu_k - \mu)^2)/\sigma^2$") for a in f_agents],
            "Lemma 4.2 factor per agent",
            out / "lemma_factor.png",
            hline=1.0,
        )
    )
    figs.append(_factor_norm_figure(by_mode, metrics, f_agents, out / "factor_vs_norm.png"))
    ns_agents = list(
        dict.fromkeys(k.split("/", 2)[2] for r in all_runs for k in r.keys("lemma/noise_share/"))
    )
    figs.append(
        _band_figure(
            by_mode,
            metrics,
            [
                (a, f"lemma/noise_share/{a}", r"$(\mu_k - \mu)^2 / (\sigma_k^2 + (\mu_k - \mu)^2)$")
                for a in ns_agents
            ],
            "Noise share per agent: the constant-offset part of GRPO's E[A²]",
            out / "noise_share.png",
        )
    )
    lld_agents = list(
        dict.fromkeys(k.split("/", 2)[2] for r in all_runs for k in r.keys("lld/success_logp/"))
    )
    figs.append(
        _band_figure(
            by_mode,
            metrics,
            [(a, f"lld/success_logp/{a}", "mean log-prob per token (nats)") for a in lld_agents],
            "Likelihood of the agents' turns in successful trajectories (falling = LLD)",
            out / "lld.png",
        )
    )
    return [p for p in figs if p is not None]


def _factor_norm_figure(
    by_mode: dict[str, list[RunSummary]], metrics: dict[str, RunMetrics], agents: Sequence[str], path: Path
) -> Path | None:
    """One panel per agent: each (run, step) as a point (Lemma 4.2 factor, gradient norm), coloured by mode.

    The factor is a property of the batch's rewards, not of the mode, so the modes share the x axis: where a
    global baseline inflates an agent, its norms under ``grpo`` rise with the factor and those under ``drmas``
    do not. Steps where the agent got no gradient at all (norm 0: every sample's advantage was 0) are drawn as
    crosses on the x axis, since a low norm there means starved, not stable.
    """
    from mas_train.tools.plots import pyplot

    panels = [
        a
        for a in agents
        if any(metrics[r.run_dir].get(f"losses/grad_norm/{a}")[0] for rs in by_mode.values() for r in rs)
    ]
    if not panels:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(max(7.0, 5.2 * len(panels)), 4.4), squeeze=False, constrained_layout=True
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, a in zip(axes.flat, panels, strict=True):
        for j, (mode, rs) in enumerate(by_mode.items()):
            pts = []
            for r in rs:
                m = metrics[r.run_dir]
                norm_at = dict(zip(*m.get(f"losses/grad_norm/{a}"), strict=True))
                pts += [
                    (f, norm_at[st])
                    for st, f in zip(*m.get(f"lemma/factor/{a}"), strict=True)
                    if st in norm_at
                ]
            if not pts:
                continue
            x, y = np.array(pts).T
            c = colors[j % len(colors)]
            live = y > 0
            ax.scatter(x[live], y[live], s=18, alpha=0.7, color=c, label=f"{mode} ({int(live.sum())} steps)")
            if (~live).any():
                ax.scatter(
                    x[~live],
                    y[~live],
                    s=28,
                    marker="x",
                    color=c,
                    label=f"{mode}: no gradient ({int((~live).sum())})",
                )
        ax.axvline(1.0, color="k", lw=0.8, ls=":")
        ax.set_title(a, fontsize=10)
        ax.set_xlabel("Lemma 4.2 factor of the step (1 = no inflation)")
        ax.set_ylabel("gradient L2 norm")
        ax.set_ylim(bottom=-0.03 * ax.get_ylim()[1])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        "Does a global baseline inflate the norm where the factor says? (one point per run and step)",
        fontsize=11,
    )
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

"""The ``mas-compare`` figures: per-mode bands over seeds (reward, gradient norms, Lemma 4.2 factor, noise share,
the LLD probe) and the factor-vs-norm scatter. Computed from loaded run metrics; no model or training code."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mas_train.tools.plots import RunMetrics

if TYPE_CHECKING:
    from mas_train.tools.compare_report import RunSummary

__all__ = ["EVAL_KEY", "report_plots"]

EVAL_KEY = re.compile(r"^eval/(avg|pass)@(\d+)$")


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


def _agents_with(runs: Sequence[RunMetrics], prefix: str) -> list[str]:
    """The agents ``<prefix><agent>`` is logged for in any run, in order of first appearance."""
    return list(dict.fromkeys(k[len(prefix) :] for r in runs for k in r.keys(prefix)))


def report_plots(
    by_mode: dict[str, list[RunSummary]], metrics: dict[str, RunMetrics], out: Path
) -> list[Path]:
    all_runs = list(metrics.values())
    agents = _agents_with(all_runs, "losses/grad_norm/")
    f_agents = _agents_with(all_runs, "lemma/factor/")
    panels = [("team reward (mean over trajectories)", "charts/reward", "reward")]
    # success rate only where it says something the reward does not (in the math envs they are equal)
    if any(r.get("charts/success_rate") != r.get("charts/reward") for r in all_runs):
        panels.append(("success rate", "charts/success_rate", "fraction of trajectories"))
    ks = sorted({int(g.group(2)) for r in all_runs for k in r.series if (g := EVAL_KEY.match(k))})
    if ks:
        panels.append((f"held-out evaluation avg@{ks[-1]}", f"eval/avg@{ks[-1]}", f"avg@{ks[-1]}"))
    if any(r.get("eval/exploitability")[1] for r in all_runs):  # a game's exact measure (Kuhn poker)
        panels.append(("exact exploitability (lower is better)", "eval/exploitability", "chips per hand"))
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
    # one panel per agent that logged the metric: (key prefix, y label, title, file, reference line)
    for prefix, ylabel, title, name, hline in (
        (
            "lemma/factor/",
            r"$(\sigma_k^2 + (\mu_k - \mu)^2)/\sigma^2$",
            "Lemma 4.2 factor per agent",
            "lemma_factor",
            1.0,
        ),
        (
            "lemma/noise_share/",
            "fraction of E[A²] (noise share)",
            "Noise share per agent: the constant-offset part of GRPO's E[A²]",
            "noise_share",
            None,
        ),
        (
            "lld/success_logp/",
            "mean log-prob per token (nats)",
            "Likelihood of the agents' turns in successful trajectories (falling = LLD)",
            "lld",
            None,
        ),
    ):
        panels_of = [(a, prefix + a, ylabel) for a in _agents_with(all_runs, prefix)]
        figs.append(_band_figure(by_mode, metrics, panels_of, title, out / f"{name}.png", hline=hline))
        if name == "lemma_factor":
            figs.append(_factor_norm_figure(by_mode, metrics, f_agents, out / "factor_vs_norm.png"))
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
        1,
        len(panels),
        figsize=(max(7.0, 5.2 * len(panels)), 4.4),
        squeeze=False,
        sharex=True,  # one factor axis for every agent: an agent whose factor is always 1 reads as a thin column
        constrained_layout=True,
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    x_max = 1.0
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
            x_max = max(x_max, float(x.max()))
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

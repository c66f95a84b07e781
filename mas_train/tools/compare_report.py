"""The ``mas-compare`` report: per-mode numbers over seeds, ``summary.md``, ``summary.json`` and the PNGs.

What the numbers are is listed in :mod:`mas_train.tools.compare` (the command); this module computes them from run
folders (``config.yaml`` + ``metrics.jsonl``) and needs no model or training code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mas_train.tools.compare_plots import EVAL_KEY, report_plots
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
        factor_norm_agent: the same points per agent.
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
        exploitability: a game's exact ``eval/exploitability`` (Kuhn poker, chips per hand) ``{"first", "last",
            "change"}`` over the run's evaluations; empty for runs that do not log it.
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
    factor_norm_agent: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    zero_std: dict[str, float] = field(default_factory=dict)
    noise_share: dict[str, float] = field(default_factory=dict)
    adv_mean: dict[str, float] = field(default_factory=dict)
    lld: dict[str, dict[str, float]] = field(default_factory=dict)
    exploitability: dict[str, float] = field(default_factory=dict)


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
        pts = [(f, norm_at[st]) for st, f in zip(*m.get(key), strict=True) if norm_at.get(st, 0) > 0]
        s.factor_norm += pts
        s.factor_norm_agent[agent] = pts
    for attr, prefix in (
        ("zero_std", "charts/advantage/zero_std_frac/"),
        ("noise_share", "lemma/noise_share/"),
        ("adv_mean", "charts/advantage/mean/"),
    ):
        for key in m.keys(prefix):
            if values := m.get(key)[1]:
                getattr(s, attr)[key[len(prefix) :]] = float(np.mean(values))
    if ex := m.get("eval/exploitability")[1]:
        s.exploitability = {"first": float(ex[0]), "last": float(ex[-1]), "change": float(ex[-1] - ex[0])}
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
            "exploitability": {
                st: _agg([r.exploitability.get(st) for r in rs]) for st in ("first", "last", "change")
            }
            if any(r.exploitability for r in rs)
            else {},
            "factor_norm_spearman": {
                "rho": spearman(*zip(*pts, strict=True))
                if (pts := [p for r in rs for p in r.factor_norm])
                else None,
                "points": len(pts),
            },
            "factor_norm_spearman_by_agent": {
                a: {
                    "rho": spearman(*zip(*pts, strict=True))
                    if (pts := [p for r in rs for p in r.factor_norm_agent.get(a, [])])
                    else None,
                    "points": len(pts),
                }
                for a in f_agents
            },
        }
    files = report_plots(by_mode, metrics, out)
    if _is_game(modes):  # every team outcome of a game is 1 (it ended by its rules): rank by exploitability
        ranked = sorted((-m["exploitability"]["last"]["mean"], mode) for mode, m in modes.items())
    else:
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
    (out / "summary.md").write_text(
        _markdown(modes, _ranking_text(ranked, " > " if _is_game(modes) else " < "), files, out),
        encoding="utf-8",
    )
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


def _is_game(modes: Mapping[str, Any]) -> bool:
    """Whether every mode's runs logged a game's exact ``eval/exploitability`` (Kuhn poker): the measure the
    summary ranks and leads with, instead of avg@k / pass@k, which are 1 for every game that ends by its rules."""
    return bool(modes) and all(
        m["exploitability"] and m["exploitability"]["last"]["mean"] is not None for m in modes.values()
    )


def _ranking_text(ranked: Sequence[tuple[float, str]], sep: str = " < ") -> str:
    """``"grpo < agent_mean = drmas"``: modes sorted by mean final avg@k, ``=`` between equal means (a game's:
    by exploitability, worst first, ``sep`` ``" > "``)."""
    text = ""
    for i, (value, mode) in enumerate(ranked):
        if i:
            text += " = " if value == ranked[i - 1][0] else sep
        text += mode
    return text


def _markdown(modes: dict[str, Any], ranking: str, files: Sequence[Path], out: Path) -> str:
    lines = ["# mas-compare: advantage modes", ""]
    lines.append("Mean ± std over seeds (sample std; none with one seed). Gain = last − first eval line.")
    game = _is_game(modes)
    if game:
        lines += [
            "",
            "Exact exploitability (`eval/exploitability`, chips per hand, 0 at an equilibrium; lower is better), "
            "first and last evaluation (avg@k and pass@k, 1 for every game that ends by its rules, are left out):",
            "",
            "| mode | seeds | first | last | change |",
            "|---|---|---|---|---|",
        ]
    else:
        lines += ["", "| mode | seeds | final avg@k | final pass@k | gain avg@k |", "|---|---|---|---|---|"]
    for mode, m in modes.items():
        k = m["k"] if m["k"] is not None else "k"
        seeds = ",".join(map(str, m["seeds"]))
        if game:
            ex = m["exploitability"]
            lines.append(
                f"| {mode} | {seeds} | {_fmt(ex['first'])} | {_fmt(ex['last'])} | {_fmt(ex['change'])} |"
            )
            continue
        lines.append(
            f"| {mode} | {seeds} | {_fmt(m['final_avg'])} (k={k}) | {_fmt(m['final_pass'])} | "
            f"{_fmt(m['gain_avg'], 3)} |"
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
    if not game and any(m["exploitability"] for m in modes.values()):
        lines += [
            "",
            "Exact exploitability (`eval/exploitability`, chips per hand, 0 at an equilibrium; lower is better), "
            "first and last evaluation:",
            "",
            "| mode | first | last | change |",
            "|---|---|---|---|",
        ]
        for mode, m in modes.items():
            if ex := m["exploitability"]:
                lines.append(f"| {mode} | {_fmt(ex['first'])} | {_fmt(ex['last'])} | {_fmt(ex['change'])} |")
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
        "`losses/grad_norm/<agent>` over the (run, step) points with a non-zero norm, pooled over the agents and "
        "per agent (– where either is constant, e.g. an agent whose factor is always 1):",
        "",
        "| mode | agent | ρ | points |",
        "|---|---|---|---|",
    ]
    for mode, m in modes.items():
        rows = [("all (pooled)", m["factor_norm_spearman"]), *m["factor_norm_spearman_by_agent"].items()]
        for a, v in rows:
            rho = v["rho"]
            lines.append(f"| {mode} | {a} | {'–' if rho is None else f'{rho:.2f}'} | {v['points']} |")
    if ranking and game:
        lines += ["", f"Modes by mean final exploitability, highest (worst) first: {ranking}."]
    elif ranking:
        lines += ["", f"Modes by mean final avg@k, lowest first: {ranking}."]
    lines += [""] + [f"![{p.stem}]({p.relative_to(out)})" for p in files] + [""]
    return "\n".join(lines)

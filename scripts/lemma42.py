"""Lemma 4.2 of Dr. MAS, measured: the gradient second-moment factor over a sweep of |mu_k - mu| / sigma.

Usage: python scripts/lemma42.py [--out docs/img/lemma42.png] [--n_traj 200000] [--seed 0]

Prints a markdown table (measured vs predicted factor per agent and shift) and writes the figure. The system
is :func:`mas_train.tools.lemma.sweep_setup` (see docs/lemma42.md for the construction); about 15 s on one core.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mas_train.tools.lemma import measure, predict, sweep_setup

SHIFTS = np.linspace(0.0, 2.4, 9)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/img/lemma42.png", help="PNG path")
    ap.add_argument("--n_traj", type=int, default=200_000, help="trajectories per shift")
    ap.add_argument("--group_size", type=int, default=8, help="G for the per-group (training) variant")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    print(
        "| shift m | agent | abs(mu_k-mu)/sigma | predicted | measured GRPO | Delta_k/E z2 | Dr. MAS | GRPO G=8 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for i, m in enumerate(SHIFTS):
        setup = sweep_setup(float(m))
        pred = predict(setup)
        pooled = measure(setup, args.n_traj, seed=args.seed + i)
        grouped = measure(setup, args.n_traj, seed=args.seed + i, group_size=args.group_size)
        for agent in setup.agents:
            p, q, g = pred[agent], pooled[agent], grouped[agent]
            row = {
                "shift": float(m),
                "agent": agent,
                "dev": p.deviation,
                "pred": p.factor,
                "grpo": q.g2["grpo"] / p.z2,
                "grpo_se": q.g2_se["grpo"] / p.z2,
                "delta": q.delta["grpo"] / p.z2,
                "drmas": q.g2["drmas"] / p.z2,
                "grpo_g": g.g2["grpo"] / p.z2,
            }
            rows.append(row)
            print(
                f"| {m:.2f} | {agent} | {row['dev']:.3f} | {row['pred']:.3f} | {row['grpo']:.3f} ± "
                f"{row['grpo_se']:.3f} | {row['delta']:+.4f} | {row['drmas']:.3f} | {row['grpo_g']:.3f} |"
            )

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.2), constrained_layout=True)
    colors = {"solver": "tab:gray", "verifier": "tab:blue", "checker": "tab:red"}
    x = np.linspace(0, max(r["dev"] for r in rows) * 1.03, 200)
    ax.plot(
        x, 0.25 + x**2, color="tab:red", lw=1.5, label=r"prediction, checker: $\sigma_k^2/\sigma^2 + x^2$"
    )
    for agent in ("verifier", "checker"):
        sel = [r for r in rows if r["agent"] == agent]
        dev = [r["dev"] for r in sel]
        ax.errorbar(
            dev,
            [r["grpo"] for r in sel],
            yerr=[2 * r["grpo_se"] for r in sel],
            fmt="o",
            color=colors[agent],
            ms=6,
            capsize=2,
            label=f"GRPO measured, {agent} (±2 s.e.)",
        )
        if agent == "verifier":
            ax.plot(
                dev, [r["pred"] for r in sel], "x", color=colors[agent], ms=8, label="prediction, verifier"
            )
        ax.plot(
            dev,
            [r["grpo_g"] for r in sel],
            "^",
            mfc="none",
            color=colors[agent],
            ms=7,
            label=f"GRPO measured, {agent}, per-group stats G={args.group_size}",
        )
        ax.plot(dev, [r["drmas"] for r in sel], "s", color=colors[agent], mfc="none", ms=6, alpha=0.8)
    ax.plot([], [], "s", color="k", mfc="none", label="Dr. MAS measured (eq. 6 predicts 1)")
    ax.axhline(1.0, color="k", lw=0.8, ls=":")
    ax.set_xlabel(r"standardised mean deviation $|\mu_k - \mu| / \sigma$")
    ax.set_ylabel(r"$E\|g_k\|^2 \,/\, E\|z_k\|^2$  (inflation factor)")
    ax.set_title("Lemma 4.2: global baseline inflates the agent's gradient second moment")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)

    for agent, c in colors.items():
        sel = [r for r in rows if r["agent"] == agent]
        bx.plot([r["pred"] for r in sel], [r["grpo"] for r in sel], "o", color=c, label=f"{agent}, GRPO")
        bx.plot(
            [1.0] * len(sel), [r["drmas"] for r in sel], "s", mfc="none", color=c, label=f"{agent}, Dr. MAS"
        )
    hi = max(max(r["pred"], r["grpo"]) for r in rows) * 1.05
    t = np.linspace(0, hi, 50)
    bx.plot(t, t, "k-", lw=0.8, label="measured = predicted")
    bx.fill_between(t, 0.9 * t, 1.1 * t, color="k", alpha=0.08, label="±10 %")
    bx.set_xlim(0, hi)
    bx.set_ylim(0, hi)
    bx.set_xlabel(r"predicted factor $(\sigma_k^2 + (\mu_k - \mu)^2)/\sigma^2$  (Dr. MAS: 1)")
    bx.set_ylabel(r"measured $E\|g_k\|^2 / E\|z_k\|^2$")
    bx.set_title(f"Measured vs predicted, {args.n_traj:,} trajectories per point")
    bx.legend(fontsize=8, loc="upper left")
    bx.grid(alpha=0.3)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""What a run prints: the progress bar's text and clock, and the end-of-run summary."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from mas_train.config import ResolvedModelGroup
    from mas_train.run import TrainSummary
    from mas_train.startup import RunPlan

__all__ = ["bar_text", "eval_progress", "off_the_clock", "print_banner", "print_summary"]

# The keys the progress bar shows, when present.
_BAR_KEYS = (("charts/reward", "R"), ("charts/invalid_rate", "inv"))


@contextlib.contextmanager
def off_the_clock(bar):
    """Leave the time spent inside out of ``bar``'s elapsed time and rate (s/step), so a checkpoint save or an
    eval does not make the training steps look slower."""
    t0 = time.time()  # tqdm's own clock
    try:
        yield
    finally:
        if not bar.disable:
            dt = time.time() - t0
            bar.start_t += dt  # the average rate
            bar.last_print_t += dt  # the smoothed rate (per-print increments)


@contextlib.contextmanager
def eval_progress(num_tasks: int, k: int, enabled: bool = True):
    """A tqdm bar over an evaluation's tasks (``k`` episodes each) that closes when done; yields the
    ``progress(done_tasks, total_tasks)`` callback of :func:`mas_train.eval.evaluate` (``None`` when disabled)."""
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    # one update per batch of tasks, seconds apart: print every one
    bar = tqdm(
        total=num_tasks, desc=f"  eval (k={k})", unit="task", leave=False, dynamic_ncols=True, mininterval=0
    )

    def progress(done: int, total: int) -> None:
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        bar.close()


def bar_text(metrics: Mapping[str, float], agents: Sequence[str]) -> str:
    parts = [f"{short}={metrics[k]:.2f}" for k, short in _BAR_KEYS if k in metrics]
    for a in agents:
        v = metrics.get(f"losses/grad_norm/{a}")
        if v is not None:
            parts.append(f"gn[{a}]={v:.3g}")
    return " ".join(parts)


def print_banner(plan: RunPlan, out: TextIO) -> None:
    """The start-up lines of ``mas-train`` for a :class:`~mas_train.startup.RunPlan`: env, agents and run folder,
    each model group's source and what it trains, the budget, the data, resumed changes and warnings."""
    from mas_train.config import LAPTOP_DEFAULTS
    from mas_train.startup import group_source

    cfg, resolved, run_dir = plan.config, plan.resolved, plan.run_dir
    agents = list(resolved.agents)
    print(f"mas-train: env {cfg.env} | agents {', '.join(agents)} | run {run_dir}", file=out)
    for g in resolved.model_groups.values():
        how = "LoRA adapter" if g.lora else "all weights"
        what = (
            f"trains {', '.join(g.agents)} ({how})" if g.trainable else f"samples for {', '.join(g.agents)}"
        )
        print(f"  model group {g.name!r}: {group_source(g)} {what}{_precision_note(g, cfg.device)}", file=out)
    print(
        f"  {cfg.max_steps} steps x {cfg.tasks_per_step} tasks x G={cfg.num_generations}, "
        f"advantage_mode={cfg.advantage_mode}, lr {cfg.learning_rate:g}",
        file=out,
    )
    print(
        f"  tasks: {cfg.train_data or 'the env default'}; eval: {cfg.eval_data or 'the env default'}",
        file=out,
    )
    if cfg.train_data is not None and cfg.train_data == LAPTOP_DEFAULTS.get(cfg.env, {}).get("train_data"):
        print(
            "  (the laptop setting of a plain run: mas_train/config/common.py LAPTOP_DEFAULTS; name tasks, e.g. "
            "--train_data gsm8k-train, or a model for the paper's prompts and data)",
            file=out,
        )
    for k, (old, new) in plan.changes.items():
        print(f"  resumed with {k} changed: {old!r} -> {new!r}", file=out)
    for w in plan.warnings:
        print(f"  warning: {w}", file=out)
    out.flush()


def _precision_note(group: ResolvedModelGroup, device: str) -> str:
    """``"; fp32: CPU has no native bf16 (AVX2); importance-sampling correction off: fp32 HF sampler and fp32
    trainer"``: the dtype the group's local weights compute in and whether its update corrects for the sampler,
    each with why (:mod:`mas_train.precision`); empty for an endpoint (no local weights)."""
    from mas_train.backends import backend_kind
    from mas_train.models import resolve_device
    from mas_train.precision import resolve_precision, tis_rule

    if not backend_kind(group.backend).can_train:
        return ""
    precision = resolve_precision(group.dtype, resolve_device(device), lora=group.lora is not None)
    tis, why = tis_rule(group, precision)
    return f"; {precision.reason}; importance-sampling correction {'on' if tis else 'off'}: {why}"


def _fmt_eval(first: Mapping[str, float], last: Mapping[str, float]) -> str:
    keys = [k for k in last if k.count("/") == 1 and "@" in k] + sorted(
        k for k in last if k.startswith("eval/env/")
    )
    parts = []
    for k in keys:
        name = k[len("eval/") :]
        if k in first and first is not last:
            parts.append(f"{name} {first[k]:.3f} → {last[k]:.3f}")
        else:
            parts.append(f"{name} {last[k]:.3f}")
    return ", ".join(parts)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def print_summary(s: TrainSummary, out: TextIO) -> None:
    last, ev, first = s["last"], s["eval"], s.get("first_eval") or {}
    minutes = f"{s['wall_seconds'] / 60:.1f} min"
    start, end, ran = s.get("start_step", 0), s["steps"], s.get("steps_run", s["steps"])
    if s.get("finished_only") and not ran:
        print(
            f"\nmas-train finished the run at step {end} (its final evaluation and plots) in {minutes}",
            file=out,
        )
    elif start:
        print(
            f"\nmas-train finished {_steps(ran)} (resumed at step {start}, now at step {end}) in {minutes}",
            file=out,
        )
    else:
        print(f"\nmas-train finished {_steps(ran)} in {minutes}", file=out)
    if last:
        print(
            f"  last step: reward {last.get('charts/reward', float('nan')):.3f}, "
            f"invalid rate {last.get('charts/invalid_rate', float('nan')):.3f}",
            file=out,
        )
    if ran:
        stale = s.get("stale_samples", 0)
        proof = ": each was generated by the weights its group's update then trained" if stale == 0 else ""
        print(
            f"  online check: {s.get('samples_checked', 0)} samples checked, {stale} refused as stale{proof}",
            file=out,
        )
    if ev:
        label = "eval (step 0 → end)" if first and first is not ev else "eval"
        print(f"  {label}: {_fmt_eval(first, ev)}", file=out)
    print(f"  run folder:   {s['run_dir']}", file=out)
    if s["metrics_file"]:
        print(f"  metrics:      {s['metrics_file']}", file=out)
    if s["tensorboard_dir"]:
        print(f"  tensorboard:  tensorboard --logdir {s['tensorboard_dir']}", file=out)
    for p in s.get("plots") or []:
        print(f"  plot:         {p}", file=out)
    if s.get("report"):
        print(
            f"  report:       {s['report']}  (open it in a browser; episodes in {s['run_dir']}/rollouts)",
            file=out,
        )
    if s["checkpoint"]:
        print(f"  checkpoint:   {s['checkpoint']}  (continue with --resume {s['run_dir']})", file=out)
    out.flush()

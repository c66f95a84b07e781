"""``mas-report``: one self-contained HTML page per run, and a comparison page over several runs.

``mas-report RUN`` writes ``RUN/report.html`` (``mas-train`` writes it at the end of every run);
``mas-report RUN [RUN ...] --out FILE`` writes each run's page and a comparison page ``FILE``. A page is one file:
CSS, script, data and figures inline (the PNGs of ``mas-plot`` as base64 data URIs), no network, readable from
``file://``. It holds:

* the run's settings and summary (first vs last evaluation, first vs last training step, and each agent's
  diversity: distinct first turns and final answers among a task's G samples, ``diversity/…``);
* the curves (``RUN/plots/*.png``, drawn now when the folder has none);
* an episode browser over ``RUN/rollouts/`` (:mod:`mas_train.episodes`): filter by step, agent, outcome, data
  source or text; each episode a conversation of agent-coloured turns with the env's messages between them and
  each turn's score and advantage;
* the first and the last evaluation side by side on the same tasks (several runs: each run's last evaluation).

Model text is untrusted: the page carries it as JSON in a ``<script type="application/json">`` element with
``<``, ``>`` and ``&`` written as ``\\u`` escapes, and the script puts it into the page with ``textContent``
only, so a completion that holds HTML or ``<script>`` shows as text. The template (jinja2, autoescaping) and the
script are ``mas_train/tools/templates/``.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MAX_TRAIN_STEPS", "build_comparison", "build_run_report", "load_run_data", "main"]

#: Training steps whose episodes a page embeds at most (evenly spaced, first and last kept): bounds the page
#: of a long run. Every evaluation's episodes are embedded.
MAX_TRAIN_STEPS = 200

_TEMPLATES = Path(__file__).with_name("templates")
# The metrics of the summary tables, in this order (then every other eval/ key the run logged).
_TRAIN_KEYS = ("charts/reward", "charts/success_rate", "charts/invalid_rate", "charts/turns")
_SKIP_EVAL = ("eval/seconds",)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a half-written line of a killed run
    return out


def _spread(steps: Sequence[int], limit: int) -> set[int]:
    """At most ``limit`` of ``steps``, evenly spaced, the first and the last kept."""
    steps = sorted(set(steps))
    if len(steps) <= limit:
        return set(steps)
    if limit == 1:
        return {steps[-1]}
    return {steps[round(i * (len(steps) - 1) / (limit - 1))] for i in range(limit)}


def load_run_data(run_dir: str | Path, *, max_train_steps: int = MAX_TRAIN_STEPS) -> dict[str, Any]:
    """What a page shows of one run folder, as JSON-able data.

    Returns:
        ``name``, ``path``, ``config`` (dict) and ``config_text`` (``config.yaml``), ``evals`` (the eval lines of
        ``metrics.jsonl``, in order), ``train_first`` / ``train_last`` (its first and last training lines),
        ``logged_seconds`` (last minus first line time), ``episodes`` (records of ``rollouts/``; train ones of
        at most ``max_train_steps`` steps), ``train_steps_logged`` / ``train_steps_shown`` (step counts).

    Raises:
        FileNotFoundError: ``run_dir`` is not a folder with a ``config.yaml`` (not a mas-train run).
    """
    import yaml

    from mas_train.episodes import read_episodes

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} not found; pass a run folder written by mas-train")
    config_text = cfg_path.read_text(encoding="utf-8")
    metrics = _read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    evals = [r for r in metrics if any(k.startswith("eval/") for k in r)]
    train = [r for r in metrics if "charts/reward" in r]
    episodes = read_episodes(run_dir / "rollouts") if (run_dir / "rollouts").is_dir() else []
    logged = sorted({int(r["step"]) for r in episodes if r.get("kind") == "train"})
    shown = _spread(logged, max_train_steps)
    episodes = [r for r in episodes if r.get("kind") != "train" or int(r["step"]) in shown]
    times = [r["time"] for r in metrics if isinstance(r.get("time"), int | float)]
    return {
        "name": run_dir.name,
        "path": str(run_dir),
        "config": yaml.safe_load(config_text) or {},
        "config_text": config_text,
        "evals": evals,
        "train_first": train[0] if train else {},
        "train_last": train[-1] if train else {},
        "logged_seconds": (max(times) - min(times)) if len(times) > 1 else None,
        "episodes": episodes,
        "train_steps_logged": len(logged),
        "train_steps_shown": len(shown),
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int | float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


def _eval_rows(first: Mapping[str, Any], last: Mapping[str, Any]) -> list[dict[str, str]]:
    """Rows ``metric | first | last | change`` over the eval keys either line has."""
    keys = [k for k in dict.fromkeys([*first, *last]) if k.startswith("eval/") and k not in _SKIP_EVAL]

    head = ("avg@", "pass@", "reward", "invalid_rate", "num_tasks")

    def order(k: str) -> tuple[int, int, str]:
        rest = k[5:]
        if "/" not in rest:
            return (0, next((i for i, h in enumerate(head) if rest.startswith(h)), len(head)), rest)
        return (2, 0, rest) if rest.startswith(("env/", "invalid_rate/")) else (1, 0, rest)

    rows = []
    for k in sorted(keys, key=order):
        a, b = first.get(k), last.get(k)
        change = ""
        if isinstance(a, int | float) and isinstance(b, int | float):
            change = f"{b - a:+.4g}" if b != a else "0"
        rows.append({"metric": k[5:], "first": _fmt(a), "last": _fmt(b), "change": change})
    return rows


def _settings(saved: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The settings table of a run page from its ``config.yaml`` as read (plain YAML data, not a
    :class:`~mas_train.config.TrainConfig`: the page shows runs of older versions too)."""
    groups = saved.get("model_groups") or {}
    models = ", ".join(f"{g}: {v.get('model') or saved.get('model')}" for g, v in groups.items()) or str(
        saved.get("model")
    )
    lora = saved.get("lora")
    rows = [
        (
            "env",
            f"{saved.get('env')} {json.dumps(saved['env_kwargs'])}"
            if saved.get("env_kwargs")
            else str(saved.get("env")),
        ),
        ("model", models),
        ("model sharing", str(saved.get("model_sharing"))),
        ("LoRA", f"r={lora.get('r')}, alpha={lora.get('alpha')}" if isinstance(lora, Mapping) else "off"),
        ("advantage", f"{saved.get('advantage_mode')} (scope {saved.get('advantage_scope')})"),
        (
            "batch",
            f"{saved.get('tasks_per_step')} tasks × G={saved.get('num_generations')} per step, "
            f"max_steps {saved.get('max_steps')}, lr {saved.get('learning_rate')}",
        ),
        ("train data", str(saved.get("train_data") or "the env default")),
        (
            "eval",
            f"{saved.get('eval_data') or 'the env default'}: {saved.get('eval_num_tasks') or 'all'} tasks × "
            f"k={saved.get('eval_k')}, every {saved.get('eval_steps')} steps",
        ),
        ("seed", str(saved.get("seed"))),
    ]
    return rows


def _diversity_rows(first: Mapping[str, Any], last: Mapping[str, Any]) -> list[dict[str, str]]:
    """Rows ``agent | what | first | last`` of the ``diversity/distinct…/<agent>`` keys either line has
    (:func:`mas_train.metrics.diversity_metrics`): distinct first turns, then distinct final answers."""
    kinds = (("distinct", "first turns (completions)"), ("distinct_answers", "final answers (parsed)"))
    agents = [
        k.split("/", 2)[2] for k in dict.fromkeys([*first, *last]) if k.startswith("diversity/distinct/")
    ]
    rows = []
    for a in dict.fromkeys(agents):
        for kind, what in kinds:
            key = f"diversity/{kind}/{a}"
            if key in first or key in last:
                rows.append(
                    {"agent": a, "what": what, "first": _fmt(first.get(key)), "last": _fmt(last.get(key))}
                )
    return rows


def _summary(run: Mapping[str, Any]) -> dict[str, Any]:
    evals = run["evals"]
    first, last = (evals[0], evals[-1]) if evals else ({}, {})
    t0, t1 = run["train_first"], run["train_last"]
    secs = run["logged_seconds"]
    facts = [
        ("steps trained", _fmt(t1.get("step"))),
        ("logged over", f"{secs / 60:.1f} min" if secs is not None else "–"),
        (
            "episodes kept",
            f"{sum(r.get('kind') == 'train' for r in run['episodes'])} training "
            f"({run['train_steps_shown']} of {run['train_steps_logged']} steps shown), "
            f"{sum(r.get('kind') == 'eval' for r in run['episodes'])} evaluation",
        ),
    ]
    train_rows = [
        {"metric": k[7:], "first": _fmt(t0.get(k)), "last": _fmt(t1.get(k))} for k in _TRAIN_KEYS if k in t1
    ]
    return {
        "settings": _settings(run["config"]),
        "facts": facts,
        "eval_steps": (first.get("step"), last.get("step")),
        "eval_rows": _eval_rows(first, last) if evals else [],
        "train_steps": (t0.get("step"), t1.get("step")),
        "train_rows": train_rows,
        "diversity_rows": _diversity_rows(t0, t1),
        "num_generations": run["config"].get("num_generations"),
    }


def _png_uris(paths: Sequence[Path]) -> list[dict[str, str]]:
    return [
        {
            "name": p.stem.replace("_", " "),
            "uri": "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode(),
        }
        for p in paths
    ]


#: mas-plot's figures in reading order (any other PNG of the folder follows, by name).
_FIGURE_ORDER = ("reward", "eval", "invalid_rate", "grad_norm", "env", "lemma_factor", "diversity")


def _figures(run_dirs: Sequence[Path], plots_dir: Path | None) -> list[dict[str, str]]:
    """The PNGs of ``plots_dir`` when it has any, else drawn now (overlaid for several runs)."""

    def order(p: Path) -> tuple[int, str]:
        return (_FIGURE_ORDER.index(p.stem) if p.stem in _FIGURE_ORDER else len(_FIGURE_ORDER), p.name)

    if plots_dir is not None and plots_dir.is_dir() and list(plots_dir.glob("*.png")):
        return _png_uris(sorted(plots_dir.glob("*.png"), key=order))
    if not all((d / "metrics.jsonl").is_file() for d in run_dirs):
        return []
    try:
        from mas_train.tools.plots import plot_runs
    except ImportError:  # matplotlib is in the train extra; a trimmed install gets a page without curves
        return []
    with tempfile.TemporaryDirectory() as tmp:
        return _png_uris(plot_runs(list(run_dirs), tmp))


def _finite(x: Any) -> Any:
    """``x`` with every non-finite float made ``None`` (``JSON.parse`` refuses ``NaN``)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def _script_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` left to end the element."""
    text = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _render(**context: Any) -> str:
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)), autoescape=True)
    assets = {
        "css": Markup((_TEMPLATES / "report.css").read_text(encoding="utf-8")),
        "js": Markup((_TEMPLATES / "report.js").read_text(encoding="utf-8")),
    }
    data = Markup(_script_json(context.pop("data")))
    return env.get_template("report.html.j2").render(**context, **assets, data=data)


def _columns(runs: Sequence[Mapping[str, Any]], single: bool) -> list[dict[str, Any]]:
    """The side-by-side columns: a run's first and last evaluation, or each run's last."""
    cols = []
    for i, run in enumerate(runs):
        steps = sorted({int(r["step"]) for r in run["episodes"] if r.get("kind") == "eval"})
        if not steps:
            continue
        if single:
            picks = [steps[0], steps[-1]] if len(steps) > 1 else [steps[0]]
            for s in picks:
                cols.append(
                    {"run": i, "step": s, "label": f"step {s}" + (" (before training)" if s == 0 else "")}
                )
        else:
            cols.append({"run": i, "step": steps[-1], "label": f"{run['name']} · step {steps[-1]}"})
    return cols


def _page_data(runs: Sequence[Mapping[str, Any]], single: bool) -> dict[str, Any]:
    agents = list(
        dict.fromkeys(
            t["speaker"]
            for run in runs
            for r in run["episodes"]
            for t in r["transcript"]
            if t["speaker"] != "env"
        )
    )
    return {
        "runs": [{"name": run["name"], "episodes": run["episodes"]} for run in runs],
        "agents": agents,
        "columns": _columns(runs, single),
    }


def build_run_report(
    run_dir: str | Path, out: str | Path | None = None, *, max_train_steps: int = MAX_TRAIN_STEPS
) -> Path:
    """Write the page of one run (default ``RUN/report.html``); returns its path.

    Raises:
        FileNotFoundError: not a run folder (no ``config.yaml``).
    """
    run_dir = Path(run_dir)
    run = load_run_data(run_dir, max_train_steps=max_train_steps)
    html = _render(
        title=f"mas-rl run {run['name']}",
        single=True,
        run=run,
        summary=_summary(run),
        figures=_figures([run_dir], run_dir / "plots"),
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        data=_page_data([run], single=True),
    )
    path = Path(out) if out is not None else run_dir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path


def build_comparison(
    run_dirs: Sequence[str | Path], out: str | Path, *, max_train_steps: int = MAX_TRAIN_STEPS
) -> Path:
    """Write the comparison page of ``run_dirs`` to ``out`` (and each run's own page, which it links).

    Raises:
        ValueError: fewer than two runs.
        FileNotFoundError: a folder that is not a run (checked for every folder before anything is written).
    """
    if len(run_dirs) < 2:
        raise ValueError("a comparison needs at least two run folders")
    dirs = [Path(d) for d in run_dirs]
    runs = [load_run_data(d, max_train_steps=max_train_steps) for d in dirs]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for d, run in zip(dirs, runs, strict=True):
        page = build_run_report(d, max_train_steps=max_train_steps)
        s = _summary(run)
        avg = next(
            (r for r in s["eval_rows"] if r["metric"].startswith("avg@") and "/" not in r["metric"]), None
        )
        cfg = run["config"]
        rows.append(
            {
                "name": run["name"],
                "link": os.path.relpath(page, out.parent).replace(os.sep, "/"),
                "mode": cfg.get("advantage_mode"),
                "seed": cfg.get("seed"),
                "steps": _fmt(run["train_last"].get("step")),
                "avg": f"{avg['metric']}: {avg['first']} → {avg['last']}" if avg else "–",
                "reward": _fmt(run["train_last"].get("charts/reward")),
            }
        )
    html = _render(
        title=f"mas-rl comparison of {len(runs)} runs",
        single=False,
        rows=rows,
        figures=_figures(dirs, None),
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        data=_page_data(runs, single=False),
    )
    out.write_text(html, encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mas-report",
        description="Write a self-contained HTML report of mas-train runs (RUN/report.html; several runs: also a "
        "comparison page).",
    )
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run folders written by mas-train")
    ap.add_argument(
        "--out", default=None, help="the page to write (one run: default RUN/report.html; several: required)"
    )
    ap.add_argument(
        "--max_train_steps",
        type=int,
        default=MAX_TRAIN_STEPS,
        help=f"training steps whose episodes a page embeds at most, evenly spaced (default {MAX_TRAIN_STEPS})",
    )
    args = ap.parse_args(argv)
    if len(args.runs) > 1 and args.out is None:
        ap.error("several runs make a comparison page: give --out FILE.html")
    if args.max_train_steps < 1:
        ap.error("--max_train_steps must be >= 1")
    try:
        if len(args.runs) == 1:
            path = build_run_report(args.runs[0], args.out, max_train_steps=args.max_train_steps)
        else:
            path = build_comparison(args.runs, args.out, max_train_steps=args.max_train_steps)
    except (FileNotFoundError, ValueError) as err:
        print(f"mas-report: error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``mas-compare``: the same config under several advantage modes x seeds, and one report over the runs.

Two ways in::

    mas-compare --config run.yaml --modes drmas,grpo --seeds 0,1,2 --out DIR [other mas-train flags]
    mas-compare --runs RUN_DIR [RUN_DIR ...] --out DIR            # report only, from finished runs

Training runs each (mode, seed) in turn, in process, into ``DIR/runs/<mode>__seed<k>`` (``--pool ray``: each run
a Ray task, as many at once as the cluster has room for, ``--run_cpus`` / ``--run_gpus`` each). It is resumable: a run
whose folder holds a complete run at ``max_steps`` (``complete.json``: trained, finally evaluated, plotted) is not
re-run; an unfinished one resumes from its newest checkpoint. An existing run trained with other settings than the
flags give (another learning rate, G, model, data, evaluation...; :func:`config_mismatch`) is refused before any
training starts, since its results would be reported as this comparison's: use a new ``--out``, or ``--force`` to
move it aside and train it again.

The report (``DIR/summary.md``, ``DIR/summary.json``, ``DIR/reward.png``, ``DIR/grad_norm_<agent>.png``,
``DIR/lemma_factor.png``, ``DIR/noise_share.png``, ``DIR/lld.png``, and ``DIR/report.html``: ``mas-report``'s
comparison page, linking each run's ``report.html``) groups runs by ``advantage_mode`` (from each run's ``config.yaml``) and gives, per mode,
mean ± std over seeds (sample std, ``ddof=1``; none with one seed) of:

* the final eval ``avg@k`` and ``pass@k`` (the last eval line) and the gain ``avg@k`` last − first eval line
  (the first one is the step-0 evaluation when the run has one);
* per agent, the median, 95th percentile and max of ``losses/grad_norm/<agent>`` over the steps, and the number
  of *spike steps*: a step whose norm exceeds 3x the median of the norms of the up to 10 steps before it (the
  first step, having none before it, is never a spike);
* per agent, beside the norms, the mean fraction of its samples with zero advantage because the std the mode
  divides by was 0 (``charts/advantage/zero_std_frac/<agent>``: a small norm there can mean "starved", not
  "stable");
* per agent, the mean over steps of the Lemma 4.2 factor ``lemma/factor/<agent>``, of the noise share
  ``lemma/noise_share/<agent>`` and of the mean advantage ``charts/advantage/mean/<agent>``;
* per agent, the LLD probe ``lld/success_logp/<agent>`` at the start and the end (means of the first and last 3
  steps) and its change;
* whether the factor predicts the norms: Spearman's rank correlation between ``lemma/factor/<agent>`` and
  ``losses/grad_norm/<agent>`` over the (run, step, agent) points of the mode where both are logged and the norm
  is non-zero (pooled over seeds and agents; ties get their average rank);
* the modes ranked by mean final ``avg@k`` (the paper's Table 3 order is grpo < agent_mean < agent_std < drmas).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mas_train.tools.compare_report import (
    EVAL_KEY,
    RunSummary,
    build_report,
    count_spikes,
    spearman,
    summarize_run,
)
from mas_train.tools.plots import load_run

if TYPE_CHECKING:
    from mas_train.config import TrainConfig
    from mas_train.run import TrainSummary

__all__ = [
    "RunSummary",
    "build_report",
    "config_mismatch",
    "count_spikes",
    "is_finished",
    "main",
    "run_comparison",
    "spearman",
    "summarize_run",
    "train_one",
]

_RESERVED = ("--advantage_mode", "--seed", "--output_dir", "--run_name", "--resume")


# -- training side ---------------------------------------------------------------------------------------------
def train_one(cfg: TrainConfig) -> TrainSummary:
    """Train one configuration to ``max_steps`` as ``mas-train`` does (:func:`mas_train.run.train` with
    :func:`mas_train.tools.finish.end_of_run`: plots and report included); returns its summary (with
    ``run_dir``)."""
    from mas_train.run import train
    from mas_train.tools.finish import end_of_run

    return train(cfg, progress=False, end_of_run=end_of_run())


#: Settings in which an existing run may differ from the one mas-compare would launch and still be reused: where
#: it runs and how it is logged and checkpointed. ``max_steps`` may also grow (the run resumes to it). Anything
#: else (data, models, optimisation, advantages, evaluation) makes it another experiment.
REUSABLE_DIFFERENCES = frozenset(
    {
        "output_dir",
        "run_name",
        "resume",
        "device",
        "pool",
        "report_to",
        "logging_steps",
        "save_steps",
        "save_total_limit",
        "log_agent_grad_norms",
    }
)


def config_mismatch(run_dir: str | Path, cfg: TrainConfig) -> dict[str, tuple[object, object]]:
    """The settings in which the run saved in ``run_dir`` (its ``config.yaml``) differs from ``cfg``, the run
    mas-compare would launch there, beyond :data:`REUSABLE_DIFFERENCES` and a larger ``max_steps``; ``{}`` when
    it can be reused (or has no ``config.yaml``).

    Returns:
        dotted setting -> (saved value, value now).

    Raises:
        ConfigError: the saved ``config.yaml`` cannot be read.
    """
    from mas_train.config import TrainConfig, config_diff

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    saved = TrainConfig.from_yaml(path)
    diff = config_diff(saved, cfg)
    out = {k: v for k, v in diff.items() if k.split(".", 1)[0] not in REUSABLE_DIFFERENCES}
    if "max_steps" in out and saved.max_steps < cfg.max_steps:
        del out["max_steps"]  # a longer budget: the run resumes from its newest checkpoint
    return out


def is_finished(run_dir: str | Path, max_steps: int, eval_on: bool) -> bool:
    """True when ``run_dir`` is complete at ``max_steps`` or beyond (its ``complete.json``, written after its
    final evaluation and plots); for a run without that file (made before it existed), when it has a checkpoint
    at ``max_steps`` and, if ``eval_on``, an eval line at it."""
    from mas_train.checkpoint import completed_step, list_checkpoints

    run_dir = Path(run_dir)
    done = completed_step(run_dir)
    if done is not None:
        return done >= max_steps
    ckpts = list_checkpoints(run_dir)
    last = re.search(r"(\d+)$", ckpts[-1].name) if ckpts else None  # names are step-<N>
    if last is None or int(last.group(1)) < max_steps:
        return False
    if not eval_on:
        return True
    try:
        m = load_run(run_dir)
    except (FileNotFoundError, ValueError):
        return False
    return any(EVAL_KEY.match(k) and max_steps in m.get(k)[0] for k in m.series)


def _train_argv(argv: Sequence[str]) -> str:
    """Parse ``argv`` and train it to the end (the body of one ``--pool ray`` task); returns the run folder."""
    from mas_train.config import parse_args

    return str(train_one(parse_args(list(argv)))["run_dir"])


def run_comparison(
    train_argv: Sequence[str],
    modes: Sequence[str],
    seeds: Sequence[int],
    out_dir: str | Path,
    *,
    train_fn: Callable[[TrainConfig], Mapping[str, object]] | None = None,
    log: Callable[[str], None] = print,
    pool: str = "local",
    run_cpus: float = 1.0,
    run_gpus: float = 0.0,
    force: bool = False,
) -> tuple[list[Path], list[Path]]:
    """Train every (mode, seed) not finished yet into ``OUT/runs/<mode>__seed<k>``.

    Args:
        train_argv: mas-train flags shared by all runs (e.g. ``["--config", "run.yaml"]``); must not set
            ``--advantage_mode``, ``--seed``, ``--output_dir``, ``--run_name`` or ``--resume``.
        modes, seeds: the grid.
        out_dir: the comparison folder.
        train_fn: trains one ``TrainConfig`` (default :func:`train_one`, looked up at call time); ``pool="local"``
            only.
        pool: ``"local"``: one run after the other in this process. ``"ray"``: every run is a Ray task asking
            for ``run_cpus`` CPUs and ``run_gpus`` GPUs, so Ray runs as many at once as the cluster (a local
            one, or ``RAY_ADDRESS``) has room for; each run's own workers stay in its task (``pool: local``
            inside), and Ray sets the task's ``OMP_NUM_THREADS`` to its CPUs.
        force: an existing run folder whose saved settings differ from the run's (:func:`config_mismatch`) is
            moved aside (``<name>.stale-<time>``) and trained again, instead of refused.

    Returns:
        ``(all run folders, the ones trained by this call)``.

    Raises:
        ConfigError: bad flags (parsed for every run before any training starts), a run that asks for
            ``pool: ray`` itself under ``pool="ray"``, or (without ``force``) an existing run trained with other
            settings than the flags give (checked for every run before any training starts).
        ValueError: an unknown ``pool``, or ``train_fn`` with ``pool="ray"``.
        RuntimeError: ``pool="ray"`` runs that failed (named; the others are finished first).
    """
    from mas_train.config import ConfigError, parse_args

    if pool not in ("local", "ray"):
        raise ValueError(
            f"unknown pool {pool!r}; use 'local' (one run after the other) or 'ray' (concurrent)"
        )
    if pool == "ray" and train_fn is not None:
        raise ValueError("train_fn is for pool='local'; Ray tasks train with mas_train.trainer.train")
    train_fn = train_fn or train_one
    for flag in train_argv:
        if flag.split("=", 1)[0] in _RESERVED:
            raise ConfigError(f"mas-compare sets {flag.split('=', 1)[0]} itself; remove it from the flags")
    runs_root = Path(out_dir) / "runs"
    plan = []
    for mode in modes:
        for seed in seeds:
            name = f"{mode}__seed{seed}"
            argv = [*train_argv, "--advantage_mode", mode, "--seed", str(seed)]
            argv += ["--output_dir", str(runs_root), "--run_name", name]
            cfg = parse_args(argv)
            if pool == "ray" and cfg.pool == "ray":
                raise ConfigError(
                    "mas-compare --pool ray runs each training as one Ray task; set the runs' own pool to "
                    "local (remove pool: ray from their config)"
                )
            plan.append((runs_root / name, cfg, argv))
    for run_dir, cfg, _ in plan:
        diff = config_mismatch(run_dir, cfg) if run_dir.exists() else {}
        if diff and not force:
            shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in list(diff.items())[:4])
            more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
            raise ConfigError(
                f"{run_dir} was trained with other settings than these flags give ({shown}{more}); its results "
                "would be reported as this comparison's. Use a new --out for these settings, or --force to move "
                "the old runs aside and train them again"
            )
    todo = []
    for run_dir, cfg, argv in plan:
        if force and run_dir.exists() and config_mismatch(run_dir, cfg):
            stale = run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
            run_dir.rename(stale)
            log(
                f"mas-compare: {run_dir.name} was trained with other settings; moved to {stale.name} (--force)"
            )
        if is_finished(run_dir, cfg.max_steps, bool(cfg.eval_steps)):
            log(f"mas-compare: {run_dir.name} is finished; not re-run")
            continue
        todo.append((run_dir, cfg, argv))
    if pool == "ray":
        trained = _train_on_ray(
            [(d, _resume_or_fresh(d, a, log)) for d, _, a in todo], run_cpus, run_gpus, log
        )
    else:
        trained = []
        for run_dir, cfg, argv in todo:
            # another mas-compare on this folder may have finished it while this one trained the runs before
            if is_finished(run_dir, cfg.max_steps, bool(cfg.eval_steps)):
                log(f"mas-compare: {run_dir.name} was finished meanwhile (another process); not re-run")
                continue
            argv = _resume_or_fresh(run_dir, argv, log)
            log(f"mas-compare: training {run_dir.name}")
            summary = train_fn(parse_args(argv))
            if Path(str(summary["run_dir"])).resolve() != run_dir.resolve():
                raise RuntimeError(f"train_fn wrote into {summary['run_dir']}, expected {run_dir}")
            trained.append(run_dir)
    return [p[0] for p in plan], trained


def _resume_or_fresh(run_dir: Path, argv: list[str], log: Callable[[str], None]) -> list[str]:
    """``argv`` with ``--resume`` when ``run_dir`` has a checkpoint; a folder without one is moved aside."""
    from mas_train.checkpoint import list_checkpoints

    if list_checkpoints(run_dir):
        log(f"mas-compare: {run_dir.name} resumes from its newest checkpoint")
        return [*argv, "--resume", str(run_dir)]
    if run_dir.exists():
        stale = run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir.rename(stale)
        log(f"mas-compare: {run_dir.name} has no checkpoint; its old folder moved to {stale.name}")
    return argv


def _train_on_ray(
    todo: Sequence[tuple[Path, list[str]]], run_cpus: float, run_gpus: float, log: Callable[[str], None]
) -> list[Path]:
    try:
        import ray
    except ImportError as e:
        raise ImportError("mas-compare --pool ray needs Ray: pip install 'mas-rl[ray]'") from e
    if not todo:
        return []
    owns = not ray.is_initialized()
    if owns:
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=True)
    try:
        task = ray.remote(num_cpus=run_cpus, num_gpus=run_gpus, max_retries=0)(_train_argv)
        refs = {task.remote(argv): run_dir for run_dir, argv in todo}
        log(
            f"mas-compare: {len(refs)} runs as Ray tasks ({run_cpus:g} CPU, {run_gpus:g} GPU each; "
            f"cluster {ray.cluster_resources().get('CPU', 0):g} CPU)"
        )
        trained, failed, pending = [], [], list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            run_dir = refs[done[0]]
            try:
                ray.get(done[0])
            except Exception as err:  # noqa: BLE001 - a failed run is named and the others go on
                failed.append(f"{run_dir.name}: {str(err).strip().splitlines()[-1]}")
                log(f"mas-compare: {run_dir.name} failed")
                continue
            log(f"mas-compare: {run_dir.name} finished")
            trained.append(run_dir)
    finally:
        if owns:
            ray.shutdown()
    if failed:
        raise RuntimeError("mas-compare: runs failed (the others finished): " + "; ".join(failed))
    return trained


def _csv(text: str, name: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{name} must be a comma-separated list, got {text!r}")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mas-compare",
        description="Train one config under several advantage modes x seeds (or take --runs) and write a report.",
        epilog="Flags not listed here go to mas-train (e.g. --config run.yaml --max_steps 20).",
    )
    ap.add_argument("--out", required=True, help="comparison folder (runs/, summary.md, summary.json, PNGs)")
    ap.add_argument("--runs", nargs="+", default=None, metavar="RUN_DIR", help="report from these runs only")
    ap.add_argument(
        "--modes", default="drmas,grpo", help="comma-separated advantage modes (default drmas,grpo)"
    )
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument(
        "--pool",
        choices=("local", "ray"),
        default="local",
        help="local: one run after the other in this process (default); ray: every run a Ray task, as many at "
        "once as the cluster fits (--run_cpus/--run_gpus each); the runs' own workers stay in their task",
    )
    ap.add_argument(
        "--force",
        action="store_true",
        help="an existing run under --out trained with other settings is moved aside and trained again "
        "(without it mas-compare refuses: use a new --out for new settings)",
    )
    ap.add_argument("--run_cpus", type=float, default=None, help="CPUs per run with --pool ray (default 1)")
    ap.add_argument("--run_gpus", type=float, default=None, help="GPUs per run with --pool ray (default 0)")
    args, rest = ap.parse_known_args(argv)
    placed = [f for f, v in (("--run_cpus", args.run_cpus), ("--run_gpus", args.run_gpus)) if v is not None]
    if placed and (args.pool != "ray" or args.runs is not None):
        ap.error(
            f"{'/'.join(placed)} size the Ray task of each training run: add --pool ray (and drop --runs)"
        )
    if any(v is not None and v < 0 for v in (args.run_cpus, args.run_gpus)):
        ap.error("--run_cpus and --run_gpus must be >= 0")
    try:
        if args.runs is not None:
            if args.pool != "local":
                ap.error("--runs builds a report only; --pool places training runs: remove it")
            if rest:
                ap.error(f"--runs builds a report only; unexpected flags {' '.join(rest)}")
            run_dirs = [Path(r) for r in args.runs]
        else:
            from mas_train.config import ADVANTAGE_MODES

            modes = _csv(args.modes, "--modes")
            bad = [m for m in modes if m not in ADVANTAGE_MODES]
            if bad:
                ap.error(f"--modes: unknown {bad}; choose from {list(ADVANTAGE_MODES)}")
            try:
                seeds = [int(s) for s in _csv(args.seeds, "--seeds")]
            except ValueError:
                ap.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
            run_dirs, _ = run_comparison(
                rest,
                modes,
                seeds,
                args.out,
                pool=args.pool,
                run_cpus=1.0 if args.run_cpus is None else args.run_cpus,
                run_gpus=0.0 if args.run_gpus is None else args.run_gpus,
                force=args.force,
            )
        summary = build_report(run_dirs, args.out)
    except (FileNotFoundError, ValueError, RuntimeError, ImportError, argparse.ArgumentTypeError) as err:
        print(f"mas-compare: error: {err}", file=sys.stderr)
        return 2
    for p in summary["files"]:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

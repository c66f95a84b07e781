"""One ``mas-train`` run around the training loop: :func:`train` is the whole command after argument parsing:
start-up checks (:func:`mas_train.startup.prepare`), resume or "already complete", assembly and model loading
(:func:`mas_train.assemble.assemble_trainer`), the loop (:meth:`mas_train.trainer.MultiGroupTrainer.fit`), the
caller's end-of-run work (:class:`EndOfRun`: ``mas-train`` draws the plots and writes the report, both from
:mod:`mas_train.tools`, which this layer does not import), the completion marker, the summary."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypedDict

from tqdm.auto import tqdm

from mas_envs.core import EnvFactory
from mas_train.assemble import assemble_trainer
from mas_train.checkpoint import completed_step, list_checkpoints, load_trainer_state, mark_complete
from mas_train.config import TrainConfig
from mas_train.progress import print_banner, print_summary
from mas_train.startup import RunPlan, evaluation_on, prepare, record_config
from mas_train.tracking import RunLogger, eval_logged_at, first_eval, last_eval

__all__ = ["EndOfRun", "RunInterrupted", "TrainSummary", "train"]


class TrainSummary(TypedDict):
    """What :func:`train` returns (the keys are described there)."""

    run_dir: str
    metrics_file: str | None
    tensorboard_dir: str | None
    checkpoint: str | None
    steps: int
    steps_run: int
    start_step: int
    wall_seconds: float
    last: dict[str, float]
    eval: dict[str, float]
    first_eval: dict[str, float]
    plots: list[str]
    report: str | None
    already_complete: bool
    finished_only: bool
    samples_checked: int
    stale_samples: int


def _no_plots(run_dir: Path, cfg: TrainConfig) -> list[Path]:
    return []


def _no_report(run_dir: Path) -> str | None:
    return None


@dataclass(frozen=True)
class EndOfRun:
    """What a run does once trained and finally evaluated, handed to :func:`train` by its caller.

    Attributes:
        plots: ``plots(run_dir, cfg)`` draws the run's figures; returns their paths (the summary's ``plots``).
            Also run when a resumed run only lacked its plots.
        report: ``report(run_dir)`` writes the run's page; returns its path, or ``None`` (the summary's
            ``report``).

    The default does neither; ``mas-train`` and ``mas-compare`` pass :func:`mas_train.tools.finish.end_of_run`.
    """

    plots: Callable[[Path, TrainConfig], list[Path]] = _no_plots
    report: Callable[[Path], str | None] = _no_report


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`train`, after the run folder was fixed: ``mas-train`` says how to continue it.

    Attributes:
        run_dir: the run folder.
        checkpoint: its newest checkpoint when interrupted (``None``: none saved yet, nothing to resume).
    """

    def __init__(self, run_dir: Path, checkpoint: Path | None) -> None:
        super().__init__(str(run_dir))
        self.run_dir = Path(run_dir)
        self.checkpoint = checkpoint


def train(
    cfg: TrainConfig,
    *,
    progress: bool = True,
    out: TextIO | None = None,
    env_factory: EnvFactory | None = None,
    end_of_run: EndOfRun | None = None,
) -> TrainSummary:
    """Train ``cfg`` (a :class:`~mas_train.config.TrainConfig`) to ``max_steps``: the body of ``mas-train``.

    A run is complete when it has trained to ``max_steps``, run its final evaluation (when evaluation is on) and
    drawn its plots (``end_of_run``'s); it then writes ``complete.json`` (:func:`mas_train.checkpoint.mark_complete`). ``--resume``
    of a run whose last checkpoint is at ``max_steps`` but that is not complete (killed during its final
    evaluation) runs only what is missing: the final evaluation (loading the checkpoint's weights), unless its
    line is already in ``metrics.jsonl``, then the plots.

    Returns:
        A summary: ``run_dir``, ``metrics_file``, ``tensorboard_dir``, ``checkpoint``, ``steps`` (the run's step
        at the end), ``steps_run`` (training steps this call ran), ``start_step`` (the step it resumed at, 0 for
        a new run), ``wall_seconds``, ``last`` (last step's metrics), ``eval`` (last evaluation), ``first_eval``
        (the run's first evaluation, step 0 when ``eval_before_training``), ``plots`` (PNG paths) and ``report``
        (the run's page, ``None``: none written) from ``end_of_run``,
        ``already_complete`` (``True`` when ``--resume`` pointed at a complete run at or past ``max_steps``:
        nothing was run or written), ``finished_only`` (``True`` when only a missing final evaluation / plots
        were done), ``samples_checked`` / ``stale_samples`` (samples of this call's steps whose weight version the
        workers checked before updating, and those refused as stale: 0, as a stale one stops the run).

    Raises:
        ConfigError: invalid settings, found before any model is loaded.
        FileNotFoundError: ``--resume`` target not found.
        RunInterrupted: Ctrl-C (a ``KeyboardInterrupt`` naming the run folder and its newest checkpoint).
    """

    out = out or sys.stdout
    t_start = time.perf_counter()
    plan = prepare(cfg, env_factory=env_factory)
    run_dir = plan.run_dir
    try:
        return _train(plan, end_of_run or EndOfRun(), progress=progress, out=out, t_start=t_start)
    except KeyboardInterrupt:
        ckpts = list_checkpoints(run_dir)
        raise RunInterrupted(run_dir, ckpts[-1] if ckpts else None) from None


def _train(plan: RunPlan, end: EndOfRun, *, progress: bool, out: TextIO, t_start: float) -> TrainSummary:

    cfg, resolved, run_dir, ckpt = plan.config, plan.resolved, plan.run_dir, plan.checkpoint
    summary: TrainSummary = {
        "run_dir": str(run_dir),
        "metrics_file": str(run_dir / "metrics.jsonl") if "jsonl" in cfg.report_to else None,
        "tensorboard_dir": str(run_dir / "tb") if "tensorboard" in cfg.report_to else None,
        "checkpoint": str(ckpt) if ckpt else None,
        "steps": 0,
        "steps_run": 0,
        "start_step": 0,
        "wall_seconds": 0.0,  # set before every return
        "last": {},
        "eval": {},
        "first_eval": {},
        "plots": [],
        "report": None,
        "already_complete": False,
        "finished_only": False,
        "samples_checked": 0,
        "stale_samples": 0,
    }
    finishing = False
    if ckpt is not None:
        step = int(load_trainer_state(ckpt)["step"])
        summary["start_step"] = step
        if step >= cfg.max_steps:
            done = completed_step(run_dir)
            if done is not None and done >= step:
                print(
                    f"mas-train: run {run_dir} is already complete at step {step} (max_steps {cfg.max_steps}); "
                    "raise --max_steps to train further",
                    file=out,
                )
                out.flush()
                summary.update(
                    {"steps": step, "wall_seconds": time.perf_counter() - t_start, "already_complete": True}
                )
                return summary
            finishing = True
            missing = evaluation_on(cfg) and not ("jsonl" in cfg.report_to and eval_logged_at(run_dir, step))
            print(
                f"mas-train: run {run_dir} trained to step {step} but did not finish "
                + ("its final evaluation: running it now" if missing else "(its plots): drawing them now"),
                file=out,
            )
            out.flush()
            if not missing:
                summary.update(
                    {
                        "steps": step,
                        "finished_only": True,
                        "eval": last_eval(run_dir),
                        "first_eval": first_eval(run_dir),
                        "plots": [str(p) for p in end.plots(run_dir, cfg)],
                        "wall_seconds": time.perf_counter() - t_start,
                    }
                )
                mark_complete(run_dir, step)
                print_summary(summary, out)
                return summary

    print_banner(plan, out)

    live_bar = progress and _is_terminal(sys.stderr)

    def say(msg: str) -> None:
        if live_bar:  # tqdm.write clears and redraws the bar around the line, so status lines never break it
            tqdm.write(msg, file=out)
        else:  # a log file: no bar to redraw (each redraw would be one more copy of it in the file)
            print(msg, file=out)
        out.flush()

    t0 = time.perf_counter()
    say("  loading models…")
    trainer = assemble_trainer(
        resolved,
        env_factory=plan.env_factory,
        train_tasks=plan.train_tasks,
        eval_tasks=plan.eval_tasks,
        probe=plan.probe,
    )
    try:
        if ckpt is not None:
            say(f"  loading checkpoint {ckpt.name}…")
            trainer.load_checkpoint(ckpt)
            print(f"  resumed from {ckpt} at step {trainer.step}", file=out)
            trainer.first_eval = first_eval(run_dir)
        start_step = trainer.step
        nxt = (
            f"the final evaluation of step {trainer.step} starts"
            if finishing
            else f"step {trainer.step + 1} starts with the first rollout"
        )
        say(f"  ready in {time.perf_counter() - t0:.1f} s; {nxt}")
        record_config(plan, trainer.step)
        logger = RunLogger(
            run_dir,
            cfg.report_to,
            run_name=resolved.run_name,
            config=cfg.to_dict(),
            resume_step=trainer.step if ckpt is not None else None,
        )
        try:
            summary["last"] = trainer.fit(logger, progress=progress, say=say, live_bar=live_bar)
        finally:
            logger.close()
    finally:
        trainer.close()
    ckpts = list_checkpoints(run_dir)
    summary.update(
        {
            "checkpoint": str(ckpts[-1]) if ckpts else None,
            "steps": trainer.step,
            "steps_run": trainer.step - start_step,
            "start_step": start_step,
            "finished_only": finishing,
            "eval": trainer.last_eval,
            "first_eval": trainer.first_eval,
            "plots": [str(p) for p in end.plots(run_dir, cfg)],
            "report": end.report(run_dir),
            "wall_seconds": time.perf_counter() - t_start,
            "samples_checked": trainer.samples_checked,
            "stale_samples": trainer.stale_samples,
        }
    )
    if trainer.step >= cfg.max_steps:
        mark_complete(run_dir, trainer.step)  # last: everything of the run is on disk
    print_summary(summary, out)
    return summary


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False

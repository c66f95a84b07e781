"""One ``mas-train`` run around the training loop: :func:`train` is the whole command after argument parsing:
start-up checks (:func:`mas_train.startup.prepare`), resume or "already complete", model loading, the loop
(:meth:`mas_train.trainer.MultiGroupTrainer.fit`), the plots, the report, the completion marker, the summary."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mas_train.checkpoint import completed_step, list_checkpoints, load_trainer_state, mark_complete
from mas_train.progress import print_banner, print_summary
from mas_train.startup import evaluation_on, prepare, record_config
from mas_train.tracking import RunLogger, eval_logged_at, first_eval, last_eval
from mas_train.trainer import MultiGroupTrainer

__all__ = ["RunInterrupted", "train"]


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
    cfg, *, progress: bool = True, out=None, env_factory: Callable[[], Any] | None = None
) -> dict[str, Any]:
    """Train ``cfg`` (a :class:`~mas_train.config.TrainConfig`) to ``max_steps``: the body of ``mas-train``.

    A run is complete when it has trained to ``max_steps``, run its final evaluation (when evaluation is on) and
    drawn its plots; it then writes ``complete.json`` (:func:`mas_train.checkpoint.mark_complete`). ``--resume``
    of a run whose last checkpoint is at ``max_steps`` but that is not complete (killed during its final
    evaluation) runs only what is missing: the final evaluation (loading the checkpoint's weights), unless its
    line is already in ``metrics.jsonl``, then the plots.

    Returns:
        A summary: ``run_dir``, ``metrics_file``, ``tensorboard_dir``, ``checkpoint``, ``steps`` (the run's step
        at the end), ``steps_run`` (training steps this call ran), ``start_step`` (the step it resumed at, 0 for
        a new run), ``wall_seconds``, ``last`` (last step's metrics), ``eval`` (last evaluation), ``first_eval``
        (the run's first evaluation, step 0 when ``eval_before_training``), ``plots`` (PNG paths), ``report`` (the run's
        ``report.html``, :mod:`mas_train.tools.report`; ``None`` without jinja2),
        ``already_complete`` (``True`` when ``--resume`` pointed at a complete run at or past ``max_steps``:
        nothing was run or written), ``finished_only`` (``True`` when only a missing final evaluation / plots
        were done).

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
        return _train(plan, progress=progress, out=out, t_start=t_start)
    except KeyboardInterrupt:
        ckpts = list_checkpoints(run_dir)
        raise RunInterrupted(run_dir, ckpts[-1] if ckpts else None) from None


def _train(plan, *, progress: bool, out, t_start: float) -> dict[str, Any]:

    cfg, resolved, run_dir, ckpt = plan.config, plan.resolved, plan.run_dir, plan.checkpoint
    summary: dict[str, Any] = {
        "run_dir": str(run_dir),
        "metrics_file": str(run_dir / "metrics.jsonl") if "jsonl" in cfg.report_to else None,
        "tensorboard_dir": str(run_dir / "tb") if "tensorboard" in cfg.report_to else None,
        "checkpoint": str(ckpt) if ckpt else None,
        **dict.fromkeys(("steps", "steps_run", "start_step"), 0),
        **{"last": {}, "eval": {}, "first_eval": {}, "plots": [], "report": None},
        **dict.fromkeys(("already_complete", "finished_only"), False),
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
                return {
                    **summary,
                    "steps": step,
                    "wall_seconds": time.perf_counter() - t_start,
                    "already_complete": True,
                }
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
                    steps=step,
                    finished_only=True,
                    eval=last_eval(run_dir),
                    first_eval=first_eval(run_dir),
                    plots=[str(p) for p in _plots(run_dir, cfg)],
                    wall_seconds=time.perf_counter() - t_start,
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
    trainer = MultiGroupTrainer(
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
        checkpoint=str(ckpts[-1]) if ckpts else None,
        steps=trainer.step,
        steps_run=trainer.step - start_step,
        start_step=start_step,
        finished_only=finishing,
        eval=trainer.last_eval,
        first_eval=trainer.first_eval,
        plots=[str(p) for p in _plots(run_dir, cfg)],
        report=_report(run_dir),
        wall_seconds=time.perf_counter() - t_start,
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


def _plots(run_dir: Path, cfg: Any) -> list[Path]:
    """Draw the run's plots into ``run_dir/plots`` when its metrics were written as JSONL."""
    if "jsonl" not in cfg.report_to:
        return []
    try:
        from mas_train.tools.plots import plot_run
    except ImportError:  # matplotlib is part of the train extra; a trimmed install just skips the pictures
        return []
    return list(plot_run(run_dir, run_dir / "plots"))


def _report(run_dir: Path) -> str | None:
    """Write ``run_dir/report.html`` (curves, episodes, step 0 vs last evaluation); its path."""
    try:
        from mas_train.tools.report import build_run_report

        return str(build_run_report(run_dir))
    except ImportError:  # jinja2 is part of the train extra; a trimmed install has no page
        return None

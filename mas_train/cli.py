"""Command-line entry points: ``mas-train`` and ``mas-eval``.

``mas-train --env math-2agent`` trains with the embedded CPU defaults (``mas_train.config``): SmolLM2-135M-Instruct
as every agent's model, the bundled GSM8K training set, Dr. MAS advantages. ``mas-train --help`` lists every
setting. ``mas-eval`` scores a checkpoint or any model with avg@k / pass@k per data source.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["eval_main", "run_training", "train_main"]

# The keys the progress bar shows, when present.
_BAR_KEYS = (("charts/reward", "R"), ("charts/invalid_rate", "inv"))


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated.*")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def _make_env(cfg):
    import mas_envs

    return mas_envs.make(cfg.env, **cfg.env_make_kwargs())


def _resume_target(cfg):
    """Resolve ``cfg.resume`` and point the run at the checkpoint's run folder.

    Returns:
        ``(cfg, checkpoint folder or None)``.

    Raises:
        ValueError: the checkpoint was made with settings that change the data order or the groups.
    """
    from mas_train.checkpoint import find_checkpoint
    from mas_train.config import ConfigError, TrainConfig

    if not cfg.resume:
        return cfg, None
    ckpt = find_checkpoint(cfg.resume, cfg.output_dir)
    run_dir = ckpt.parent.parent
    saved_path = ckpt / "config.yaml"
    if saved_path.is_file():
        saved = TrainConfig.from_yaml(saved_path)
        for f in (
            "env",
            "env_kwargs",
            "train_data",
            "seed",
            "num_generations",
            "tasks_per_step",
            "model_sharing",
        ):
            if getattr(saved, f) != getattr(cfg, f):
                raise ConfigError(
                    f"--resume {cfg.resume}: the checkpoint was made with {f}={getattr(saved, f)!r} but this run has "
                    f"{f}={getattr(cfg, f)!r}; pass the same settings to continue the run exactly"
                )
    cfg = dataclasses.replace(cfg, output_dir=str(run_dir.parent), run_name=run_dir.name)
    return cfg, ckpt


def _already_complete(cfg, ckpt: Path, out, t_start: float) -> dict[str, Any] | None:
    """The summary of a run whose checkpoint already reached ``max_steps`` (after printing why nothing is done),
    else ``None``. Checked before any model is loaded or anything is written, so resuming a finished run leaves
    its folder untouched instead of re-running the final eval and appending it to the logs again."""
    from mas_train.checkpoint import load_trainer_state

    step = int(load_trainer_state(ckpt)["step"])
    if step < cfg.max_steps:
        return None
    run_dir = ckpt.parent.parent
    print(
        f"mas-train: run {run_dir} is already complete at step {step} (max_steps {cfg.max_steps}); "
        "raise --max_steps to train further",
        file=out,
    )
    out.flush()
    return {
        "run_dir": str(run_dir),
        "metrics_file": str(run_dir / "metrics.jsonl") if "jsonl" in cfg.report_to else None,
        "tensorboard_dir": str(run_dir / "tb") if "tensorboard" in cfg.report_to else None,
        "checkpoint": str(ckpt),
        "steps": step,
        "wall_seconds": time.perf_counter() - t_start,
        "last": {},
        "eval": {},
        "already_complete": True,
    }


@contextlib.contextmanager
def _off_the_clock(bar):
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


def _save(trainer, say) -> None:
    say(f"  saving checkpoint step-{trainer.step:06d}…")
    trainer.save_checkpoint()


def _evaluate(trainer, say) -> dict[str, float]:
    cfg = trainer.cfg
    n = len(trainer.eval_tasks[: cfg.eval_num_tasks] if cfg.eval_num_tasks else trainer.eval_tasks)
    say(f"  evaluating on {n} tasks × k={cfg.eval_k} at step {trainer.step}…")
    return trainer.evaluate()


def _bar_text(metrics: dict[str, float], agents: Sequence[str]) -> str:
    parts = [f"{short}={metrics[k]:.2f}" for k, short in _BAR_KEYS if k in metrics]
    for a in agents:
        v = metrics.get(f"losses/grad_norm/{a}")
        if v is not None:
            parts.append(f"gn[{a}]={v:.3g}")
    return " ".join(parts)


def run_training(cfg, *, progress: bool = True, out=None) -> dict[str, Any]:
    """Train ``cfg`` (a :class:`~mas_train.config.TrainConfig`) to ``max_steps``; the body of ``mas-train``.

    Returns:
        A summary: ``run_dir``, ``metrics_file``, ``tensorboard_dir``, ``checkpoint``, ``steps``,
        ``wall_seconds``, ``last`` (last step's metrics), ``eval`` (last evaluation), ``already_complete``
        (``True`` when ``--resume`` pointed at a checkpoint at or past ``max_steps``: nothing was run or written).

    Raises:
        ConfigError: invalid settings (before any model is loaded).
        FileNotFoundError: ``--resume`` target not found.
    """
    from tqdm.auto import tqdm

    from mas_train.checkpoint import list_checkpoints
    from mas_train.tracking import RunLogger
    from mas_train.trainer import MultiGroupTrainer

    out = out or sys.stdout
    t_start = time.perf_counter()
    cfg, ckpt = _resume_target(cfg)
    if ckpt is not None:
        done = _already_complete(cfg, ckpt, out, t_start)
        if done is not None:
            return done
    probe = _make_env(cfg)
    agents = list(probe.possible_agents)
    resolved = cfg.resolve(agents)
    run_dir = resolved.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"mas-train: env {cfg.env} | agents {', '.join(agents)} | run {run_dir}", file=out)
    for g in resolved.model_groups.values():
        print(f"  model group {g.name!r}: {g.model} ({g.backend}) trains {', '.join(g.agents)}", file=out)
    print(
        f"  {cfg.max_steps} steps x {cfg.tasks_per_step} tasks x G={cfg.num_generations}, "
        f"advantage_mode={cfg.advantage_mode}",
        file=out,
    )
    out.flush()

    def say(msg: str) -> None:
        # tqdm.write clears and redraws the bar around the line, so status lines never break it.
        tqdm.write(msg, file=out)
        out.flush()

    t0 = time.perf_counter()
    say("  loading models…")
    trainer = MultiGroupTrainer(resolved)
    try:
        if ckpt is not None:
            say(f"  loading checkpoint {ckpt.name}…")
            trainer.load_checkpoint(ckpt)
            print(f"  resumed from {ckpt} at step {trainer.step}", file=out)
        say(
            f"  ready in {time.perf_counter() - t0:.1f} s; step {trainer.step + 1} starts with the first rollout"
        )
        start_step = trainer.step
        metrics_file = run_dir / "metrics.jsonl"
        if ckpt is None:
            cfg.to_yaml(run_dir / "config.yaml")
        logger = RunLogger(
            run_dir,
            cfg.report_to,
            run_name=resolved.run_name,
            config=cfg.to_dict(),
            resume_step=trainer.step if ckpt is not None else None,
        )
        last: dict[str, float] = {}
        saved_at = evaluated_at = -1
        bar = tqdm(
            total=cfg.max_steps,
            initial=trainer.step,
            desc="mas-train",
            unit="step",
            disable=not progress,
            dynamic_ncols=True,
        )
        try:
            while trainer.step < cfg.max_steps:
                last, extra = trainer.train_step()
                if trainer.step % cfg.logging_steps == 0 or trainer.step == cfg.max_steps:
                    logger.log(trainer.step, last, extra)
                bar.set_postfix_str(_bar_text(last, agents), refresh=False)
                bar.update(1)
                if cfg.save_steps and trainer.step % cfg.save_steps == 0:
                    with _off_the_clock(bar):
                        _save(trainer, say)
                    saved_at = trainer.step
                if cfg.eval_steps and trainer.step % cfg.eval_steps == 0:
                    with _off_the_clock(bar):
                        logger.log(trainer.step, _evaluate(trainer, say))
                    evaluated_at = trainer.step
        finally:
            bar.close()
        if trainer.step > start_step and saved_at != trainer.step:
            _save(trainer, say)
        if cfg.eval_steps and evaluated_at != trainer.step:
            logger.log(trainer.step, _evaluate(trainer, say))
        logger.close()
    finally:
        trainer.close()
    ckpts = list_checkpoints(run_dir)
    summary = {
        "run_dir": str(run_dir),
        "metrics_file": str(metrics_file) if "jsonl" in cfg.report_to else None,
        "tensorboard_dir": str(run_dir / "tb") if "tensorboard" in cfg.report_to else None,
        "checkpoint": str(ckpts[-1]) if ckpts else None,
        "steps": trainer.step,
        "wall_seconds": time.perf_counter() - t_start,
        "last": last,
        "eval": trainer.last_eval,
        "already_complete": False,
    }
    _print_summary(summary, out)
    return summary


def _print_summary(s: dict[str, Any], out) -> None:
    last, ev = s["last"], s["eval"]
    print(f"\nmas-train finished {s['steps']} steps in {s['wall_seconds'] / 60:.1f} min", file=out)
    if last:
        print(
            f"  last step: reward {last.get('charts/reward', float('nan')):.3f}, "
            f"invalid rate {last.get('charts/invalid_rate', float('nan')):.3f}",
            file=out,
        )
    if ev:
        shown = ", ".join(f"{k[5:]} {v:.3f}" for k, v in ev.items() if "@" in k)
        print(f"  eval: {shown}", file=out)
    print(f"  run folder:   {s['run_dir']}", file=out)
    if s["metrics_file"]:
        print(f"  metrics:      {s['metrics_file']}", file=out)
    if s["tensorboard_dir"]:
        print(f"  tensorboard:  tensorboard --logdir {s['tensorboard_dir']}", file=out)
    if s["checkpoint"]:
        print(f"  checkpoint:   {s['checkpoint']}  (continue with --resume {s['run_dir']})", file=out)
    out.flush()


def train_main(argv: Sequence[str] | None = None) -> int:
    """``mas-train``: parse flags (and ``--config``), train, print a summary. Returns the exit code."""
    from mas_train.config import ConfigError, parse_args

    try:
        cfg = parse_args(argv)
    except ConfigError as err:
        print(f"mas-train: error: {err}", file=sys.stderr)
        return 2
    _quiet_libraries()
    try:
        run_training(cfg, progress=True)
    except (ConfigError, FileNotFoundError, ImportError) as err:
        print(f"mas-train: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "mas-train: interrupted; continue from the last checkpoint with --resume <run folder>",
            file=sys.stderr,
        )
        return 130
    return 0


# ================================================================================================================
# mas-eval
# ================================================================================================================


def build_eval_parser() -> argparse.ArgumentParser:
    from mas_train import config as C

    p = argparse.ArgumentParser(
        prog="mas-eval",
        description="Evaluate a checkpoint or a model on a benchmark: avg@k and pass@k per data source.",
        epilog=(
            "Examples:\n  mas-eval --checkpoint runs/<run>/checkpoints/step-000020 --data gsm8k-test --k 4\n"
            "  mas-eval --model smollm2-135m-instruct --env math-2agent --data math500 --num_tasks 50"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--checkpoint",
        help="A checkpoint folder (runs/<run>/checkpoints/step-N), a run folder (its newest checkpoint) or 'latest'; "
        "its agents, model groups and trained weights are used.",
    )
    src.add_argument(
        "--model",
        help=f"Model for every agent: builtin alias, local folder or hub id (default: {C.DEFAULT_MODEL}).",
    )
    p.add_argument(
        "--env", default=None, help=f"Environment id (default: the checkpoint's, else {C.DEFAULT_ENV})."
    )
    p.add_argument(
        "--data",
        default=None,
        help="Benchmark: a bundled set name (gsm8k-test, math500, ...) or a .jsonl/.json/.parquet path "
        "(default: the env's evaluation set).",
    )
    p.add_argument("--k", type=int, default=C.DEFAULT_EVAL_K, help="Episodes per task (avg@k, pass@k).")
    p.add_argument(
        "--num_tasks", type=int, default=None, help="Evaluate only the first N tasks (default: all)."
    )
    p.add_argument(
        "--temperature", type=float, default=C.DEFAULT_EVAL_TEMPERATURE, help="Sampling temperature."
    )
    p.add_argument("--top_p", type=float, default=C.DEFAULT_EVAL_TOP_P, help="Nucleus sampling mass.")
    p.add_argument(
        "--max_new_tokens", type=int, default=None, help="Tokens per agent turn (default: the run's)."
    )
    p.add_argument("--tasks_per_batch", type=int, default=8, help="Tasks rolled out together (memory bound).")
    p.add_argument("--seed", type=int, default=0, help="Sampling seed.")
    p.add_argument("--output_dir", default="runs", help="Where 'latest' checkpoints are searched.")
    p.add_argument("--output", default=None, help="Also write the metrics as JSON to this file.")
    return p


def run_eval(ns: argparse.Namespace, out=None) -> dict[str, float]:
    """The body of ``mas-eval``: returns the metrics it printed."""
    from mas_envs.data import load_tasks
    from mas_train.backends import make_backend
    from mas_train.checkpoint import find_checkpoint
    from mas_train.config import TrainConfig
    from mas_train.eval import evaluate
    from mas_train.models import load_model_and_tokenizer
    from mas_train.rollout import RolloutCollector

    out = out or sys.stdout
    if ns.k < 1:
        raise ValueError(f"--k must be >= 1, got {ns.k}")
    if ns.checkpoint:
        ckpt = find_checkpoint(ns.checkpoint, ns.output_dir)
        cfg = TrainConfig.from_yaml(ckpt / "config.yaml")
        groups = [p.name for p in sorted((ckpt / "groups").iterdir()) if p.is_dir()]
        cfg = dataclasses.replace(cfg, env=ns.env or cfg.env, resume=None)
        label = str(ckpt)
    else:
        cfg = TrainConfig(env=ns.env or TrainConfig().env, model=ns.model or TrainConfig().model)
        groups = None
        label = cfg.model
    if ns.max_new_tokens is not None:
        cfg = dataclasses.replace(
            cfg, sampling=dataclasses.replace(cfg.sampling, max_new_tokens=ns.max_new_tokens)
        )
    env = _make_env(cfg)
    resolved = cfg.resolve(list(env.possible_agents))
    if groups is not None and sorted(groups) != sorted(resolved.model_groups):
        raise ValueError(
            f"checkpoint groups {groups} do not match the config's {list(resolved.model_groups)}"
        )
    generators, tokenizers = {}, {}
    device = "cuda" if cfg.device == "auto" and _cuda() else ("cpu" if cfg.device == "auto" else cfg.device)
    for name, g in resolved.model_groups.items():
        path = str(ckpt / "groups" / name / "model") if groups is not None else g.model
        model, tok = load_model_and_tokenizer(path, device=device)
        generators[name] = make_backend(g, model, tok)
        tokenizers[name] = tok
    sampling = {}
    for a, ra in resolved.agents.items():
        sp = ra.sampling_params()
        sampling[a] = dataclasses.replace(sp, temperature=ns.temperature, top_p=ns.top_p)
    collector = RolloutCollector(
        lambda: _make_env(cfg),
        generators,
        tokenizers,
        resolved.agent_to_group,
        sampling,
        max_prompt_length=cfg.max_prompt_length,
        seed=ns.seed,
    )
    if ns.data:
        tasks = load_tasks(ns.data, fields=cfg.data_fields or None)
    else:
        src = cfg.eval_data or getattr(env.unwrapped, "default_eval_tasks", None)
        if src is None:
            from mas_envs.data import BUNDLED

            guess = (getattr(env.unwrapped, "default_tasks", None) or "").replace("-train", "-test")
            src = guess if guess in BUNDLED else None
        if src is None:
            raise ValueError("no evaluation set: pass --data (a bundled set name or a file)")
        tasks = load_tasks(src, fields=cfg.data_fields or None)
    if ns.num_tasks is not None:
        tasks = tasks[: ns.num_tasks]
    print(f"mas-eval: {label} on {len(tasks)} tasks of {ns.data or 'the env eval set'}, k={ns.k}", file=out)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(tasks), desc="mas-eval", unit="task", dynamic_ncols=True)

    def progress(done, total):
        bar.update(done - bar.n)

    try:
        metrics = evaluate(
            collector, tasks, k=ns.k, seed_step=-1, tasks_per_batch=ns.tasks_per_batch, progress=progress
        )
    finally:
        bar.close()
        collector.close()
    for key, v in metrics.items():
        print(f"  {key[5:]:<32} {v:.4f}", file=out)
    if ns.output:
        Path(ns.output).write_text(json.dumps(metrics, indent=1))
        print(f"  written to {ns.output}", file=out)
    return metrics


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def eval_main(argv: Sequence[str] | None = None) -> int:
    """``mas-eval``: evaluate a checkpoint or a model. Returns the exit code."""
    from mas_train.config import ConfigError

    ns = build_eval_parser().parse_args(argv)
    _quiet_libraries()
    try:
        run_eval(ns)
    except (ConfigError, ValueError, FileNotFoundError, ImportError, OSError) as err:
        print(f"mas-eval: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())

"""Command-line entry points: ``mas-train`` and ``mas-eval``. They parse arguments and call the library.

``mas-train --env math-2agent`` trains with the embedded CPU defaults (``mas_train.config``);
``mas-train --help`` lists every setting. The run itself is :func:`mas_train.trainer.train`.
``mas-eval`` scores a checkpoint, a run's initial weights (``--initial``) or any model with avg@k / pass@k per
data source, on the same evaluation path as training (:mod:`mas_train.eval`).

A user mistake (a bad flag, a missing file, an env argument the env does not take, a setting a resumed run
cannot change) ends the command with one ``error:`` line and exit code 2; ``--debug`` shows the traceback too.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["eval_main", "run_eval", "run_training", "train_main"]


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated.*")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean the user asked for something impossible (never a bug in mas-rl)."""
    from mas_envs.registration import UnknownEnvError
    from mas_train.config import ConfigError

    return (ConfigError, UnknownEnvError, FileNotFoundError, ImportError)


def _run(prog: str, argv: list[str], body: Callable[[list[str]], Any]) -> int:
    """Run ``body(argv)``; print a user mistake as one ``prog: error:`` line (exit 2), Ctrl-C as exit 130."""
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        body(argv)
    except _user_errors() as err:
        if debug:
            traceback.print_exc()
        msg = str(err).strip() or type(err).__name__
        print(f"{prog}: error: {msg}", file=sys.stderr)
        if not debug:
            print(f"{prog}: (run with --debug for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if prog == "mas-train":
            print(
                "mas-train: interrupted; continue from the last checkpoint with --resume <run folder>",
                file=sys.stderr,
            )
        return 130
    return 0


# ================================================================================================================
# mas-train
# ================================================================================================================


def run_training(cfg, *, progress: bool = True, out=None) -> dict[str, Any]:
    """Train ``cfg``; the same as :func:`mas_train.trainer.train` (kept as the CLI module's name for it)."""
    from mas_train.trainer import train

    return train(cfg, progress=progress, out=out)


def train_main(argv: Sequence[str] | None = None) -> int:
    """``mas-train``: parse flags (and ``--config``), train, print a summary. Returns the exit code."""

    def body(args: list[str]) -> None:
        from mas_train.config import parse_args

        cfg = parse_args(args)
        _quiet_libraries()
        run_training(cfg, progress=True)

    return _run("mas-train", list(sys.argv[1:] if argv is None else argv), body)


# ================================================================================================================
# mas-eval
# ================================================================================================================


def build_eval_parser() -> argparse.ArgumentParser:
    from mas_train import config as C

    p = argparse.ArgumentParser(
        prog="mas-eval",
        description="Evaluate a checkpoint, a run's initial weights or a model on a benchmark: avg@k and pass@k "
        "per data source, on the same evaluation path (sampling rule and seeds) as training.",
        epilog=(
            "Examples:\n  mas-eval --checkpoint runs/<run>/checkpoints/step-000020 --data gsm8k-test --k 4\n"
            "  mas-eval --checkpoint runs/<run> --initial        # the run's agents and settings, initial weights\n"
            "  mas-eval --model smollm2-135m-instruct --env math-2agent --data math500 --num_tasks 50\n"
            "Add --debug to see the traceback of an error."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--checkpoint",
        help="A checkpoint folder (runs/<run>/checkpoints/step-N), a run folder (its newest checkpoint) or 'latest'; "
        "its agents, model groups, env settings and trained weights are used.",
    )
    src.add_argument(
        "--model",
        help=f"Model for every agent: builtin alias, local folder or hub id (default: {C.DEFAULT_MODEL}).",
    )
    p.add_argument(
        "--initial",
        action="store_true",
        help="With --checkpoint: evaluate the run's configuration with its initial weights (before training).",
    )
    p.add_argument(
        "--env", default=None, help=f"Environment id (default: the checkpoint's, else {C.DEFAULT_ENV})."
    )
    p.add_argument(
        "--data",
        default=None,
        help="Benchmark: a bundled set name (gsm8k-test, math500, ...), a .jsonl/.json/.parquet path or a "
        "procedural spec (default: the run's eval_data, else the env's evaluation set).",
    )
    p.add_argument(
        "--data_fields",
        default=None,
        help="Column renames for a custom file, task field -> column (e.g. question=problem,answer=solution).",
    )
    p.add_argument("--k", type=int, default=C.DEFAULT_EVAL_K, help="Episodes per task (avg@k, pass@k).")
    p.add_argument(
        "--num_tasks", type=int, default=None, help="Evaluate only the first N tasks (default: all)."
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help=f"Sampling temperature (default: the run's eval_sampling, else {C.DEFAULT_EVAL_TEMPERATURE}).",
    )
    p.add_argument(
        "--top_p", type=float, default=None, help="Nucleus sampling mass (default: as temperature)."
    )
    p.add_argument(
        "--max_new_tokens", type=int, default=None, help="Tokens per agent turn (default: the run's)."
    )
    p.add_argument("--tasks_per_batch", type=int, default=8, help="Tasks rolled out together (memory bound).")
    p.add_argument("--seed", type=int, default=None, help="Sampling seed (default: the run's seed, else 0).")
    p.add_argument("--output_dir", default="runs", help="Where 'latest' checkpoints are searched.")
    p.add_argument("--output", default=None, help="Also write the metrics as JSON to this file.")
    return p


def _check_eval_args(ns: argparse.Namespace) -> None:
    from mas_train.config import ConfigError

    for name, minimum in (("k", 1), ("num_tasks", 1), ("tasks_per_batch", 1), ("max_new_tokens", 1)):
        v = getattr(ns, name)
        if v is not None and v < minimum:
            raise ConfigError(f"--{name} must be >= {minimum}, got {v}")
    if ns.initial and not ns.checkpoint:
        raise ConfigError("--initial needs --checkpoint (the run whose initial configuration to evaluate)")


def _eval_config(ns: argparse.Namespace):
    """The run configuration ``mas-eval`` evaluates, and the checkpoint whose weights it loads (or None)."""
    from mas_train.checkpoint import find_checkpoint
    from mas_train.config import ConfigError, TrainConfig, _parse_mapping

    if ns.checkpoint:
        ckpt = find_checkpoint(ns.checkpoint, ns.output_dir)
        if not (ckpt / "config.yaml").is_file():
            raise FileNotFoundError(f"checkpoint {ckpt} has no config.yaml")
        cfg = TrainConfig.from_yaml(ckpt / "config.yaml")
        cfg = dataclasses.replace(cfg, resume=None)
        if ns.env and ns.env != cfg.env:
            cfg = dataclasses.replace(cfg, env=ns.env)
    else:
        ckpt = None
        base = TrainConfig()
        cfg = TrainConfig(env=ns.env or base.env, model=ns.model or base.model)
    if ns.seed is not None:
        cfg = dataclasses.replace(cfg, seed=ns.seed)
    if ns.data_fields:
        cfg = dataclasses.replace(
            cfg,
            data_fields={str(k): str(v) for k, v in _parse_mapping(ns.data_fields, "--data_fields").items()},
        )
    if ns.max_new_tokens is not None:
        cfg = dataclasses.replace(
            cfg, sampling=dataclasses.replace(cfg.sampling, max_new_tokens=ns.max_new_tokens)
        )
        cfg = dataclasses.replace(
            cfg,
            agents={
                a: dataclasses.replace(
                    ac, sampling=dataclasses.replace(ac.sampling, max_new_tokens=ns.max_new_tokens)
                )
                if ac.sampling is not None
                else ac
                for a, ac in cfg.agents.items()
            },
        )
    if ns.data:
        cfg = dataclasses.replace(cfg, eval_data=ns.data)
    if not isinstance(cfg, TrainConfig):  # pragma: no cover - dataclasses.replace keeps the type
        raise ConfigError("internal: not a TrainConfig")
    return cfg, (None if ns.initial else ckpt), ckpt


def run_eval(ns: argparse.Namespace, out=None) -> dict[str, float]:
    """The body of ``mas-eval``: returns the metrics it printed.

    Raises:
        ConfigError: bad arguments or settings (before any model is loaded).
        FileNotFoundError: the checkpoint or data file does not exist.
    """
    from tqdm.auto import tqdm

    from mas_train.eval import eval_sampling, evaluate
    from mas_train.pools import LocalPool
    from mas_train.rollout import RolloutCollector
    from mas_train.startup import _load_tasks, _probe_env, make_env_factory
    from mas_train.tasks import NoEvalTasksError, eval_tasks

    out = out or sys.stdout
    _check_eval_args(ns)
    cfg, weights, ckpt = _eval_config(ns)
    factory = make_env_factory(cfg)
    probe = _probe_env(cfg, factory)
    resolved = cfg.resolve(list(probe.possible_agents))
    if weights is not None:
        saved = sorted(p.name for p in (weights / "groups").iterdir() if p.is_dir())
        if saved != sorted(resolved.model_groups):
            from mas_train.config import ConfigError

            raise ConfigError(
                f"checkpoint groups {saved} do not match the config's {list(resolved.model_groups)}"
            )
    try:
        tasks = _load_tasks(
            f"evaluation data {cfg.eval_data!r}", lambda: eval_tasks(cfg, probe, limit=ns.num_tasks)
        )
    except NoEvalTasksError as err:
        from mas_train.config import ConfigError

        raise ConfigError(f"{err} (mas-eval: pass --data)") from None
    label = str(ckpt) + (" (initial weights)" if ns.initial else "") if ckpt is not None else cfg.model
    print(
        f"mas-eval: {label} on {len(tasks)} tasks of {cfg.eval_data or 'the env eval set'}, k={ns.k}",
        file=out,
    )
    _quiet_libraries()
    pool = LocalPool(resolved, train=False).start()
    try:
        if weights is not None:
            for g in resolved.model_groups:
                pool.worker(g).load_weights(str(weights / "groups" / g))
        collector = RolloutCollector(
            factory,
            {g: pool.worker(g) for g in resolved.model_groups},
            {g: pool.tokenizer(g) for g in resolved.model_groups},
            resolved.agent_to_group,
            {a: ra.sampling_params() for a, ra in resolved.agents.items()},
            max_prompt_length=cfg.max_prompt_length,
            seed=cfg.seed,
        )
        bar = tqdm(total=len(tasks), desc="mas-eval", unit="task", dynamic_ncols=True)
        try:
            metrics = evaluate(
                collector,
                tasks,
                k=ns.k,
                sampling=eval_sampling(resolved, temperature=ns.temperature, top_p=ns.top_p),
                tasks_per_batch=ns.tasks_per_batch,
                progress=lambda done, total: bar.update(done - bar.n),
            )
        finally:
            bar.close()
            collector.close()
    finally:
        pool.shutdown()
    for key, v in metrics.items():
        print(f"  {key[5:]:<32} {v:.4f}", file=out)
    if ns.output:
        Path(ns.output).write_text(json.dumps(metrics, indent=1))
        print(f"  written to {ns.output}", file=out)
    return metrics


def eval_main(argv: Sequence[str] | None = None) -> int:
    """``mas-eval``: evaluate a checkpoint or a model. Returns the exit code."""

    def body(args: list[str]) -> None:
        run_eval(build_eval_parser().parse_args(args))

    return _run("mas-eval", list(sys.argv[1:] if argv is None else argv), body)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())

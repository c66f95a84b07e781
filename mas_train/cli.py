"""Command-line entry points: ``mas-train`` and ``mas-eval``. They parse arguments and call the library.

``mas-train --env math-2agent`` trains with the embedded CPU defaults (``mas_train.config``);
``mas-train --help`` lists every setting. The run itself is :func:`mas_train.trainer.train`.
``mas-eval`` scores a checkpoint, a run's initial weights (``--initial``) or any model with avg@k / pass@k per
data source, on the same evaluation path as training (:mod:`mas_train.eval`); ``--model_groups.<group>.*`` /
``--agents.<agent>.model`` give single groups another source over the run's (e.g. the verifier on an
OpenAI-compatible endpoint while the solver samples with its trained weights: ``EvalConfig.apply_sources``).

A user mistake (a bad flag, a missing file, an env argument the env does not take, a setting a resumed run
cannot change) ends the command with one ``error:`` line and exit code 2; ``--debug`` shows the traceback too.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

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
    try:  # "Generating train split" bars of every data file read
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
    except ImportError:
        pass


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean the user asked for something impossible (never a bug in mas-rl)."""
    from mas_envs.registration import UnknownEnvError
    from mas_train.checkpoint import UnsafeCheckpointError
    from mas_train.config import ConfigError

    return (ConfigError, UnknownEnvError, FileNotFoundError, ImportError, UnsafeCheckpointError)


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

        _quiet_libraries()
        run_training(parse_args(args), progress=True)

    return _run("mas-train", list(sys.argv[1:] if argv is None else argv), body)


# ================================================================================================================
# mas-eval
# ================================================================================================================


def _eval_config(ev):
    """The run configuration ``mas-eval`` evaluates (a :class:`~mas_train.config.TrainConfig`), the checkpoint
    whose weights it loads (``None``: initial weights) and the checkpoint named (for the label)."""
    from mas_train.checkpoint import find_checkpoint
    from mas_train.config import TrainConfig

    if ev.checkpoint:
        ckpt = find_checkpoint(ev.checkpoint, ev.output_dir)
        if not (ckpt / "config.yaml").is_file():
            raise FileNotFoundError(f"checkpoint {ckpt} has no config.yaml")
        cfg = dataclasses.replace(TrainConfig.from_yaml(ckpt / "config.yaml"), resume=None)
    else:
        ckpt = None
        cfg = TrainConfig(model=ev.model or TrainConfig().model)
    changes: dict[str, Any] = {}
    if ev.env:
        changes["env"] = ev.env
    if ev.env_kwargs:
        changes["env_kwargs"] = {**cfg.env_kwargs, **ev.env_kwargs}
    if ev.seed is not None:
        changes["seed"] = ev.seed
    if ev.data_fields:
        changes["data_fields"] = dict(ev.data_fields)
    if ev.data:
        changes["eval_data"] = ev.data
    cfg = dataclasses.replace(cfg, **changes) if changes else cfg
    return cfg, (None if ev.initial else ckpt), ckpt


def _source(group, fresh: bool, weights) -> str:
    """Where a model group's turns come from in this evaluation, for the start-up lines."""
    opts = group.backend_options
    if group.backend == "openai":
        return f"openai endpoint {opts.base_url} (model {opts.model})"
    if group.backend in ("sglang_http", "vllm_http") and opts.url:
        return f"{group.backend.split('_')[0]} server {opts.url}"
    if fresh or weights is None:
        return f"{group.model} (its own weights, backend {group.backend})"
    return f"the checkpoint's weights (backend {group.backend})"


def _check_api_keys(resolved) -> None:
    """An ``openai`` group whose API key variable is unset is a user mistake: say so before any model loads."""
    from mas_train.config import ConfigError

    for g, rg in resolved.model_groups.items():
        env_var = getattr(rg.backend_options, "api_key_env", None) if rg.backend == "openai" else None
        if env_var and not os.environ.get(env_var):
            raise ConfigError(
                f"model_groups.{g}: environment variable {env_var!r} (backend_options.api_key_env) is unset or "
                f"empty; export the API key there, or pass --model_groups.{g}.backend_options.api_key_env null "
                "for a server without authentication"
            )


def run_eval(ev, out=None) -> dict[str, float]:
    """The body of ``mas-eval`` for an :class:`~mas_train.config.EvalConfig`: returns the metrics it printed.

    Raises:
        ConfigError: bad arguments or settings, an override that cannot be honoured (a model group the run does
            not have, an unset API key variable of an ``openai`` group), all before any model is loaded.
        FileNotFoundError: the checkpoint or data file does not exist.
    """
    from tqdm.auto import tqdm

    from mas_train.eval import eval_sampling, evaluate
    from mas_train.pools import LocalPool
    from mas_train.rollout import RolloutCollector
    from mas_train.startup import load_task_rows, make_env_factory, probe_env
    from mas_train.tasks import NoEvalTasksError, eval_tasks

    out = out or sys.stdout
    cfg, weights, ckpt = _eval_config(ev)
    factory = make_env_factory(cfg)
    probe = probe_env(cfg, factory)
    cfg, resolved, fresh = ev.apply_sources(cfg, list(probe.possible_agents))
    _check_api_keys(resolved)
    if weights is not None:
        saved = sorted(p.name for p in (weights / "groups").iterdir() if p.is_dir())
        if saved != sorted(resolved.model_groups):
            from mas_train.config import ConfigError

            raise ConfigError(
                f"checkpoint groups {saved} do not match the config's {list(resolved.model_groups)}"
            )
    try:
        tasks = load_task_rows(
            f"evaluation data {cfg.eval_data!r}", lambda: eval_tasks(cfg, probe, limit=ev.num_tasks)
        )
    except NoEvalTasksError as err:
        from mas_train.config import ConfigError

        raise ConfigError(f"{err} (mas-eval: pass --data)") from None
    label = str(ckpt) + (" (initial weights)" if ev.initial else "") if ckpt is not None else cfg.model
    print(
        f"mas-eval: {label} on {len(tasks)} tasks of {cfg.eval_data or 'the env eval set'}, k={ev.k}",
        file=out,
    )
    if ev.model_groups or ev.agents:
        for g, rg in resolved.model_groups.items():
            print(f"  {g} ({', '.join(rg.agents)}): {_source(rg, g in fresh, weights)}", file=out)
    _quiet_libraries()
    pool = LocalPool(resolved, train=False).start()
    try:
        if weights is not None:
            for g in resolved.model_groups:
                # a group the overrides gave a source (a model, an endpoint) samples from that, not the checkpoint
                if g not in fresh:
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
                k=ev.k,
                sampling=eval_sampling(
                    resolved, temperature=ev.temperature, top_p=ev.top_p, max_new_tokens=ev.max_new_tokens
                ),
                tasks_per_batch=ev.tasks_per_batch,
                progress=lambda done, total: bar.update(done - bar.n),
            )
        finally:
            bar.close()
            collector.close()
    finally:
        pool.shutdown()
    for key, v in metrics.items():
        print(f"  {key[5:]:<32} {v:.4f}", file=out)
    if ev.output:
        Path(ev.output).write_text(json.dumps(metrics, indent=1))
        print(f"  written to {ev.output}", file=out)
    return metrics


def eval_main(argv: Sequence[str] | None = None) -> int:
    """``mas-eval``: evaluate a checkpoint or a model. Returns the exit code."""

    def body(args: list[str]) -> None:
        from mas_train.config import parse_eval_args

        _quiet_libraries()
        run_eval(parse_eval_args(args))

    return _run("mas-eval", list(sys.argv[1:] if argv is None else argv), body)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())

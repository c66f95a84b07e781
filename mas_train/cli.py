"""Command-line entry points: ``mas-train`` and ``mas-eval``. They parse arguments and call the library.

``mas-train --env math-2agent`` trains with the embedded CPU defaults (``mas_train.config``);
``mas-train --help`` lists every setting. The run itself is :func:`mas_train.run.train`.
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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from mas_train.command import quiet_libraries, run_command

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from mas_envs.core import ExactEvaluation
    from mas_train.config import EvalConfig, ResolvedModelGroup, TrainConfig
    from mas_train.episodes import EvalRecorder
    from mas_train.run import TrainSummary

__all__ = ["eval_main", "run_eval", "run_training", "train_main"]


# ================================================================================================================
# mas-train
# ================================================================================================================


def run_training(cfg: TrainConfig, *, progress: bool = True, out: TextIO | None = None) -> TrainSummary:
    """Train ``cfg`` as ``mas-train`` does: :func:`mas_train.run.train` with the plots and the report at the end
    (:func:`mas_train.tools.finish.end_of_run`)."""
    from mas_train.run import train
    from mas_train.tools.finish import end_of_run

    return train(cfg, progress=progress, out=out, end_of_run=end_of_run())


def train_main(argv: Sequence[str] | None = None) -> int:
    """``mas-train``: parse flags (and ``--config``), train, print a summary. Returns the exit code."""

    def body(args: list[str]) -> None:
        from mas_train.config import parse_args

        quiet_libraries()
        run_training(parse_args(args), progress=True)

    return run_command("mas-train", list(sys.argv[1:] if argv is None else argv), body)


# ================================================================================================================
# mas-eval
# ================================================================================================================


def _eval_config(ev: EvalConfig) -> tuple[TrainConfig, Path | None, Path | None]:
    """The run configuration ``mas-eval`` evaluates (a :class:`~mas_train.config.TrainConfig`), the checkpoint
    whose weights it loads (``None``: initial weights) and the checkpoint named (for the label)."""
    from mas_train.checkpoint import find_checkpoint
    from mas_train.config import TrainConfig

    if ev.checkpoint:
        ckpt = find_checkpoint(ev.checkpoint, ev.output_dir, flag="--checkpoint")
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


def _source(group: ResolvedModelGroup, fresh: bool, weights: Path | None) -> str:
    """Where a model group's turns come from in this evaluation, for the start-up lines."""
    from mas_train.backends.options import OpenAIOptions, SGLangHTTPOptions, VLLMHTTPOptions
    from mas_train.startup import group_source

    opts = group.backend_options
    if isinstance(opts, OpenAIOptions) or (
        isinstance(opts, SGLangHTTPOptions | VLLMHTTPOptions) and opts.url
    ):
        return group_source(group)  # an endpoint or a server: no local weights
    if fresh or weights is None:
        return f"{group.model} (its own weights, backend {group.backend})"
    return f"the checkpoint's weights (backend {group.backend})"


def run_eval(ev: EvalConfig, out: TextIO | None = None) -> dict[str, float]:
    """The body of ``mas-eval`` for an :class:`~mas_train.config.EvalConfig`: returns the metrics it printed.

    Raises:
        ConfigError: bad arguments or settings, an override that cannot be honoured (a model group the run does
            not have, an unset API key variable of an ``openai`` group), all before any model is loaded.
        FileNotFoundError: the checkpoint or data file does not exist.
    """
    from tqdm.auto import tqdm

    from mas_train.assemble import assemble
    from mas_train.eval import eval_sampling, evaluate
    from mas_train.startup import check_api_keys, check_models, load_task_rows, make_env_factory, probe_env
    from mas_train.tasks import NoEvalTasksError, eval_tasks

    out = out or sys.stdout
    cfg, weights, ckpt = _eval_config(ev)
    factory = make_env_factory(cfg)
    probe = probe_env(cfg, factory)
    cfg, resolved, fresh = ev.apply_sources(cfg, list(probe.possible_agents))
    check_api_keys(resolved)
    check_models(resolved)
    if weights is not None:
        saved = sorted(p.name for p in (weights / "groups").iterdir() if p.is_dir())
        if saved != sorted(resolved.model_groups):
            from mas_train.config import ConfigError

            raise ConfigError(
                f"checkpoint groups {saved} do not match the config's {list(resolved.model_groups)}"
            )
    k, num_tasks = ev.evaluation_size(cfg)
    try:
        tasks = load_task_rows(
            f"evaluation data {cfg.eval_data!r}", lambda: eval_tasks(cfg, probe, limit=num_tasks)
        )
    except NoEvalTasksError as err:
        from mas_train.config import ConfigError

        raise ConfigError(f"{err} (mas-eval: pass --data)") from None
    label = str(ckpt) + (" (initial weights)" if ev.initial else "") if ckpt is not None else cfg.model
    print(
        f"mas-eval: {label} on {len(tasks)} tasks of {cfg.eval_data or 'the env eval set'}, k={k}",
        file=out,
    )
    if ev.model_groups or ev.agents:
        for g, rg in resolved.model_groups.items():
            print(f"  {g} ({', '.join(rg.agents)}): {_source(rg, g in fresh, weights)}", file=out)
    quiet_libraries()
    parts = assemble(resolved, env_factory=factory, probe=probe, eval_tasks=tasks, train=False)
    try:
        if weights is not None:
            for g in resolved.model_groups:
                # a group the overrides gave a source (a model, an endpoint) samples from that, not the checkpoint
                if g not in fresh:
                    parts.pool.worker(g).load_weights(str(weights / "groups" / g))
        recorder = _eval_recorder(ev, k, ckpt, probe)
        exact: list[ExactEvaluation] = []  # the env's exact evaluation, when it has one
        bar = tqdm(total=len(tasks), desc="mas-eval", unit="task", dynamic_ncols=True)
        try:
            metrics = evaluate(
                parts.collector,
                parts.eval_tasks(),
                k=k,
                sampling=eval_sampling(
                    resolved, temperature=ev.temperature, top_p=ev.top_p, max_new_tokens=ev.max_new_tokens
                ),
                tasks_per_batch=ev.tasks_per_batch or cfg.eval_tasks_per_batch,
                progress=lambda done, total: bar.update(done - bar.n),
                on_batch=recorder.add if recorder else None,
                on_exact=exact.append,
                opponents=cfg.eval_opponents,
            )
        finally:
            bar.close()
    finally:
        parts.close()
    for key, v in metrics.items():
        print(f"  {key[5:]:<32} {v:.4f}", file=out)
    for found in exact:
        if found.table:
            print("\n".join("  " + line for line in found.table.splitlines()), file=out)
    if ev.output:
        Path(ev.output).write_text(json.dumps(metrics, indent=1))
        print(f"  written to {ev.output}", file=out)
        for found in exact:
            from mas_train.eval import write_artifacts

            p = Path(ev.output)  # eval.json -> eval.kuhn_policy.json, as eval.episodes.jsonl
            stem = p.stem if p.suffix else p.name
            for name, path in write_artifacts(found, p.parent, prefix=stem + ".").items():
                print(f"  {name} written to {path}", file=out)
        if recorder is not None:
            from mas_train.episodes import write_records

            path = write_records(_episodes_path(ev.output), recorder.records)
            print(f"  {len(recorder.records)} episodes written to {path}", file=out)
    return metrics


def _episodes_path(output: str) -> Path:
    """``eval.json`` -> ``eval.episodes.jsonl``: where ``mas-eval --output`` puts the episodes."""
    p = Path(output)
    return p.with_name((p.stem if p.suffix else p.name) + ".episodes.jsonl")


def _eval_recorder(
    ev: EvalConfig, k: int, ckpt: Path | None, probe: AECEnv[str, str, str]
) -> EvalRecorder | None:
    """The :class:`~mas_train.episodes.EvalRecorder` of ``mas-eval --output`` (``None``: no episodes to write);
    its records carry the checkpoint's step (0 for initial weights or a plain model)."""
    import re

    from mas_train.episodes import EvalRecorder

    if not ev.output or ev.log_episodes == 0:
        return None
    found = re.search(r"(\d+)$", ckpt.name) if ckpt is not None and not ev.initial else None
    from mas_envs.core import text_env

    return EvalRecorder(
        k,
        float(text_env(probe).invalid_action_penalty),
        limit=ev.log_episodes,
        step=int(found.group(1)) if found else 0,
    )


def eval_main(argv: Sequence[str] | None = None) -> int:
    """``mas-eval``: evaluate a checkpoint or a model. Returns the exit code."""

    def body(args: list[str]) -> None:
        from mas_train.config import parse_eval_args

        quiet_libraries()
        run_eval(parse_eval_args(args))

    return run_command("mas-eval", list(sys.argv[1:] if argv is None else argv), body)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())

"""``mas-eval`` settings: :class:`EvalConfig`, parsed by :func:`parse_eval_args` with the same machinery as
``mas-train`` (OmegaConf over the dataclass; flags from the fields' help)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mas_train.config.common import DEFAULT_EVAL_K, DEFAULT_EVAL_TASKS_PER_BATCH, ConfigError, check_min
from mas_train.config.common import help_field as _help
from mas_train.config.omega import build, build_argparser, cli_overrides, overrides_tree

__all__ = ["EvalConfig", "parse_eval_args"]


@dataclass
class EvalConfig:
    """One evaluation: a checkpoint (or a model) on a benchmark, reporting avg@k and pass@k per data source.

    Sampling settings left ``None`` come from the evaluated run's ``eval_sampling`` (the same rule the trainer's
    evaluation uses); without a checkpoint, from the defaults of a run.
    """

    checkpoint: str | None = _help(
        "A checkpoint folder (runs/<run>/checkpoints/step-N), a run folder (its newest checkpoint) or 'latest'; its "
        "agents, model groups and trained weights are used.",
        default=None,
    )
    initial: bool = _help(
        "With --checkpoint: evaluate the run's config with its initial weights (the models it started from).",
        default=False,
    )
    model: str | None = _help(
        "Model for every agent: builtin alias, local folder or hub id (instead of --checkpoint). None = the "
        "default model of a run.",
        default=None,
    )
    env: str | None = _help("Environment id. None = the checkpoint's, else the default env.", default=None)
    env_kwargs: dict[str, Any] = _help(
        "Extra keyword arguments for mas_envs.make, over the checkpoint's (e.g. max_loops=3).",
        default_factory=dict,
    )
    data: str | None = _help(
        "Benchmark: a bundled set name (gsm8k-test, math500, ...), a .jsonl/.json/.parquet path or a procedural "
        "spec. None = the run's eval_data, else the env's evaluation set.",
        default=None,
    )
    k: int = _help("Episodes per task (avg@k, pass@k).", default=DEFAULT_EVAL_K)
    num_tasks: int | None = _help("Evaluate only the first N tasks (N >= 1). None = all.", default=None)
    temperature: float | None = _help("Sampling temperature. None = the run's eval_sampling.", default=None)
    top_p: float | None = _help(
        "Nucleus sampling mass in (0, 1]. None = the run's eval_sampling.", default=None
    )
    max_new_tokens: int | None = _help(
        "Tokens per agent turn. None = the run's eval_sampling (each agent's own by default).", default=None
    )
    tasks_per_batch: int = _help(
        "Tasks rolled out together (bounds memory).", default=DEFAULT_EVAL_TASKS_PER_BATCH
    )
    data_fields: dict[str, str] = _help(
        "Column renames for a custom data file, task field -> column (e.g. question=problem,answer=solution).",
        default_factory=dict,
    )
    seed: int | None = _help("Sampling seed. None = the checkpoint's run seed, else 0.", default=None)
    output_dir: str = _help("Where 'latest' checkpoints are searched.", default="runs")
    output: str | None = _help("Also write the metrics as JSON to this file.", default=None)

    def __post_init__(self) -> None:
        if self.checkpoint is not None and self.model is not None:
            raise ConfigError("give --checkpoint or --model, not both")
        if self.initial and self.checkpoint is None:
            raise ConfigError(
                "--initial evaluates a checkpoint's run with its initial weights: give --checkpoint"
            )
        check_min("k", self.k, 1)
        check_min("num_tasks", self.num_tasks, 1, none_ok=True)
        check_min("tasks_per_batch", self.tasks_per_batch, 1)
        check_min("max_new_tokens", self.max_new_tokens, 1, none_ok=True)
        if self.temperature is not None and self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")


def build_eval_parser(prog: str = "mas-eval") -> Any:
    """The argparse parser behind :func:`parse_eval_args` (``--help``); its errors raise :class:`ConfigError`."""
    return build_argparser(
        EvalConfig,
        prog,
        "Evaluate a checkpoint or a model on a benchmark: avg@k and pass@k per data source.",
        "Examples:\n  mas-eval --checkpoint runs/<run>/checkpoints/step-000020 --data gsm8k-test --k 4\n"
        "  mas-eval --checkpoint runs/<run> --initial     # the run's agents and settings, initial weights\n"
        "  mas-eval --model smollm2-135m-instruct --env math-2agent --data math500 --num_tasks 50\n"
        "Mapping flags: --env_kwargs max_loops=3 or --env_kwargs.max_loops 3. --debug shows an error's traceback.",
    )


def parse_eval_args(argv: Sequence[str] | None = None, prog: str = "mas-eval") -> EvalConfig:
    """Parse ``mas-eval`` flags into an :class:`EvalConfig`.

    Raises:
        ConfigError: unknown flags (with close matches), bad values (e.g. ``--num_tasks -1``,
            ``--tasks_per_batch 0``), ``--checkpoint`` with ``--model``.
        SystemExit: for ``--help``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _, pairs = cli_overrides(EvalConfig, build_eval_parser(prog), argv)
    return build(EvalConfig, [overrides_tree(pairs)])

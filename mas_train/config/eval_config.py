"""``mas-eval`` settings: :class:`EvalConfig`, parsed by :func:`parse_eval_args` with the same machinery as
``mas-train`` (OmegaConf over the dataclass; flags from the fields' help; ``--config eval.yaml`` under flags).

``model_groups`` and ``agents`` take the subset of ``mas-train``'s per-group / per-agent settings that says where
an agent's turns come from in an evaluation (:class:`EvalGroupConfig`, :class:`EvalAgentConfig`); ``mas-eval``
merges them over the evaluated run's config. Optimisation settings have no meaning here and are refused as
unknown settings.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mas_train.config.common import (
    BACKENDS,
    DTYPES,
    GROUP_NAME_RE,
    ConfigError,
    check_choice,
    check_min,
    close_matches,
)
from mas_train.config.common import help_field as _help
from mas_train.config.omega import ArgParser, build, build_argparser, cli_overrides, load_yaml, overrides_tree

if TYPE_CHECKING:
    from mas_train.config.resolve import ResolvedConfig
    from mas_train.config.train import TrainConfig

__all__ = ["EvalAgentConfig", "EvalConfig", "EvalGroupConfig", "build_eval_parser", "parse_eval_args"]


@dataclass
class EvalGroupConfig:
    """Where one model group of the evaluated run samples from (``mas-eval --model_groups.<group>.<setting>``).

    The names and meanings are ``mas-train``'s :class:`~mas_train.config.ModelGroupConfig` fields of the same
    name. A group given a ``model``, or a ``backend`` that only samples (``openai``), takes no trained weights
    from the checkpoint: it samples with that model's own weights, or the endpoint's model; the other groups
    load theirs. Fields left ``None`` (empty) keep the run's value.
    """

    model: str | None = _help(
        "Evaluate this group with this model's own weights instead of the checkpoint's (builtin alias, local "
        "folder or hub id); with a sampling-only backend, the model whose tokenizer counts the group's tokens.",
        default=None,
    )
    backend: str | None = _help(
        f"Generation backend, one of {list(BACKENDS)}; openai = a frozen agent on an OpenAI-compatible endpoint "
        "(set backend_options.base_url and .model). None = the run's.",
        default=None,
    )
    backend_options: dict[str, Any] = _help(
        "Options of the group's backend kind (mas_train.backends.options), merged over the run's when the kind "
        "is the run's, else replacing them.",
        default_factory=dict,
    )
    dtype: str | None = _help(f"Weights dtype, one of {list(DTYPES)}. None = the run's.", default=None)

    def given(self) -> dict[str, object]:
        """The settings this override gives (``None`` / empty ones left out)."""
        return {k: v for k, v in vars(self).items() if v not in (None, {})}


@dataclass
class EvalAgentConfig:
    """``mas-eval --agents.<agent>.model``: mas-train's ``agents.<agent>.model`` (the model of the agent's group;
    every agent of a group must then agree). A group whose model is given this way samples with that model's
    own weights, not the checkpoint's."""

    model: str | None = _help("Model of this agent's group (see model_groups.<group>.model).", default=None)


@dataclass
class EvalConfig:
    """One evaluation: a checkpoint (or a model) on a benchmark, reporting avg@k and pass@k per data source.

    Settings left ``None`` come from the evaluated run: sampling from its ``eval_sampling`` (the same rule the
    trainer's evaluation uses), ``k`` from its ``eval_k``, ``num_tasks`` from its ``eval_num_tasks`` (unless
    ``data`` names another benchmark), the data from its ``eval_data``; so ``mas-eval --checkpoint RUN`` repeats
    the run's last evaluation. Without a checkpoint they come from the defaults of a run.

    :meth:`evaluation_size` gives the ``(k, num_tasks)`` an evaluation of a run's config uses.
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
    k: int | None = _help(
        "Episodes per task (avg@k, pass@k). None = with --checkpoint the run's eval_k, else 4.",
        default=None,
    )
    num_tasks: int | None = _help(
        "Evaluate only the first N tasks; 0 = all. None = with --checkpoint and no --data the run's "
        "eval_num_tasks (so it reproduces the run's last evaluation), else all.",
        default=None,
    )
    temperature: float | None = _help("Sampling temperature. None = the run's eval_sampling.", default=None)
    top_p: float | None = _help(
        "Nucleus sampling mass in (0, 1]. None = the run's eval_sampling.", default=None
    )
    max_new_tokens: int | None = _help(
        "Tokens per agent turn. None = the run's eval_sampling (each agent's own by default).", default=None
    )
    tasks_per_batch: int | None = _help(
        "Tasks rolled out together (bounds memory; the episodes' seeds do not depend on it). None = with "
        "--checkpoint the run's eval_tasks_per_batch (the same batches as its evaluations), else 8.",
        default=None,
    )
    data_fields: dict[str, str] = _help(
        "Column renames for a custom data file, task field -> column (e.g. question=problem,answer=solution).",
        default_factory=dict,
    )
    model_groups: dict[str, EvalGroupConfig] = _help(
        "Per-model-group sources over the run's: --model_groups.<group>.backend / .backend_options.<key> / "
        ".model / .dtype (see --help epilog).",
        default_factory=dict,
    )
    agents: dict[str, EvalAgentConfig] = _help(
        "Per-agent sources over the run's: --agents.<agent>.model.", default_factory=dict
    )
    seed: int | None = _help("Sampling seed. None = the checkpoint's run seed, else 0.", default=None)
    output_dir: str = _help("Where 'latest' checkpoints are searched.", default="runs")
    output: str | None = _help(
        "Also write the metrics as JSON to this file, and the episodes (mas-train's episode records) to its "
        ".episodes.jsonl twin (eval.json -> eval.episodes.jsonl).",
        default=None,
    )
    log_episodes: int | None = _help(
        "With --output: which episodes go to the .episodes.jsonl file. None = every episode; N = the first "
        "episode of each of the first N tasks (as mas-train's log_eval_episodes); 0 = none.",
        default=None,
    )

    def __post_init__(self) -> None:
        if self.checkpoint is not None and self.model is not None:
            raise ConfigError("give --checkpoint or --model, not both")
        if self.initial and self.checkpoint is None:
            raise ConfigError(
                "--initial evaluates a checkpoint's run with its initial weights: give --checkpoint"
            )
        check_min("k", self.k, 1, none_ok=True)
        check_min("num_tasks", self.num_tasks, 0, none_ok=True)
        check_min("tasks_per_batch", self.tasks_per_batch, 1, none_ok=True)
        check_min("log_episodes", self.log_episodes, 0, none_ok=True)
        check_min("max_new_tokens", self.max_new_tokens, 1, none_ok=True)
        if self.temperature is not None and self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        for key in (*self.model_groups, *self.agents):
            if not GROUP_NAME_RE.match(str(key)):
                raise ConfigError(
                    f"{key!r}: a group or agent name may use letters, digits, '_', '.', '-' only"
                )
        for g, sub in self.model_groups.items():
            if sub.backend is not None:  # checked here, where the group's name is known
                check_choice(f"model_groups.{g}.backend", sub.backend, BACKENDS)
            if sub.dtype is not None:
                check_choice(f"model_groups.{g}.dtype", sub.dtype, DTYPES)
            if not sub.given():
                raise ConfigError(
                    f"model_groups.{g}: give at least one of model, backend, backend_options, dtype"
                )

    def evaluation_size(self, cfg: TrainConfig) -> tuple[int, int | None]:
        """``(k, num_tasks)`` for evaluating ``cfg`` (the checkpoint's run config, or a plain run's without
        ``--checkpoint``): the given values, else the run's ``eval_k`` / ``eval_num_tasks`` (with
        ``--checkpoint``; ``num_tasks`` only when no ``data`` is given), else 4 / all tasks.
        ``num_tasks`` ``None`` means all."""
        own = self.checkpoint is not None
        k = self.k if self.k is not None else (cfg.eval_k if own else 4)
        if self.num_tasks is not None:
            n = self.num_tasks or None
        else:
            n = cfg.eval_num_tasks if own and self.data is None else None
        return k, n

    def apply_sources(
        self, cfg: TrainConfig, agent_names: Sequence[str]
    ) -> tuple[TrainConfig, ResolvedConfig, frozenset[str]]:
        """Merge :attr:`model_groups` and :attr:`agents` over the evaluated run's config ``cfg``.

        A group switched to a backend that only samples becomes ``trainable: false`` (so are its agents' own
        ``trainable`` settings dropped): nothing trains in an evaluation, and a sampling-only backend refuses a
        trainable group. A switched backend kind gets only the options given here (the run's options were
        another kind's); the same kind merges them over the run's.

        Args:
            cfg: the run's :class:`~mas_train.config.TrainConfig` (a checkpoint's saved config, or a plain run).
            agent_names: the env's ``possible_agents``.

        Returns:
            ``(config, resolved, fresh)``: the merged ``TrainConfig``, its
            :class:`~mas_train.config.ResolvedConfig`, and the model groups whose source the overrides give (a
            ``model``, or a sampling-only backend): those take no weights from a checkpoint.

        Raises:
            ConfigError: an override names a model group the run does not have (the message lists the run's
                groups and their agents) or an agent the env does not have; the overrides would move agents to
                other groups (``agents.<a>.model`` under ``model_sharing: shared``: a checkpoint's weights are
                per group); invalid merged settings (e.g. ``backend: openai`` without ``base_url``) -- all before
                any model is loaded.
        """
        from mas_train.backends import backend_kind
        from mas_train.config.sections import AgentConfig, ModelGroupConfig

        base = cfg.resolve(list(agent_names))
        if not self.model_groups and not self.agents:
            return cfg, base, frozenset()
        listed = "; ".join(f"{g} (agents: {', '.join(m.agents)})" for g, m in base.model_groups.items())
        for g in self.model_groups:
            if g not in base.model_groups:
                raise ConfigError(
                    f"model_groups.{g}: the evaluated run has no model group {g!r}; its groups are: {listed}."
                    f"{close_matches(g, list(base.model_groups))}"
                )
        for a in self.agents:
            if a not in base.agents:
                raise ConfigError(
                    f"agents.{a}: env {cfg.env!r} has no agent {a!r}; its agents are: {', '.join(base.agents)}."
                    f"{close_matches(a, list(base.agents))}"
                )
        groups, agents = dict(cfg.model_groups), dict(cfg.agents)
        fresh: set[str] = set()
        for g, ov in self.model_groups.items():
            run_group = base.model_groups[g]
            gcfg = groups.get(g) or ModelGroupConfig(name=g)
            kind = ov.backend or run_group.backend
            same_kind = kind == run_group.backend
            changes: dict[str, Any] = {
                "backend": kind,
                "backend_options": {**(gcfg.backend_options if same_kind else {}), **ov.backend_options},
            }
            if ov.model is not None:
                changes["model"] = ov.model
                fresh.add(g)
            if ov.dtype is not None:
                changes["dtype"] = ov.dtype
            if not backend_kind(kind).can_train:
                changes["trainable"] = False
                fresh.add(g)
                for a in run_group.agents:
                    if a in agents and agents[a].trainable is not None:
                        agents[a] = dataclasses.replace(agents[a], trainable=None)
            groups[g] = dataclasses.replace(gcfg, **changes)
        for a, agent_ov in self.agents.items():
            if agent_ov.model is not None:
                agents[a] = dataclasses.replace(agents.get(a) or AgentConfig(name=a), model=agent_ov.model)
        merged = dataclasses.replace(cfg, model_groups=groups, agents=agents)
        resolved = merged.resolve(list(agent_names))
        if resolved.agent_to_group != base.agent_to_group:
            raise ConfigError(
                f"the mas-eval overrides move agents to other model groups ({base.agent_to_group} -> "
                f"{resolved.agent_to_group}), but the run's weights are per model group: set "
                "--model_groups.<group>.model for a whole group instead"
            )
        fresh.update(resolved.agents[a].model_group for a, ov in self.agents.items() if ov.model is not None)
        return merged, resolved, frozenset(fresh)


def _nested_help(cls: type, prefix: str) -> str:
    return "\n".join(f"  {prefix}.{f.name}: {f.metadata['help']}" for f in dataclasses.fields(cls))


def build_eval_parser(prog: str = "mas-eval") -> ArgParser:
    """The argparse parser behind :func:`parse_eval_args` (``--help``); its errors raise :class:`ConfigError`."""
    parser = build_argparser(
        EvalConfig,
        prog,
        "Evaluate a checkpoint or a model on a benchmark: avg@k and pass@k per data source.",
        "Examples:\n  mas-eval --checkpoint runs/<run>/checkpoints/step-000020 --data gsm8k-test --k 4\n"
        "  mas-eval --checkpoint runs/<run> --initial     # the run's agents and settings, initial weights\n"
        "  mas-eval --model smollm2-135m-instruct --env math-2agent --data math500 --num_tasks 50\n"
        "  mas-eval --checkpoint runs/<run> --model_groups.verifier.backend openai \\\n"
        "      --model_groups.verifier.backend_options base_url=http://127.0.0.1:8000/v1,model=NAME,api_key_env=null\n"
        "      # the solver's trained weights, the verifier on an OpenAI-compatible endpoint\n"
        "Flags override --config eval.yaml (the same keys), which overrides the run's saved config.\n"
        "Per-model-group sources (mas-train's names; a group given a model or a sampling-only backend takes no "
        "weights from the checkpoint):\n"
        + _nested_help(EvalGroupConfig, "--model_groups.<group>")
        + "\n"
        + _nested_help(EvalAgentConfig, "--agents.<agent>")
        + "\nMapping flags: --env_kwargs max_loops=3 or --env_kwargs.max_loops 3. --debug shows an error's "
        "traceback.",
        skip=("model_groups", "agents"),
    )
    parser.add_argument(
        "--config", metavar="YAML", help="YAML file of mas-eval settings (keys as the flags)."
    )
    return parser


def parse_eval_args(argv: Sequence[str] | None = None, prog: str = "mas-eval") -> EvalConfig:
    """Parse ``mas-eval`` flags into an :class:`EvalConfig`.

    Raises:
        ConfigError: unknown flags or settings (with close matches; e.g.
            ``--model_groups.verifier.learning_rate``, which evaluation has no use for), bad values (e.g.
            ``--num_tasks -1``, ``--tasks_per_batch 0``), ``--checkpoint`` with ``--model``, a missing or invalid
            ``--config`` file.
        SystemExit: for ``--help``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    specials, pairs = cli_overrides(EvalConfig, build_eval_parser(prog), argv, ("config",))
    file_layer = load_yaml(specials["config"]) if "config" in specials else {}
    return build(EvalConfig, [file_layer, overrides_tree(pairs)])

"""Start-up of a run: everything that can be checked is checked here, before any model is loaded.

:func:`prepare` turns a :class:`~mas_train.config.TrainConfig` into a :class:`RunPlan`: the resume target and
the settings it may change, the env (one probe env, built once), the agents mapped to model groups, and the
training and evaluation tasks, loaded. Every user mistake it finds is a
:class:`~mas_train.config.ConfigError` whose message says what to do; ``mas-train`` prints it as one
``error:`` line. Loading models is the trainer's job and comes after.

Resume rule: a resumed run continues the saved run's configuration. Settings that only change what happens
from now on (:data:`RESUMABLE_CHANGES`: the step budget, logging, evaluation and checkpoint cadence, where it
runs) may be changed; they are applied and recorded in the run folder's ``config.yaml`` and appended to
``config_history.jsonl``. Any other change (the data, the models, the optimisation settings, whose state the
checkpoint carries) is refused: the optimizer state would silently keep the old learning rate, for example.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mas_envs.core import EnvFactory, text_env
from mas_train.backends.options import OpenAIOptions, SGLangHTTPOptions, VLLMHTTPOptions
from mas_train.config import ConfigError, ResolvedConfig, ResolvedModelGroup, TrainConfig
from mas_train.league import check_league, game_of

if TYPE_CHECKING:
    from pettingzoo import AECEnv

__all__ = [
    "RESUMABLE_CHANGES",
    "RunPlan",
    "check_api_keys",
    "check_models",
    "group_source",
    "check_reward_weights",
    "load_task_rows",
    "make_env_factory",
    "prepare",
    "probe_env",
    "record_config",
    "resume_target",
]

#: Top-level settings (and sections, for nested ones) a resumed run may change.
RESUMABLE_CHANGES = frozenset(
    {
        "max_steps",
        "logging_steps",
        "log_episodes",
        "log_eval_episodes",
        "save_steps",
        "save_total_limit",
        "eval_steps",
        "eval_k",
        "eval_num_tasks",
        "eval_sampling",
        "eval_before_training",
        "report_to",
        "resume",
        "device",
        "pool",
        "output_dir",
        "run_name",
        "log_agent_grad_norms",
    }
)


@dataclass
class RunPlan:
    """What :func:`prepare` established about a run, before any model is loaded.

    Attributes:
        config: the run's settings (for a resumed run: the saved ones with the allowed changes applied).
        resolved: agents mapped to model groups (:class:`~mas_train.config.ResolvedConfig`).
        env_factory: zero-argument constructor of the run's env.
        probe: one env built by ``env_factory`` (its agents, penalty and task lists were read from it).
        train_tasks: training rows (without any question of the evaluation rows).
        eval_tasks: evaluation rows (already cut to ``eval_num_tasks``), or ``None`` when evaluation is off.
        checkpoint: the checkpoint to resume from, or ``None``.
        changes: settings changed on resume, dotted name -> (saved, now).
        warnings: problems worth a line that do not stop the run (a retrieval server that does not answer
            yet: it may still be loading its index).
    """

    config: TrainConfig
    resolved: ResolvedConfig
    env_factory: EnvFactory
    probe: AECEnv[str, str, str]
    train_tasks: list[dict[str, object]]
    eval_tasks: list[dict[str, object]] | None
    checkpoint: Path | None = None
    changes: dict[str, tuple[object, object]] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.resolved.run_dir


def resume_target(cfg: TrainConfig) -> tuple[TrainConfig, Path | None, dict[str, tuple[object, object]]]:
    """Resolve ``cfg.resume`` and check what the resumed run changes.

    Returns:
        ``(cfg pointed at the checkpoint's run folder, checkpoint folder, allowed changes)``, or
        ``(cfg, None, {})`` when not resuming.

    Raises:
        FileNotFoundError: nothing to resume from.
        ConfigError: a change that a resumed run cannot honour (see the module docstring).
    """
    from mas_train.checkpoint import find_checkpoint
    from mas_train.config import config_diff

    if not cfg.resume:
        return cfg, None, {}
    ckpt = find_checkpoint(cfg.resume, cfg.output_dir)
    run_dir = ckpt.parent.parent
    cfg = dataclasses.replace(cfg, output_dir=str(run_dir.parent), run_name=run_dir.name)
    saved_path = ckpt / "config.yaml"
    if not saved_path.is_file():
        return cfg, ckpt, {}
    saved = TrainConfig.from_yaml(saved_path)
    changes = config_diff(saved, cfg)
    refused = {k: v for k, v in changes.items() if k.split(".", 1)[0] not in RESUMABLE_CHANGES}
    if refused:
        shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise ConfigError(
            f"--resume {cfg.resume}: this run changes settings a checkpoint cannot continue with ({shown}). "
            "A resumed run keeps the data, models and optimisation state it was saved with; drop these flags "
            "to continue it, or start a new run (without --resume) to train with them"
        )
    return cfg, ckpt, {k: v for k, v in changes.items() if k.split(".", 1)[0] not in ("resume",)}


def make_env_factory(cfg: TrainConfig) -> EnvFactory:
    """``lambda: mas_envs.make(cfg.env, **cfg.env_make_kwargs())`` (a named function, so Ray can pickle it)."""
    kwargs = cfg.env_make_kwargs()
    env_id = cfg.env

    def env_factory() -> AECEnv[str, str, str]:
        import mas_envs

        return mas_envs.make(env_id, **kwargs)

    return env_factory


def check_reward_weights(resolved: ResolvedConfig, probe: AECEnv[str, str, str]) -> None:
    """Refuse a role weight for an agent the env gives no role score (it could never be honoured).

    Raises:
        ConfigError: one line naming the agent, the env's role-scored agents and what to do.
    """
    scored = text_env(probe).role_reward_agents
    for name, agent in resolved.agents.items():
        if agent.reward_weights.role != 0.0 and name not in scored:
            gives = f"gives role scores to {', '.join(scored)} only" if scored else "gives no role scores"
            raise ConfigError(
                f"agents.{name}.reward_weights.role is {agent.reward_weights.role:g}, but env "
                f"{resolved.config.env!r} {gives}; set agents.{name}.reward_weights.role: 0 or use an env that "
                "scores this agent by role (docs/envs.md 'Role rewards')"
            )


def probe_env(cfg: TrainConfig, factory: EnvFactory) -> AECEnv[str, str, str]:
    """``factory()``, with an unknown env id or an env argument the env does not take turned into a
    :class:`ConfigError` that says where to look.

    Raises:
        ConfigError: as above.
    """
    from mas_envs.registration import UnknownEnvError

    try:
        return factory()
    except UnknownEnvError as err:
        raise ConfigError(str(err)) from None
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"env {cfg.env!r} cannot be made with env_kwargs {dict(cfg.env_kwargs)}: {err}. "
            "Check the env's arguments in its documentation (docs/envs.md)"
        ) from None


def load_task_rows(what: str, loader: Callable[[], list[dict[str, object]]]) -> list[dict[str, object]]:
    """``loader()``'s rows, with a missing, unreadable or empty data source turned into one
    :class:`ConfigError` line that starts with ``what`` (and names ``data_fields`` for a missing column).

    Raises:
        ConfigError: as above.
    """
    try:
        rows = loader()
    except ConfigError:
        raise
    except FileNotFoundError as err:
        raise ConfigError(f"{what}: {err}") from None
    except (KeyError, ValueError, TypeError, StopIteration, OSError) as err:
        hint = (
            " (rename columns with data_fields, e.g. --data_fields question=problem,answer=solution)"
            if isinstance(err, KeyError)
            else ""
        )
        detail = err.args[0] if isinstance(err, KeyError) and err.args else err
        if not str(detail).strip():  # e.g. a bare StopIteration from a reader: say at least what went wrong
            detail = f"could not be read ({type(err).__name__}); check that it holds task rows"
        raise ConfigError(f"{what}: {detail}{hint}") from None
    if not rows:
        raise ConfigError(f"{what}: no usable task rows")
    return rows


def group_source(group: ResolvedModelGroup) -> str:
    """Where a resolved model group's turns come from, for start-up lines: ``openai endpoint URL (model M)``,
    ``sglang server URL``, or ``MODEL (BACKEND)`` for weights loaded here."""
    opts = group.backend_options
    if isinstance(opts, OpenAIOptions):
        return f"openai endpoint {opts.base_url} (model {opts.model})"
    if isinstance(opts, SGLangHTTPOptions | VLLMHTTPOptions) and opts.url:
        return f"{group.backend.split('_')[0]} server {opts.url}"
    return f"{group.model} ({group.backend})"


def check_models(resolved: ResolvedConfig) -> None:
    """Every model group's model can be found (:func:`mas_train.models.check_model_source`), before any loads.

    Raises:
        ConfigError: a model that is not a builtin, a local model folder or a reachable hub id (the message
            names the group and says what to do).
        ImportError: a builtin's package is missing (the message has the pip line).
    """
    from mas_train.models import ModelNotFoundError, check_model_source

    for g, rg in resolved.model_groups.items():
        try:
            check_model_source(rg.model)
        except ModelNotFoundError as err:
            where = (
                f"model group {g!r} ({', '.join(rg.agents)})" if len(resolved.model_groups) > 1 else "model"
            )
            raise ConfigError(f"{where}: {err}") from None


def check_api_keys(resolved: ResolvedConfig) -> None:
    """An ``openai`` group whose API key variable is unset is a user mistake: say so before any model loads.

    Raises:
        ConfigError: names the group and the variable, and says how to go without a key.
    """
    import os

    for g, rg in resolved.model_groups.items():
        opts = rg.backend_options
        env_var = opts.api_key_env if isinstance(opts, OpenAIOptions) else None
        if env_var and not os.environ.get(env_var):
            raise ConfigError(
                f"model_groups.{g}: environment variable {env_var!r} (backend_options.api_key_env) is unset or "
                f"empty; export the API key there, or pass --model_groups.{g}.backend_options.api_key_env null "
                "for a server without authentication"
            )


def evaluation_on(cfg: TrainConfig) -> bool:
    """Whether the run evaluates at all: ``eval_steps > 0`` (``eval_before_training`` adds step 0 to it)."""
    return bool(cfg.eval_steps)


def prepare(cfg: TrainConfig, *, env_factory: EnvFactory | None = None) -> RunPlan:
    """Check and resolve everything about a run that needs no model (see the module docstring).

    Args:
        cfg: a :class:`~mas_train.config.TrainConfig`.
        env_factory: build envs with this instead of ``mas_envs.make(cfg.env, ...)`` (tests, custom drivers).

    Raises:
        ConfigError: any setting the run cannot honour, with what to do.
        FileNotFoundError: ``--resume`` target not found.
    """
    from mas_train import tasks as T

    cfg, ckpt, changes = resume_target(cfg)
    factory = env_factory or make_env_factory(cfg)
    probe = probe_env(cfg, factory)
    resolved = cfg.resolve(list(probe.possible_agents))
    check_api_keys(resolved)
    check_models(resolved)
    check_reward_weights(resolved, probe)
    try:
        check_league(resolved, game_of(probe))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    train = load_task_rows(
        f"train_data {cfg.train_data!r}" if cfg.train_data else "the env's training tasks",
        lambda: T.train_tasks(cfg, probe),
    )
    evals = None
    if evaluation_on(cfg):
        src = T.eval_source(cfg, probe)
        evals = load_task_rows(
            f"eval_data {src!r}", lambda: T.eval_tasks(cfg, probe, limit=cfg.eval_num_tasks)
        )
        notes: list[str] = []
        # Held-out means held out: a procedural generator repeats questions across seeds, a file may too. A game's
        # own deals are starting positions, played in training and evaluation alike (eval_plays_train_tasks).
        if src is not None or not text_env(probe).eval_plays_train_tasks:
            from mas_envs.data import drop_overlap

            try:  # its count goes into the start-up banner, not a Python warning with a source line
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    train = drop_overlap(train, evals, what="training")
            except ValueError as err:
                raise ConfigError(str(err)) from None
            notes = [str(w.message) for w in caught]
    else:
        notes = []
    return RunPlan(
        config=cfg,
        resolved=resolved,
        env_factory=factory,
        probe=probe,
        train_tasks=train,
        eval_tasks=evals,
        checkpoint=ckpt,
        changes=changes,
        warnings=[*notes, *text_env(probe).startup_warnings()],
    )


def record_config(plan: RunPlan, step: int) -> None:
    """Write the run's ``config.yaml`` (new run, or a resumed run with changes) and append the changes of a
    resumed run to ``config_history.jsonl`` (step, dotted name, saved value, new value)."""
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if plan.checkpoint is None or plan.changes:
        plan.config.to_yaml(run_dir / "config.yaml")
    if plan.changes:
        with (run_dir / "config_history.jsonl").open("a") as fh:
            fh.write(
                json.dumps(
                    {"step": step, "changes": {k: [old, new] for k, (old, new) in plan.changes.items()}},
                    default=str,
                )
                + "\n"
            )

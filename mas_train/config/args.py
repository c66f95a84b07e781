"""``mas-train`` command line: flags over ``--config run.yaml`` over (with ``--resume``) the run's saved config.

Also :func:`explicit_overrides` (which settings a command line gives) and :func:`config_diff` (what differs
between two configs), for the resume rules.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mas_train.config.common import LAPTOP_DEFAULTS, ConfigError
from mas_train.config.omega import (
    ArgParser,
    build_argparser,
    cli_overrides,
    flatten,
    load_yaml,
    overrides_tree,
)
from mas_train.config.sections import AgentConfig, ModelGroupConfig, SamplingConfig
from mas_train.config.train import TrainConfig

__all__ = ["build_parser", "config_diff", "explicit_overrides", "laptop_notes", "parse_args"]

_SPECIAL = ("config", "agent_models")


def _nested_help(cls: type, prefix: str) -> str:
    lines = []
    for f in dataclasses.fields(cls):
        if f.name == "name":
            continue
        if f.name == "sampling":
            for sf in dataclasses.fields(SamplingConfig):
                lines.append(f"  {prefix}.sampling.{sf.name}: {sf.metadata['help']}")
            continue
        lines.append(f"  {prefix}.{f.name}: {f.metadata['help']}")
    return "\n".join(lines)


def laptop_notes() -> dict[str, str]:
    """Per dotted setting, what a plain run of each env with a laptop setting uses instead of the default,
    e.g. ``{"max_steps": "plain run of math-2agent, math-1agent: 14", ...}`` (for ``--help``)."""
    by_key: dict[str, dict[str, list[str]]] = {}
    mappings = {f.name for f in dataclasses.fields(TrainConfig) if f.default_factory is dict}
    for env, layer in LAPTOP_DEFAULTS.items():
        for path, value in flatten(layer).items():
            shown = str(value) if len(str(value)) <= 40 else str(value)[:30] + "…"
            top, _, key = path.partition(".")
            if top in mappings:  # a key of a mapping flag (env_kwargs): shown on that flag as key=value
                path, shown = top, f"{key}={shown}"
            by_key.setdefault(path, {}).setdefault(shown, []).append(env)
    return {
        path: "plain run of " + "; ".join(f"{', '.join(envs)}: {v}" for v, envs in values.items())
        for path, values in by_key.items()
    }


def build_parser(prog: str = "mas-train") -> ArgParser:
    """The argparse parser behind :func:`parse_args` (every :class:`TrainConfig` field is a flag); it is used for
    ``--help`` and to tell top-level flags from dotted ones. Its errors raise :class:`ConfigError`."""
    envs = ", ".join(LAPTOP_DEFAULTS)
    description = (
        "Train a multi-agent LLM system with Dr. MAS GRPO.\n\n"
        "What a plain run does: `mas-train --env math-2agent` (no --train_data, --eval_data or model named)\n"
        f"trains the laptop setting of its env ({envs};\nmas_train/config/common.py LAPTOP_DEFAULTS): "
        "SmolLM2-135M with a LoRA adapter per agent on one-digit\narithmetic, 14 steps, sized for a CPU "
        "(about 4.5-6.5 min on 2 CPU cores, evaluations included). Each flag below shows its default and, where\nthe laptop setting differs, "
        "'plain run of <env>: <value>'. Naming tasks or a model (--train_data\ngsm8k-train, --model "
        "Qwen/Qwen3-4B) switches the laptop setting off: the defaults then hold, with the\nenv's paper "
        "prompts and data. A flag you give always wins."
    )
    epilog = (
        "Flags override --config run.yaml, which overrides the defaults (with --resume: the run's saved config).\n"
        "Nested settings use dotted flags:\n"
        "  --agents.<agent>.<setting> VALUE, --model_groups.<group>.<setting> VALUE,\n"
        "  --grpo.<GRPOConfig key> VALUE, --env_kwargs.<key> VALUE, --model_groups.<g>.backend_options.<key> VALUE.\n"
        "Per-agent settings:\n" + _nested_help(AgentConfig, "--agents.<agent>") + "\n"
        "Per-model-group settings:\n" + _nested_help(ModelGroupConfig, "--model_groups.<group>")
    )
    parser = build_argparser(
        TrainConfig,
        prog,
        description,
        epilog,
        skip=("agents", "model_groups"),
        notes=laptop_notes(),
    )
    parser.add_argument("--config", metavar="YAML", help="YAML file of settings (keys as the flags below).")
    parser.add_argument(
        "--agent_models",
        metavar="AGENT=MODEL,...",
        help="Per-agent models, e.g. solver=Qwen/Qwen3-4B,verifier=./ckpt (sets agents.<agent>.model).",
    )
    return parser


def _split(argv: Sequence[str], prog: str) -> tuple[dict[str, Any], list[tuple[tuple[str, ...], Any]]]:
    specials, pairs = cli_overrides(TrainConfig, build_parser(prog), argv, _SPECIAL)
    if "agent_models" in specials:
        from mas_train.config.omega import read_value

        models = read_value(specials["agent_models"], dict[str, str], "--agent_models")
        if not isinstance(models, dict):
            raise ConfigError("--agent_models: expected agent=model pairs separated by commas")
        pairs += [(("agents", str(a), "model"), str(m)) for a, m in models.items()]
    return specials, pairs


def explicit_overrides(argv: Sequence[str] | None = None) -> set[str]:
    """Dotted settings the command line gives (``--config``'s file is not the command line), e.g.
    ``{"max_steps", "agents.verifier.sampling.temperature", "env_kwargs.max_loops", "resume"}``.

    Raises:
        ConfigError: as :func:`parse_args`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _, pairs = _split(argv, "mas-train")
    return {".".join(path) for path, _ in pairs}


def parse_args(argv: Sequence[str] | None = None, prog: str = "mas-train") -> TrainConfig:
    """Parse CLI flags (and ``--config run.yaml``) into a :class:`TrainConfig`.

    Layering, later wins: dataclass defaults < with ``--resume RUN``, the ``config.yaml`` of the checkpoint
    :func:`mas_train.checkpoint.find_checkpoint` finds for ``RUN`` < the ``--config`` file < flags.

    Args:
        argv: the arguments without the program name; ``None`` = ``sys.argv[1:]``.

    Raises:
        ConfigError: unknown flags (with close matches), bad values, invalid settings, nothing to resume.
        SystemExit: for ``--help`` (argparse prints the help).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    specials, pairs = _split(argv, prog)
    cli = overrides_tree(pairs)
    file_layer = load_yaml(specials["config"]) if "config" in specials else {}
    layers = [file_layer, cli]
    resume = cli.get("resume")
    if resume:
        output_dir = cli.get("output_dir") or file_layer.get("output_dir") or "runs"
        layers.insert(0, _saved_config(str(resume), str(output_dir)))
    return TrainConfig.from_layers(layers)


def _saved_config(spec: str, output_dir: str) -> dict[str, Any]:
    from mas_train.checkpoint import find_checkpoint

    try:
        ckpt = find_checkpoint(spec, output_dir)
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None
    path = Path(ckpt) / "config.yaml"
    if not path.is_file():
        raise ConfigError(
            f"--resume {spec}: checkpoint {ckpt} has no config.yaml to resume the run's settings from"
        )
    saved = load_yaml(path)
    saved.pop("resume", None)
    return saved


def config_diff(a: TrainConfig, b: TrainConfig) -> dict[str, tuple[object, object]]:
    """Settings that differ between two configs, on dotted paths: ``{"learning_rate": (1e-5, 3e-6)}``.

    Mapping sections are compared key by key (``env_kwargs.max_loops``, ``agents.verifier.sampling.temperature``);
    a key only one side has appears with ``None`` on the other. Lists compare whole.
    """
    fa, fb = flatten(a.to_dict()), flatten(b.to_dict())
    return {k: (fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}

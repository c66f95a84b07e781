"""Resolution: the env's agents mapped to model groups, every setting made concrete (:class:`ResolvedConfig`).

A setting is looked up agent -> model group -> top level; agents that share a model group must agree on every
optimisation setting and on ``trainable`` (one group has one optimizer and is trained as a whole), as in
Dr. MAS (``build_wg_ids`` asserts equal configs for agents sharing a model). Every check here runs before any
model is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from mas_train.backends import backend_kind
from mas_train.backends.base import BackendOptions, SamplingParams
from mas_train.config.common import GROUP_NAME_RE, OPTIM_FIELDS, ConfigError, close_matches
from mas_train.config.omega import build
from mas_train.config.sections import AgentConfig, LoraConfig, ModelGroupConfig, RewardWeights, SamplingConfig

if TYPE_CHECKING:  # train.py imports this module
    from mas_train.config.train import TrainConfig


@runtime_checkable
class _LoraServerOptions(Protocol):
    """Options of a kind whose server loads LoRA adapters itself (the SGLang kinds): the config checks a
    group's ``lora`` section against them before any model loads."""

    def lora_server_args(self, lora: LoraConfig | None, group: str = ...) -> object:
        """Raises ValueError (one line) when the options cannot serve ``lora``."""


_T = TypeVar("_T")

__all__ = ["ResolvedAgent", "ResolvedConfig", "ResolvedModelGroup", "backend_options", "resolve"]


@dataclass(frozen=True)
class ResolvedAgent:
    """One agent with concrete settings."""

    name: str
    model_group: str
    sampling: SamplingConfig
    reward_weights: RewardWeights = field(default_factory=RewardWeights)

    def sampling_params(self, stop: Sequence[str] = (), *, seed: int | None = None) -> SamplingParams:
        """Backend request for one training turn of this agent (``stop``: the env's stop strings for it).
        Evaluation sampling is :func:`mas_train.eval.eval_sampling`."""
        return self.sampling.to_params(stop, seed)


@dataclass(frozen=True)
class ResolvedModelGroup:
    """One model group with concrete settings; ``agents`` are the agents it trains, in env order.

    Attributes:
        backend_options: an instance of the backend kind's options class (:mod:`mas_train.backends.options`).
        trainable: whether the group's weights are updated (``False``: it only samples).
        lora: the adapter to train, or ``None`` for full fine-tuning.
        base_group: with ``model_sharing: shared_lora``, the name of the group that holds the base model every
            adapter of the run sits on (the first group in env order; that group's ``base_group`` is its own
            name): groups with the same ``base_group`` share one copy of the base weights, each with its own
            adapter. ``None``: the group owns its weights.
        micro_batch_size: samples per forward/backward of the group's update.
        num_ranks: processes the group's update runs on (1: in the worker; N > 1: N rank processes holding the
            model sharded by ``sharding``, :mod:`mas_train.hosting.sharded`).
        sharding: the sharding of a group with ``num_ranks > 1`` (``"fsdp2"``).
        rank_gpu_ids: the GPU of each rank on a CUDA run (empty: GPUs ``0..num_ranks-1``).
    """

    name: str
    model: str
    agents: tuple[str, ...]
    backend: str
    backend_options: BackendOptions
    dtype: str
    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    warmup_steps: float
    lr_scheduler_type: str
    grpo: dict[str, Any]
    num_cpus: float
    num_gpus: float
    micro_batch_size: int
    trainable: bool = True
    lora: LoraConfig | None = None
    base_group: str | None = None
    num_ranks: int = 1
    sharding: str = "fsdp2"
    rank_gpu_ids: tuple[int, ...] = ()

    def grpo_config_kwargs(self) -> dict[str, Any]:
        """This group's optimisation settings plus its ``grpo`` passthrough, as ``GRPOConfig`` keyword arguments.

        The caller adds run-level keys (output_dir, num_generations, max_steps, seed, use_cpu, bf16, ...).
        """
        return {**{f: getattr(self, f) for f in OPTIM_FIELDS}, **self.grpo}


@dataclass(frozen=True)
class ResolvedConfig:
    """The run's config with the env's agents mapped to model groups (from ``TrainConfig.resolve``)."""

    config: TrainConfig
    agents: dict[str, ResolvedAgent]
    model_groups: dict[str, ResolvedModelGroup]
    run_name: str

    @property
    def agent_to_group(self) -> dict[str, str]:
        return {a.name: a.model_group for a in self.agents.values()}

    @property
    def run_dir(self) -> Path:
        return Path(self.config.output_dir) / self.run_name


def backend_options(kind: str, options: Mapping[str, object], where: str) -> BackendOptions:
    """``options`` validated against ``kind``'s options dataclass (types coerced by OmegaConf).

    Raises:
        ConfigError: unknown kind or option (with close matches), a wrong type, a missing required option, or
            an invalid value; the message names ``where``.
    """
    try:
        cls = backend_kind(kind).options
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    opts: BackendOptions = build(cls, [options], where=where)
    return opts


def _group_names_for_models(models: list[str]) -> dict[str, str]:
    if len(models) == 1:
        return {models[0]: "shared"}
    names: dict[str, str] = {}
    for m in models:
        base = re.sub(r"[^A-Za-z0-9_.\-]+", "-", Path(m.rstrip("/")).name or m).strip("-.") or "model"
        name, i = base, 2
        while name in names.values():
            name, i = f"{base}-{i}", i + 1
        names[m] = name
    return names


def _agent_to_group(
    cfg: TrainConfig, agent_names: list[str], agent_cfg: dict[str, AgentConfig]
) -> dict[str, str]:
    env_agents = ", ".join(agent_names)
    mapping: dict[str, str] = {}
    if isinstance(cfg.model_sharing, Mapping):
        for a in agent_names:
            group = agent_cfg[a].model_group or cfg.model_sharing.get(a)
            if group is None:
                raise ConfigError(
                    f"model_sharing maps some agents but not {a!r}; map every agent of {cfg.env!r} ({env_agents}) "
                    f"or set agents.{a}.model_group"
                )
            mapping[a] = group
    elif cfg.model_sharing in ("per_agent", "shared_lora"):
        mapping = {a: agent_cfg[a].model_group or a for a in agent_names}
    else:  # shared: one group per distinct model, as Dr. MAS groups shared agents by model id
        by_model: dict[str, list[str]] = {}
        for a in agent_names:
            if agent_cfg[a].model_group is None:
                by_model.setdefault(agent_cfg[a].model or cfg.model, []).append(a)
        names = _group_names_for_models(list(by_model))
        for model, agents in by_model.items():
            for a in agents:
                mapping[a] = names[model]
        for a in agent_names:
            if agent_cfg[a].model_group is not None:
                mapping[a] = agent_cfg[a].model_group  # type: ignore[assignment]
    for a, group in mapping.items():
        if not GROUP_NAME_RE.match(group):
            raise ConfigError(f"agent {a!r} maps to group {group!r}: use letters, digits, '_', '.', '-' only")
    return mapping


def _agreed(g: str, members: tuple[str, ...], field: str, values: Mapping[str, _T], fix: str) -> _T:
    if len(set(values.values())) > 1:
        shown = ", ".join(f"{a}={v!r}" for a, v in values.items())
        raise ConfigError(
            f"agents {list(members)} share model group {g!r} but disagree on {field}: {shown}. {fix}"
        )
    return next(iter(values.values()))


def _check_sharded(
    cfg: TrainConfig,
    g: str,
    num_ranks: int,
    trainable: bool,
    lora: LoraConfig | None,
    grpo: Mapping[str, Any],
) -> None:
    """Refuse a ``num_ranks > 1`` this version cannot honour, before any model loads."""
    if num_ranks == 1:
        return
    where = f"model_groups.{g}.num_ranks = {num_ranks}"
    if not trainable:
        raise ConfigError(
            f"{where}: the group is frozen (trainable: false), it has no update to shard; drop it"
        )
    if lora is not None:
        raise ConfigError(
            f"{where}: sharding a LoRA group (lora section, or model_sharing: shared_lora) is not implemented; "
            "use num_ranks: 1 for LoRA groups (an adapter is small), or full fine-tuning"
        )
    if cfg.log_agent_grad_norms:
        raise ConfigError(
            f"{where}: per-agent gradient norms are not measured for a sharded group; unset "
            "log_agent_grad_norms (auto: off for that group) or set it false"
        )
    if float(grpo.get("beta", 0.0) or 0.0) != 0.0:
        raise ConfigError(f"{where}: a sharded group with a KL reference (grpo.beta > 0) is not implemented")
    if cfg.pool == "ray":
        gcfg = cfg.model_groups.get(g)
        if gcfg is not None and gcfg.rank_gpu_ids:
            raise ConfigError(
                f"model_groups.{g}.rank_gpu_ids: under pool: ray, Ray assigns the group's GPUs; drop it and set "
                f"model_groups.{g}.num_gpus: {num_ranks + 1} (one GPU per rank, the rest for its worker)"
            )
        if gcfg is not None and 0 < gcfg.num_gpus <= num_ranks:
            # the ranks are actors with a bundle and one GPU each; the worker's bundle gets the rest
            raise ConfigError(
                f"{where} under pool: ray: the group reserves num_gpus = {gcfg.num_gpus}, its ranks need one GPU "
                f"each and its worker (generation) the rest: set model_groups.{g}.num_gpus: {num_ranks + 1} "
                f"(or {num_ranks} + its engine's tp_size; {num_ranks + 0.5} shares the worker's GPU with another "
                "group's)"
            )


def _group_lora(
    cfg: TrainConfig, gcfg: ModelGroupConfig, trainable: bool, shared_lora: bool
) -> LoraConfig | None:
    """A group's adapter: its own ``lora``, else the top-level one (trainable groups), else the default adapter
    under ``shared_lora``, else None (full fine-tuning)."""
    if gcfg.lora is not None:
        return gcfg.lora
    if cfg.lora is not None and trainable:
        return cfg.lora
    return LoraConfig() if shared_lora else None


def resolve(cfg: TrainConfig, agent_names: list[str]) -> ResolvedConfig:
    """See ``TrainConfig.resolve``."""
    if not agent_names:
        raise ConfigError(f"env {cfg.env!r} reported no agents")
    env_agents = ", ".join(agent_names)
    for where, names in (("agents", cfg.agents), ("model_sharing", cfg.model_sharing)):
        if isinstance(names, Mapping):
            for name in names:
                if name not in agent_names:
                    raise ConfigError(
                        f"{where}.{name}: env {cfg.env!r} has no agent {name!r}; its agents are: {env_agents}."
                        f"{close_matches(name, agent_names)}"
                    )
    agent_cfg = {a: cfg.agents.get(a) or AgentConfig(name=a) for a in agent_names}
    mapping = _agent_to_group(cfg, agent_names, agent_cfg)
    groups_in_order = list(dict.fromkeys(mapping[a] for a in agent_names))
    unused = [g for g in cfg.model_groups if g not in groups_in_order]
    if unused:
        raise ConfigError(
            f"model_groups has settings for {unused} but no agent maps to them; the groups are: "
            f"{', '.join(groups_in_order)} (agent -> group: {mapping})"
        )
    shared_lora = cfg.model_sharing == "shared_lora"

    groups: dict[str, ResolvedModelGroup] = {}
    for g in groups_in_order:
        members = tuple(a for a in agent_names if mapping[a] == g)
        gcfg = cfg.model_groups.get(g) or ModelGroupConfig(name=g)
        models: dict[str, str] = {a: m for a in members if (m := agent_cfg[a].model) is not None}
        if gcfg.model is not None:
            models = {f"model_groups.{g}": gcfg.model, **models}
        if len(set(models.values())) > 1:
            raise ConfigError(
                f"model group {g!r} is one set of weights but its settings name different models: {models}. "
                "Give the agents their own groups (model_sharing: per_agent) or use one model."
            )
        model = next(iter(models.values()), cfg.model)
        fix = (
            f"One model group has one optimizer: set model_groups.{g}.<setting> instead, or give the agents "
            "separate groups (model_sharing: per_agent)."
        )
        optim: dict[
            str, Any
        ] = {}  # OPTIM_FIELDS: floats and a str, checked by the TrainConfig that holds them
        for f in OPTIM_FIELDS:
            base = getattr(gcfg, f) if getattr(gcfg, f) is not None else getattr(cfg, f)
            values = {
                a: getattr(agent_cfg[a], f) if getattr(agent_cfg[a], f) is not None else base for a in members
            }
            optim[f] = _agreed(g, members, f, values, fix.replace("<setting>", f))
        group_trainable = gcfg.trainable if gcfg.trainable is not None else cfg.trainable
        trainable = _agreed(
            g,
            members,
            "trainable",
            {a: group_trainable if (t := agent_cfg[a].trainable) is None else t for a in members},
            f"A model group is trained as a whole: set model_groups.{g}.trainable, or give the frozen agents "
            "their own group (model_sharing: per_agent).",
        )
        kind = gcfg.backend or cfg.backend
        where = f"model_groups.{g}.backend_options"
        options = backend_options(
            kind, {**(cfg.backend_options if kind == cfg.backend else {}), **gcfg.backend_options}, where
        )
        if trainable and not backend_kind(kind).can_train:
            raise ConfigError(
                f"model group {g!r} uses backend {kind!r}, which only samples (its weights cannot be updated): set "
                f"model_groups.{g}.trainable: false (or agents.<agent>.trainable: false for its agents)"
            )
        if gcfg.lora is not None and not trainable:
            raise ConfigError(
                f"model_groups.{g}.lora is set but the group is frozen (trainable: false), so no adapter would "
                f"be trained; drop the lora settings of {g!r}, or make it trainable"
            )
        group_lora = _group_lora(cfg, gcfg, trainable, shared_lora)
        if isinstance(options, _LoraServerOptions):  # the SGLang kinds: LoRA server args vs lora
            try:
                options.lora_server_args(group_lora, g)
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from None
        num_ranks = gcfg.num_ranks if gcfg.num_ranks is not None else (cfg.num_ranks if trainable else 1)
        _check_sharded(cfg, g, num_ranks, trainable, group_lora, {**cfg.grpo, **gcfg.grpo})
        if gcfg.rank_gpu_ids and len(gcfg.rank_gpu_ids) != num_ranks:
            raise ConfigError(
                f"model_groups.{g}.rank_gpu_ids lists {len(gcfg.rank_gpu_ids)} GPUs for num_ranks = {num_ranks}; "
                "give one GPU per rank"
            )
        groups[g] = ResolvedModelGroup(
            name=g,
            model=model,
            agents=members,
            backend=kind,
            backend_options=options,
            dtype=gcfg.dtype or cfg.dtype,
            grpo={**cfg.grpo, **gcfg.grpo},
            num_cpus=gcfg.num_cpus,
            num_gpus=gcfg.num_gpus,
            micro_batch_size=gcfg.micro_batch_size or cfg.micro_batch_size,
            trainable=trainable,
            lora=group_lora,
            base_group=groups_in_order[0] if shared_lora else None,
            num_ranks=num_ranks,
            sharding=gcfg.sharding or cfg.sharding,
            rank_gpu_ids=tuple(gcfg.rank_gpu_ids),
            **optim,
        )
    if cfg.lora is not None and not any(g.trainable for g in groups.values()):
        raise ConfigError(
            "lora is set but every model group is frozen (trainable: false), so no adapter would be trained; "
            "drop the lora settings, or make a group trainable"
        )
    if shared_lora:
        if cfg.pool == "ray":
            raise ConfigError(
                "model_sharing: shared_lora keeps one base model in one process for every agent's adapter, but "
                "pool: ray puts each model group in its own actor; use pool: local, or model_sharing: per_agent "
                "with a lora section per group (one base copy per actor)"
            )
        distinct = {g.name: g.model for g in groups.values()}
        if len(set(distinct.values())) > 1:
            raise ConfigError(
                f"model_sharing: shared_lora puts every agent's adapter on one base model, but the groups name "
                f"different models: {distinct}. Use one model, or model_sharing: per_agent."
            )
    agents = {
        a: ResolvedAgent(
            name=a,
            model_group=mapping[a],
            sampling=agent_cfg[a].sampling or cfg.sampling,
            reward_weights=agent_cfg[a].reward_weights or RewardWeights(),
        )
        for a in agent_names
    }
    return ResolvedConfig(
        config=cfg, agents=agents, model_groups=groups, run_name=cfg.run_name or cfg.default_run_name()
    )

"""Rollout collection: G copies of each task stepped in lock-step, one backend call per model group per tick.

The collector is the only place where text meets token ids. For every pending agent turn it renders the env's
chat messages with the chat template of that agent's model group, sends the token ids to the group's
generation backend, decodes the completion for the env, and records a :class:`Sample` holding the ids and
sampling logprobs *exactly as the backend returned them*: training never re-tokenises text (decoding and
re-encoding a completion does not give back the sampled ids, and the loss must score the ids that were sampled).

A :class:`Sample` is complete and immutable when it is created: a turn's ids, logprobs and validity are kept in
a small per-episode record (:mod:`mas_train.live_episode`) while the episode runs, and the samples are built once
the episode's reward is known. Seats a league opponent plays (:mod:`mas_train.league`; ``collect(opponents=...)``)
are stepped with the opponent's batched actions and give no sample.

Batching: at every tick, each live env has exactly one pending turn (``env.agent_selection``). All pending turns
of all envs are grouped by model group, so one tick costs one ``generate`` call per model group however many
envs and agents there are (Dr. MAS reference: ``MultiAgentTrajectoryCollector.vanilla_multi_turn_loop``, which
batches one agent role at a time across the whole batch). Model groups whose generators report the same
``mixed_batch_key`` (LoRA adapters on one shared base model with one HF backend, ``model_sharing:
shared_lora`` on CPU) go further: their turns of a tick form **one** ``generate_mixed`` call in which each row
uses its own group's adapter; each row's seed, sampling settings, stop strings, token ids and logprobs are
those of the per-group call. Generators without a key (other backends, private backend copies, chat
endpoints) keep one call per group.

Prompt length rule: a rendered prompt longer than ``max_prompt_length`` tokens is **not** truncated (cutting
either end of a chat prompt drops the system prompt or the question and trains on a prompt the env never
produced). Instead the turn is skipped: the env is stepped with the empty action ``""`` (which every env treats
as a malformed action, so it is penalised like any invalid action and the episode goes on), no training sample
is recorded for it (the policy generated nothing), and the skip is counted in ``RolloutBatch.prompt_overflows``
(logged as ``charts/prompt_overflow``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mas_envs.core import EnvFactory, TextAECEnv, text_env
from mas_envs.games.moves import format_move
from mas_train.backends.base import (
    ChatBackend,
    GenerationOutput,
    Generator,
    LogprobScorer,
    MixedBatchGenerator,
    SamplingParams,
)
from mas_train.live_episode import LiveEpisode, Turn
from mas_train.move_choice import choose_moves
from mas_train.opponents import Opponent, OpponentTurn
from mas_train.prompts import render_prompt, request_seed
from mas_train.samples import RolloutBatch, Sample

if TYPE_CHECKING:
    from pettingzoo import AECEnv
    from transformers import PreTrainedTokenizerBase

__all__ = ["RolloutCollector", "Sample", "render_prompt", "request_seed"]


def _wants_messages(gen: Generator) -> bool:
    return isinstance(gen, ChatBackend) and bool(gen.wants_messages)


class RolloutCollector:
    """Steps ``num_generations`` copies of each task in lock-step and batches generation per model group.

    Args:
        env_factory: zero-argument callable returning a fresh env that follows the design.md §1 contract
            (``mas_envs.make(...)``). Envs are created lazily and reused across :meth:`collect` calls.
        generators: model group name → object with the backend ``generate`` signature.
        tokenizers: model group name → tokenizer whose chat template renders that group's prompts and which
            decodes its completions.
        agent_groups: agent name → model group name. Every agent the env can select must be present.
        sampling: agent name → :class:`SamplingParams` used for that agent's turns. The env's stop strings
            for the agent are added to ``stop``; ``seed`` is replaced by a per-request seed.
        max_prompt_length: prompt token cap; longer prompts follow the module's prompt length rule.
            ``None`` disables the cap.
        max_ticks: safety bound on lock-step ticks per :meth:`collect`; an env that neither terminates nor
            truncates within it raises ``RuntimeError`` rather than looping forever.
        seed: base seed for env resets and per-request sampling seeds.
        mix_adapters: batch the turns of groups that share a ``mixed_batch_key`` into one
            ``generate_mixed`` call per tick (see the module docstring); ``False``: one call per group.
        legal_moves_only: a game's moves are chosen among the legal move texts (``<move>LABEL</move>`` and the
            tokenizer's EOS) instead of sampled freely: each candidate is scored by the group's model
            (``score``, temperature 1) and one is drawn with probability ∝ exp(log p / T) (T = 0: the likeliest);
            the sample's ids are the candidate's and its logprobs the scored ones. No move is then illegal, and
            the policy played is the one Kuhn poker's exact evaluation reads. Turns whose env lists no
            ``legal_moves`` are sampled as usual.

    Raises:
        ValueError: when an agent maps to a model group without a generator or tokenizer.
    """

    def __init__(
        self,
        env_factory: EnvFactory,
        generators: Mapping[str, Generator],
        tokenizers: Mapping[str, PreTrainedTokenizerBase],
        agent_groups: Mapping[str, str],
        sampling: Mapping[str, SamplingParams],
        *,
        max_prompt_length: int | None = None,
        max_ticks: int = 256,
        seed: int = 0,
        mix_adapters: bool = True,
        legal_moves_only: bool = False,
    ) -> None:
        for agent, group in agent_groups.items():
            if group not in generators or group not in tokenizers:
                raise ValueError(
                    f"agent {agent!r} maps to model group {group!r}, which has no generator/tokenizer; "
                    f"known groups: {sorted(generators)}"
                )
        self.env_factory = env_factory
        self.generators = dict(generators)
        self.tokenizers = dict(tokenizers)
        self.agent_groups = dict(agent_groups)
        self.sampling = dict(sampling)
        self.max_prompt_length = max_prompt_length
        self.max_ticks = max_ticks
        self.seed = seed
        self.mix_adapters = bool(mix_adapters)
        self.legal_moves_only = bool(legal_moves_only)
        self._envs: list[AECEnv[str, str, str]] = []

    def _env(self, i: int) -> AECEnv[str, str, str]:
        while len(self._envs) <= i:
            self._envs.append(self.env_factory())
        return self._envs[i]

    def text_env(self) -> TextAECEnv:
        """The first env (made now if none exists), unwrapped: for env hooks beyond the AEC API."""
        return text_env(self._env(0))

    def close(self) -> None:
        """Close every env the collector created."""
        for env in self._envs:
            env.close()
        self._envs.clear()

    def _sampling_for(
        self,
        env: AECEnv[str, str, str],
        agent: str,
        override: SamplingParams | Mapping[str, SamplingParams] | None,
        seed: int,
    ) -> SamplingParams:
        if isinstance(override, Mapping):
            override = override.get(agent)
        base = override if override is not None else self.sampling.get(agent, SamplingParams())
        env_stops = tuple(text_env(env).stop_strings.get(agent, ()))
        stops = tuple(dict.fromkeys(env_stops + tuple(base.stop)))  # ordered de-dup
        return dataclasses.replace(base, stop=stops, seed=seed)

    def _call_units(self, groups: Sequence[str]) -> list[tuple[str, ...]]:
        """The tick's groups split into calls: groups sharing a ``mixed_batch_key`` together, others alone."""
        units: dict[Any, list[str]] = {}
        for g in groups:
            gen = self.generators[g]
            key = None
            if self.mix_adapters and isinstance(gen, MixedBatchGenerator) and not _wants_messages(gen):
                key = gen.mixed_batch_key
            units.setdefault(("mixed", key) if key is not None else ("alone", g), []).append(g)
        return [tuple(u) for u in units.values()]

    def _choose(
        self, group: str, picks: Sequence[tuple[int, Turn, SamplingParams, list[str]]]
    ) -> list[tuple[str, GenerationOutput]]:
        gen = self.generators[group]
        if not isinstance(gen, LogprobScorer) or not gen.can_score:
            raise TypeError(
                f"legal_moves_only needs a backend that scores completions; group {group!r} has none"
            )
        return choose_moves(
            gen.score,
            self.tokenizers[group],
            [p.prompt_ids for _, p, _, _ in picks],
            [legal for _, _, _, legal in picks],
            [sp for _, _, sp, _ in picks],
            version=int(getattr(gen, "weight_version", 0)),
        )

    def collect(
        self,
        tasks: Sequence[Mapping[str, object]],
        num_generations: int,
        *,
        step: int = 0,
        sampling_override: SamplingParams | Mapping[str, SamplingParams] | None = None,
        uid_prefix: str = "",
        opponents: Callable[[int], Mapping[str, Opponent]] | None = None,
        seed_ids: Sequence[tuple[int, int]] | None = None,
    ) -> RolloutBatch:
        """Run ``num_generations`` episodes of every task in lock-step.

        Args:
            tasks: task rows (design.md §1: ``question``, ``answer``/``golden_answers``, ``data_source``,
                optional ``id``), each passed as ``env.reset(options={"task": row})``.
            num_generations: G, copies per task (the task group).
            step: training step, mixed into env and sampling seeds (so every step samples afresh and a
                resumed run reproduces the same seeds).
            sampling_override: sampling for every agent, or per agent (a mapping; agents it leaves out keep
                their own), e.g. for evaluation; each env's stop strings are kept.
            uid_prefix: prefix of ``task_uid``/``traj_uid`` (e.g. ``"s12/"``) to keep ids unique across steps.
            opponents: task index → seat → the :class:`~mas_train.league.Opponent` playing that seat in all G
                episodes of the task (a league's draw); their turns are played by it and give no sample.
                ``None`` or an empty mapping: every seat is the run's own model.
            seed_ids: per episode (task-major, ``len(tasks) * num_generations`` of them), the ``(step, index)``
                pair mixed into its env and sampling seeds in place of ``(step, its index in this call)``; lets a
                caller that splits one task set into calls give each episode the same seeds under any split
                (:func:`mas_train.eval.eval_seed_ids`). ``None``: ``(step, index in this call)``.

        Returns:
            A :class:`RolloutBatch`.

        Raises:
            ValueError: ``num_generations < 1``, or ``seed_ids`` of another length than the episodes.
            RuntimeError: when an env is still running after ``max_ticks`` ticks.
        """
        if num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {num_generations}")
        n_episodes = len(tasks) * num_generations
        if seed_ids is not None and len(seed_ids) != n_episodes:
            raise ValueError(f"seed_ids has {len(seed_ids)} entries for {n_episodes} episodes (tasks × G)")
        keys = list(seed_ids) if seed_ids is not None else [(step, i) for i in range(n_episodes)]
        t_env = 0.0
        t_gen = 0.0
        t0 = time.perf_counter()
        episodes: list[LiveEpisode] = []
        for t_idx, row in enumerate(tasks):
            tid = str(row.get("id", t_idx))
            seats = opponents(t_idx) if opponents is not None else {}
            for g in range(num_generations):
                i = t_idx * num_generations + g
                env = self._env(i)
                env.reset(seed=request_seed(self.seed, "reset", *keys[i]), options={"task": dict(row)})
                episodes.append(
                    LiveEpisode(
                        env,
                        task_uid=f"{uid_prefix}{t_idx}:{tid}",
                        traj_uid=f"{uid_prefix}{t_idx}:{tid}/{g}",
                        data_source=str(row.get("data_source", "unknown")),
                        task=row,
                        opponents=seats,
                    )
                )
        t_env += time.perf_counter() - t0

        overflows: dict[str, int] = defaultdict(int)
        calls: dict[str, int] = defaultdict(int)
        ticks = 0
        while any(e.live for e in episodes):
            if ticks >= self.max_ticks:
                raise RuntimeError(
                    f"rollout still running after max_ticks={self.max_ticks} ticks; the env must terminate or "
                    "truncate its episodes (check its max-turn setting) or raise max_ticks"
                )
            ticks += 1
            t0 = time.perf_counter()
            # requests[group] = list of (episode index, pending turn, sampling)
            requests: dict[str, list[tuple[int, Turn, SamplingParams]]] = defaultdict(list)
            # turns chosen among the legal moves: group -> [(episode index, turn, sampling, legal labels)]
            choices: dict[str, list[tuple[int, Turn, SamplingParams, list[str]]]] = defaultdict(list)
            # an opponent's turns: {id(opponent): (opponent, [(episode index, turn)])}
            foes: dict[int, tuple[Opponent, list[tuple[int, OpponentTurn]]]] = {}
            for i, ep in enumerate(episodes):
                if not ep.live:
                    continue
                agent = ep.env.agent_selection
                info = ep.env.infos[agent]
                foe = ep.opponents.get(agent)
                if foe is not None:
                    at = int(info.get("turn", ep.turn_counts[agent]))
                    sp = self._sampling_for(
                        ep.env, agent, sampling_override, request_seed(self.seed, *keys[i], at)
                    )
                    pending_foe = OpponentTurn(ep.env, agent, info["messages"], sp)
                    foes.setdefault(id(foe), (foe, []))[1].append((i, pending_foe))
                    continue
                group = self.agent_groups.get(agent)
                if group is None:
                    raise KeyError(
                        f"env selected agent {agent!r}, which has no model group; configured agents: "
                        f"{sorted(self.agent_groups)}"
                    )
                prompt = render_prompt(self.tokenizers[group], info["messages"])
                turn = int(info.get("turn", ep.turn_counts[agent]))
                if self.max_prompt_length is not None and len(prompt) > self.max_prompt_length:
                    overflows[agent] += 1
                    ep.step(agent, "", None, info["messages"], turn)
                    continue
                sp = self._sampling_for(
                    ep.env, agent, sampling_override, request_seed(self.seed, *keys[i], turn)
                )
                pending = Turn(agent=agent, model_group=group, turn=turn, prompt_ids=prompt)
                if self.legal_moves_only and info.get("legal_moves"):
                    choices[group].append((i, pending, sp, list(info["legal_moves"])))
                    continue
                requests[group].append((i, pending, sp))
            t_env += time.perf_counter() - t0

            for unit in self._call_units(list(requests)):
                t0 = time.perf_counter()
                reqs = [r for g in unit for r in requests[g]]
                gen = self.generators[unit[0]]
                if len(unit) > 1:
                    # one call for several groups on one base model: each row with its own group's adapter
                    owners = [self.generators[p.model_group] for _, p, _ in reqs]
                    assert isinstance(gen, MixedBatchGenerator)  # a unit of several groups shares a key
                    outs = gen.generate_mixed([r[1].prompt_ids for r in reqs], [r[2] for r in reqs], owners)
                elif isinstance(gen, ChatBackend) and gen.wants_messages:
                    # a chat endpoint (the openai backend) applies its own template to the env's messages
                    convs = [episodes[i].env.infos[p.agent]["messages"] for i, p, _ in reqs]
                    outs = gen.generate_messages(convs, [r[2] for r in reqs])
                else:
                    outs = gen.generate([r[1].prompt_ids for r in reqs], [r[2] for r in reqs])
                t_gen += time.perf_counter() - t0
                name = "+".join(unit)
                calls[name] += 1
                if len(outs) != len(reqs):
                    raise RuntimeError(
                        f"backend of group {name!r} returned {len(outs)} outputs for {len(reqs)}"
                    )
                t0 = time.perf_counter()
                for (i, pending, _sp), out in zip(reqs, outs, strict=True):
                    tok = self.tokenizers[pending.model_group]
                    pending.output = out
                    # a backend that received text back (openai) gives it exactly: local ids may not decode to it
                    text = (out.meta or {}).get("env_text")
                    if text is None:
                        text = tok.decode(out.completion_ids, skip_special_tokens=True)
                    messages = episodes[i].env.infos[pending.agent]["messages"]
                    episodes[i].step(pending.agent, text, pending, messages, pending.turn)
                t_env += time.perf_counter() - t0
            for group, picks in choices.items():
                t0 = time.perf_counter()
                chosen = self._choose(group, picks)
                t_gen += time.perf_counter() - t0
                calls[f"{group}/choice"] += 1
                for (i, pending, _sp, _legal), (label, out) in zip(picks, chosen, strict=True):
                    pending.output = out
                    messages = episodes[i].env.infos[pending.agent]["messages"]
                    episodes[i].step(pending.agent, format_move(label), pending, messages, pending.turn)
            for foe, turns in foes.values():
                t0 = time.perf_counter()
                texts = foe.play([t for _, t in turns])
                t_gen += time.perf_counter() - t0
                for (i, t), text in zip(turns, texts, strict=True):
                    ep = episodes[i]
                    at = int(ep.env.infos[t.agent].get("turn", ep.turn_counts[t.agent]))
                    ep.step(t.agent, text, None, t.messages, at, played_by=foe.name)

        return RolloutBatch(
            samples=[s for ep in episodes for s in ep.samples()],
            trajectories=[ep.trajectory() for ep in episodes],
            prompt_overflows=dict(overflows),
            generate_calls=dict(calls),
            ticks=ticks,
            generate_seconds=t_gen,
            env_seconds=t_env,
            texts=[ep.text() for ep in episodes],
        )

"""Rollout collection: G copies of each task stepped in lock-step, one backend call per model group per tick.

The collector is the only place where text meets token ids. For every pending agent turn it renders the env's
chat messages with the chat template of that agent's model group, sends the token ids to the group's
generation backend, decodes the completion for the env, and records a :class:`Sample` holding the ids and
sampling logprobs *exactly as the backend returned them*: training never re-tokenises text (decoding and
re-encoding a completion does not give back the sampled ids, and the loss must score the ids that were sampled).

A :class:`Sample` is complete and immutable when it is created: a turn's ids, logprobs and validity are kept in
a small per-episode record while the episode runs, and the samples are built once the episode's reward is known.

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
import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mas_envs.core import EnvFactory, TextAECEnv, TranscriptEntry, text_env
from mas_train.backends.base import (
    ChatBackend,
    GenerationOutput,
    Generator,
    MixedBatchGenerator,
    SamplingParams,
)
from mas_train.episodes import EpisodeText, TextEvent
from mas_train.samples import RolloutBatch, Sample, Trajectory

if TYPE_CHECKING:
    from pettingzoo import AECEnv
    from transformers import PreTrainedTokenizerBase


@dataclass
class _Turn:
    """A generated turn while its episode runs (becomes a :class:`Sample` at the episode's end)."""

    agent: str
    model_group: str
    turn: int
    prompt_ids: list[int]
    output: GenerationOutput | None = None  # set when the backend answers
    invalid: bool = False
    answer: str | None = None  # the env's parsed answer of the turn (infos[agent]["parsed_answer"])


class _Episode:
    """One env copy during :meth:`RolloutCollector.collect`: its ids, turns so far and, at the end, outcome."""

    def __init__(
        self,
        env: AECEnv[str, str, str],
        task_uid: str,
        traj_uid: str,
        data_source: str,
        task: Mapping[str, Any],
    ) -> None:
        self.env = env
        self.task_uid = task_uid
        self.traj_uid = traj_uid
        self.data_source = data_source
        self.task = task
        self.said: list[TextEvent] = []  # the agents' actions, in order
        self.transcript: list[TranscriptEntry] = []  # the env's own transcript at the end
        self.turns: list[_Turn] = []
        self.turn_counts: dict[str, int] = defaultdict(int)
        self.live = True
        self.team_reward = 0.0
        self.success = False
        self.metrics: dict[str, float] = {}
        self.role_rewards: dict[int, float] = {}
        self.agent_rewards: dict[str, float] = {}  # each agent's outcome reward (R for all in a team env)

    def step(self, agent: str, action: str, turn: _Turn | None, messages: Any = None, at: int = 0) -> None:
        """Apply ``agent``'s action; record ``turn`` (``None`` for a skipped turn) and what was said (the
        prompt ``messages`` of turn ``at``); finish the episode when every agent is done."""
        env = self.env
        env.step(action)
        self.turn_counts[agent] += 1
        info = env.infos.get(agent, {})
        invalid = bool(info.get("invalid_action", False))
        self.said.append(TextEvent(agent, at, action, invalid, messages, skipped=turn is None))
        if turn is not None:
            turn.invalid = invalid
            turn.answer = None if info.get("parsed_answer") is None else str(info["parsed_answer"])
            self.turns.append(turn)
        # Episode end: every remaining agent is done. Read the outcome now: the dead steps below remove the
        # agents and with them their infos.
        if all(env.terminations[a] or env.truncations[a] for a in env.agents):
            end_info = next((env.infos[a] for a in env.agents if "team_reward" in env.infos[a]), info)
            self.team_reward = float(end_info.get("team_reward", 0.0))
            self.success = bool(end_info.get("success", False))
            self.metrics = {str(k): float(v) for k, v in end_info.get("episode_metrics", {}).items()}
            self.transcript = list(text_env(env).transcript)
            self.role_rewards = {int(k): float(v) for k, v in end_info.get("role_rewards", {}).items()}
            # A game's seats each get their own return (``per_agent_rewards``; the team reward is their mean,
            # 0 in a zero-sum game): every turn is scored with its own agent's outcome reward.
            self.agent_rewards = {str(k): float(v) for k, v in end_info.get("agent_rewards", {}).items()}
            while env.agents:
                env.step(None)  # PettingZoo dead steps
            self.live = False
            return
        # A done agent still selected must be dead-stepped before the next live agent can act.
        guard = 0
        while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
            env.step(None)
            guard += 1
            if guard > 10_000:
                raise RuntimeError("env keeps selecting done agents; it violates the AEC contract")

    def samples(self) -> list[Sample]:
        return [self._sample(t) for t in self.turns]

    def _sample(self, t: _Turn) -> Sample:
        out = t.output
        assert out is not None, "a recorded turn always has its output"
        return Sample(
            task_uid=self.task_uid,
            traj_uid=self.traj_uid,
            agent=t.agent,
            model_group=t.model_group,
            turn=t.turn,
            prompt_ids=t.prompt_ids,
            completion_ids=list(out.completion_ids),
            sampling_logprobs=list(out.logprobs),
            invalid=t.invalid,
            team_reward=self.agent_rewards.get(t.agent, self.team_reward),
            success=self.success,
            weight_version=int(out.weight_version),
            finish_reason=str(out.finish_reason),
            data_source=self.data_source,
            role_reward=self.role_rewards.get(t.turn),
            answer=t.answer,
        )

    def text(self) -> EpisodeText:
        if not self.transcript:
            return EpisodeText(self.traj_uid, self.task, tuple(self.said))
        # The env's transcript has one row per live step, in order: its agent rows are our actions (which
        # carry the prompt), its "env" rows the env's messages between them.
        actions = iter(self.said)
        found = [
            TextEvent("env", int(e.turn), str(e.text)) if e.speaker == "env" else next(actions, None)
            for e in self.transcript
        ]
        events = [e for e in found if e is not None] + list(actions)
        return EpisodeText(self.traj_uid, self.task, tuple(events))

    def trajectory(self) -> Trajectory:
        return Trajectory(
            task_uid=self.task_uid,
            traj_uid=self.traj_uid,
            data_source=self.data_source,
            team_reward=self.team_reward,
            success=self.success,
            num_turns=sum(self.turn_counts.values()),
            turns_per_agent=dict(self.turn_counts),
            metrics=self.metrics,
        )


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Render chat ``messages`` with ``tokenizer``'s chat template into prompt token ids.

    ``add_generation_prompt=True`` opens the assistant turn. ``enable_thinking=False`` is passed to every
    template: Qwen3-style templates then emit an empty think block (as the Dr. MAS math recipe runs), and
    templates that do not read the variable ignore it.

    Returns:
        ``list[int]`` prompt ids (special tokens exactly as the template writes them; none added).

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template; the collector "
            "renders env messages with it. Use an instruct/chat model or set tokenizer.chat_template."
        )
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, enable_thinking=False
    )
    # Some tokenizers return a BatchEncoding / nested list even with return_dict=False.
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(t) for t in ids]


def _wants_messages(gen: Generator) -> bool:
    return isinstance(gen, ChatBackend) and bool(gen.wants_messages)


def request_seed(base_seed: int, *parts: object) -> int:
    """A stable 31-bit seed from ``base_seed`` and identifying parts (step, env index, turn, ...).

    ``hash()`` is salted per process, so CRC32 of the parts' text is used to keep runs and resumes reproducible.
    """
    key = ":".join(str(p) for p in (base_seed, *parts)).encode()
    return zlib.crc32(key) & 0x7FFFFFFF


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

    def collect(
        self,
        tasks: Sequence[Mapping[str, object]],
        num_generations: int,
        *,
        step: int = 0,
        sampling_override: SamplingParams | Mapping[str, SamplingParams] | None = None,
        uid_prefix: str = "",
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

        Returns:
            A :class:`RolloutBatch`.

        Raises:
            RuntimeError: when an env is still running after ``max_ticks`` ticks.
        """
        if num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {num_generations}")
        t_env = 0.0
        t_gen = 0.0
        t0 = time.perf_counter()
        episodes: list[_Episode] = []
        for t_idx, row in enumerate(tasks):
            tid = str(row.get("id", t_idx))
            for g in range(num_generations):
                i = t_idx * num_generations + g
                env = self._env(i)
                env.reset(seed=request_seed(self.seed, "reset", step, i), options={"task": dict(row)})
                episodes.append(
                    _Episode(
                        env,
                        task_uid=f"{uid_prefix}{t_idx}:{tid}",
                        traj_uid=f"{uid_prefix}{t_idx}:{tid}/{g}",
                        data_source=str(row.get("data_source", "unknown")),
                        task=row,
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
            requests: dict[str, list[tuple[int, _Turn, SamplingParams]]] = defaultdict(list)
            for i, ep in enumerate(episodes):
                if not ep.live:
                    continue
                agent = ep.env.agent_selection
                info = ep.env.infos[agent]
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
                    ep.env, agent, sampling_override, request_seed(self.seed, step, i, turn)
                )
                pending = _Turn(agent=agent, model_group=group, turn=turn, prompt_ids=prompt)
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

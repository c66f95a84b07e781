"""One env copy while :class:`~mas_train.rollout.RolloutCollector` steps it: its pending and finished turns, what
was said, and at the end its outcome, samples, trajectory and text.

A :class:`~mas_train.samples.Sample` is complete and immutable when it is created: a turn's ids, logprobs and
validity are kept in a :class:`Turn` while the episode runs, and the samples are built once the episode's reward
is known. A seat a league opponent plays (:mod:`mas_train.league`) is stepped with the opponent's action and gives
no sample.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mas_envs.core import TranscriptEntry, text_env
from mas_train.backends.base import GenerationOutput
from mas_train.episodes import EpisodeText, TextEvent
from mas_train.samples import Sample, Trajectory

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from mas_train.opponents import Opponent

__all__ = ["LiveEpisode", "Turn"]


@dataclass
class Turn:
    """A generated turn while its episode runs (becomes a :class:`Sample` at the episode's end)."""

    agent: str
    model_group: str
    turn: int
    prompt_ids: list[int]
    output: GenerationOutput | None = None  # set when the backend answers
    invalid: bool = False
    answer: str | None = None  # the env's parsed answer of the turn (infos[agent]["parsed_answer"])


class LiveEpisode:
    """One env copy during :meth:`~mas_train.rollout.RolloutCollector.collect`: its ids, turns so far and, at the end, outcome."""

    def __init__(
        self,
        env: AECEnv[str, str, str],
        task_uid: str,
        traj_uid: str,
        data_source: str,
        task: Mapping[str, Any],
        opponents: Mapping[str, Opponent] | None = None,
    ) -> None:
        self.env = env
        self.opponents = dict(opponents or {})  # seat -> the league opponent playing it (mas_train.league)
        self.task_uid = task_uid
        self.traj_uid = traj_uid
        self.data_source = data_source
        self.task = task
        self.said: list[TextEvent] = []  # the agents' actions, in order
        self.transcript: list[TranscriptEntry] = []  # the env's own transcript at the end
        self.turns: list[Turn] = []
        self.turn_counts: dict[str, int] = defaultdict(int)
        self.live = True
        self.team_reward = 0.0
        self.success = False
        self.metrics: dict[str, float] = {}
        self.role_rewards: dict[int, float] = {}
        self.agent_rewards: dict[str, float] = {}  # each agent's outcome reward (R for all in a team env)

    def step(
        self,
        agent: str,
        action: str,
        turn: Turn | None,
        messages: Any = None,
        at: int = 0,
        played_by: str | None = None,
    ) -> None:
        """Apply ``agent``'s action; record ``turn`` (``None`` for a skipped turn or an opponent's) and what was
        said (the prompt ``messages`` of turn ``at``; ``played_by``: the league opponent that chose it); finish
        the episode when every agent is done."""
        env = self.env
        env.step(action)
        self.turn_counts[agent] += 1
        info = env.infos.get(agent, {})
        invalid = bool(info.get("invalid_action", False))
        skipped = turn is None and played_by is None
        self.said.append(
            TextEvent(agent, at, action, invalid, messages, skipped=skipped, played_by=played_by)
        )
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
            # 0 in a zero-sum game): every turn is scored with its own agent's outcome reward. A team env's infos
            # give R for every agent; kept empty here (Trajectory.agent_rewards), so that "has returns" means a game.
            if text_env(env).per_agent_rewards:
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

    def _sample(self, t: Turn) -> Sample:
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
            agent_rewards=dict(self.agent_rewards),
            opponents={a: o.name for a, o in self.opponents.items()},
        )

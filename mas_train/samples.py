"""The records a rollout produces: one :class:`Sample` per agent turn, one :class:`Trajectory` per episode, and
the :class:`RolloutBatch` of a collection (:mod:`mas_train.rollout` builds them; the advantage rule, the update and
the metrics read them). Token ids are kept end to end; a record is complete and immutable when it is created."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mas_train.episodes import EpisodeText

__all__ = ["RolloutBatch", "Sample", "Trajectory", "merge_duplicates"]


@dataclass(frozen=True)
class Sample:
    """One agent turn, the unit the advantage and the loss are computed on (design.md §4).

    Attributes:
        task_uid: id of the task group (the G trajectories of one task in one step share it).
        traj_uid: id of the trajectory (unique within a step).
        agent: the PettingZoo agent name that acted (e.g. ``"solver"``).
        model_group: the model group whose policy generated the completion.
        turn: 0-based turn index within the episode (global across agents, ``infos[agent]["turn"]``).
        prompt_ids: rendered prompt token ids, ``list[int]`` of length P.
        completion_ids: generated token ids, ``list[int]`` of length T (EOS kept when generated).
        sampling_logprobs: sampling logprob of each completion token, ``list[float]`` of length T.
        invalid: whether the env judged the action malformed (``infos[agent]["invalid_action"]``).
        team_reward: the outcome reward R of the turn's agent (no penalties): the episode's team reward,
            broadcast to every turn of the trajectory, in a cooperative env; the agent's own return
            (``infos[agent]["agent_rewards"]``) in an env with ``per_agent_rewards``, such as a zero-sum game.
        success: whether the episode solved its task.
        weight_version: the backend weight version that produced the completion.
        finish_reason: ``"stop"`` or ``"length"``.
        data_source: the task's ``data_source`` (for per-source avg@k/pass@k).
        role_reward: the env's role score of this turn (``infos[agent]["role_rewards"][turn]`` at the episode's
            end, ``Outcome.role_rewards``), ``None`` when the env gives the turn none.
        answer: the env's parsed answer of the turn (``infos[agent]["parsed_answer"]`` after it, from
            ``Transition.answer``; e.g. a math solver's normalised ``\\boxed{}`` content), ``None`` when the turn
            gives none or the env reports none. Read only by the diversity metrics.
    """

    task_uid: str
    traj_uid: str
    agent: str
    model_group: str
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    sampling_logprobs: list[float]
    invalid: bool
    team_reward: float
    success: bool
    weight_version: int
    finish_reason: str
    data_source: str
    role_reward: float | None = None
    answer: str | None = None

    def score(
        self, invalid_action_penalty: float, team_weight: float = 1.0, role_weight: float = 0.0
    ) -> float:
        """The turn's score ``s = w_team * R + w_role * role_reward - c * invalid`` (docs/design.md §1).

        With the default weights (team 1, role 0) it is ``R - c * invalid`` bit for bit, as the Dr. MAS
        reference scores turns: ``1.0 * R`` is exact and a zero role weight adds nothing, so the role score is
        not even read (a role score where the weight is 0 changes nothing). A turn without a role score counts
        0 for the role term.
        """
        s = self.team_reward if team_weight == 1.0 else team_weight * self.team_reward
        if role_weight != 0.0:
            s = s + role_weight * (0.0 if self.role_reward is None else self.role_reward)
        return s - invalid_action_penalty * float(self.invalid)


@dataclass(frozen=True)
class Trajectory:
    """Per-episode summary (one per env copy), for reward/success/turn metrics and avg@k/pass@k.

    ``metrics`` are the env's per-episode metrics (``infos[agent]["episode_metrics"]``, from
    ``Outcome.metrics``), empty for envs that report none. ``agent_rewards``: each seat's own return in a game
    (``per_agent_rewards`` envs; empty otherwise); ``opponents``: seat → the league opponent that played it
    (:mod:`mas_train.league`; empty: every seat was the run's own model).
    """

    task_uid: str
    traj_uid: str
    data_source: str
    team_reward: float
    success: bool
    num_turns: int
    turns_per_agent: dict[str, int]
    metrics: dict[str, float] = field(default_factory=dict)
    agent_rewards: dict[str, float] = field(default_factory=dict)
    opponents: dict[str, str] = field(default_factory=dict)


@dataclass
class RolloutBatch:
    """What one :meth:`RolloutCollector.collect` call produced.

    Attributes:
        samples: one :class:`Sample` per generated agent turn, in (tick, env) order.
        trajectories: one :class:`Trajectory` per env copy, in task-major order (task 0's G copies first).
        prompt_overflows: turns skipped because the prompt exceeded ``max_prompt_length`` (per agent).
        generate_calls: number of backend ``generate`` calls made, per model group; a call shared by several
            groups (``generate_mixed``) counts under their names joined by ``+`` (e.g. ``"solver+verifier"``).
        ticks: number of lock-step ticks.
        generate_seconds: wall time spent inside backend ``generate`` calls.
        env_seconds: wall time spent in env ``reset``/``step`` and chat-template rendering.
        texts: one :class:`~mas_train.episodes.EpisodeText` per env copy, in the order of ``trajectories`` (what was said).
    """

    samples: list[Sample]
    trajectories: list[Trajectory]
    prompt_overflows: dict[str, int] = field(default_factory=dict)
    generate_calls: dict[str, int] = field(default_factory=dict)
    ticks: int = 0
    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    texts: list[EpisodeText] = field(default_factory=list)


def merge_duplicates(
    samples: Sequence[Sample], advantages: Sequence[float], masked: Callable[[Sample], bool]
) -> tuple[list[Sample], list[float]]:
    """One row per distinct (agent, prompt ids, completion ids, masked) with the advantages of its copies summed.

    A loss that is linear in each row's advantage (``dapo``/``cispo`` at ``num_iterations == 1``, no KL,
    entropy term or sampler correction: :meth:`mas_train.grpo.update.GroupGRPOTrainer._merging_is_exact`)
    gives ``Σ_i A_i ∇ log π(c | p) = (Σ_i A_i) ∇ log π(c | p)`` for ``n`` copies of one sequence, so one forward
    of the sum is the same gradient as ``n`` forwards. Games revisit few states: Kuhn poker has 12 prompts and
    2 moves each, so a step's ~115 turns are at most 24 distinct rows. The first copy stands for the others
    (its ``traj_uid``, weight version and sampling logprobs).

    Args:
        samples, advantages: one float per sample.
        masked: whether a sample's completion is left out of the loss (its copies must agree).

    Returns:
        The distinct samples in first-seen order and their summed advantages.
    """
    first: dict[tuple[object, ...], int] = {}
    out: list[Sample] = []
    summed: list[float] = []
    for s, a in zip(samples, advantages, strict=True):
        key = (s.agent, tuple(s.prompt_ids), tuple(s.completion_ids), masked(s))
        if key in first:
            summed[first[key]] += float(a)
        else:
            first[key] = len(out)
            out.append(s)
            summed.append(float(a))
    return out, summed

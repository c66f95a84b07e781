"""Per-turn scores the advantages are computed from: the team reward, the agent's role score, the penalty.

A turn of agent k is scored ``s = w_team(k) * R + w_role(k) * role_reward - c * invalid`` (issue 24; MarsRL
rewards its verifier on whether its verdict is right, AT-GRPO mixes a global and a local reward the same way).
``R`` is the episode's team reward, ``role_reward`` the env's role score of the turn (``Outcome.role_rewards``;
0 where the env gives the turn none), ``c`` the env's invalid-action penalty, and the weights come from
``agents.<agent>.reward_weights`` (default team 1, role 0: the paper's ``s = R - c * invalid``, bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mas_train.config import RewardWeights
    from mas_train.samples import Sample, Trajectory

__all__ = ["advantage_columns", "turn_scores"]


def turn_scores(
    samples: Sequence[Sample], penalty: float, weights: Mapping[str, RewardWeights]
) -> list[float]:
    """One score per sample, in order.

    Args:
        samples: :class:`~mas_train.rollout.Sample` objects (``agent``, ``team_reward``, ``role_reward``,
            ``invalid``).
        penalty: the invalid-action penalty c (>= 0).
        weights: agent -> object with float ``team`` and ``role`` (:class:`~mas_train.config.RewardWeights`);
            an agent left out gets team 1, role 0.

    Returns:
        ``list[float]`` of length ``len(samples)``. With default weights each entry equals
        ``R - c * invalid`` exactly, and the role score is not read.
    """
    out = []
    for s in samples:
        w = weights.get(s.agent)
        out.append(s.score(penalty) if w is None else s.score(penalty, w.team, w.role))
    return out


def advantage_columns(
    samples: Sequence[Sample],
    trajectories: Sequence[Trajectory],
    penalty: float,
    weights: Mapping[str, RewardWeights],
) -> tuple[list[float], list[str], list[str], list[str]]:
    """The ``(scores, group_ids, traj_ids, agent_ids)`` columns :func:`mas_train.advantages.compute_advantages`
    reads, one entry per sample.

    In a game (a trajectory with ``agent_rewards``: each seat has its own return) each seat's turns of a
    trajectory get a trajectory id of their own, ``"<traj_uid>|<agent>"``: GRPO's trajectory score r_i (eq. 2)
    is then one seat's return and its μ, σ pool the seats' returns. Averaged over both seats' turns, r_i would be
    about 0 in a zero-sum game (no signal), and a seat that acts once would take the sign of the other seat's
    return in hands where that seat acts twice. A team env's trajectories stay whole (eq. 2 as written).
    """
    games = {t.traj_uid for t in trajectories if t.agent_rewards}
    return (
        turn_scores(samples, penalty, weights),
        [s.task_uid for s in samples],
        [f"{s.traj_uid}|{s.agent}" if s.traj_uid in games else s.traj_uid for s in samples],
        [s.agent for s in samples],
    )

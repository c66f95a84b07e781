r"""Lemma 4.2 of Dr. MAS (arXiv 2602.08847), checked numerically on a tiny multi-agent system.

The lemma: for agent k, whose turns :math:`Y_k` see team rewards with mean :math:`\mu_k` and std
:math:`\sigma_k`, the per-turn policy gradient under one global baseline, :math:`g = z \cdot (R - \mu)/\sigma`
with the score function :math:`z = \nabla_\theta \log \pi_\theta(a)`, has the second moment

.. math:: E_{Y_k}\|g\|^2 = E_{Y_k}\|z\|^2 \cdot \frac{\sigma_k^2 + (\mu_k - \mu)^2}{\sigma^2} + \Delta_k,
   \qquad \Delta_k = \mathrm{Cov}_{Y_k}(\|z\|^2, A^2),

and under the per-agent baseline of eq. 5, :math:`A = (R - \mu_k)/\sigma_k`, eq. 6:
:math:`E_{Y_k}\|g\|^2 = E_{Y_k}\|z\|^2 + \Delta'_k`.

The system built here (:class:`LemmaSetup`) sets :math:`\mu, \sigma, \mu_k, \sigma_k` by construction:

* a trajectory is of one of a few *kinds* (probability :math:`q_c`); its team reward is drawn from
  :math:`N(m_c, s_c^2)`, whatever the agents do;
* agent k takes :math:`n_{k,c}` turns in a trajectory of kind c (agents are invoked at different
  frequencies, and an agent can act only in some kinds), so agent k's turns weight kind c by
  :math:`q_c n_{k,c}`;
* at each turn agent k samples an action from its own softmax policy over a few actions (tabular logits, not
  uniform, so :math:`\|z\|^2 = \|e_a - \pi\|^2` does vary with the action).

Why :math:`\Delta_k \approx 0`: the actions are drawn independently of the reward (the reward depends only on
the trajectory's kind and its own noise), so :math:`\|z\|^2` and :math:`A^2` are independent and their
covariance is 0 in expectation; a Monte Carlo estimate leaves only sampling noise. ``action_bonus`` breaks that
on purpose (the reward then depends on agent 0's first action), for a contrast where :math:`\Delta_k \neq 0`.

The measured side goes through the product's own advantage code
(:func:`mas_train.advantages.compute_advantages`, modes ``grpo`` and ``drmas``; ``scope="batch"`` pools the
whole sample, i.e. population statistics, ``scope="group"`` is what training uses, with G trajectories per
task group).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mas_train.advantages import compute_advantages

__all__ = ["AgentPrediction", "AgentMeasurement", "Kind", "LemmaSetup", "measure", "predict", "sweep_setup"]


@dataclass(frozen=True)
class Kind:
    """One kind of trajectory.

    Attributes:
        prob: probability of the kind, in (0, 1]; the kinds of a setup sum to 1.
        reward_mean: mean team reward :math:`m_c` of its trajectories.
        reward_std: std :math:`s_c >= 0` of their (Gaussian) team reward.
        turns: turns of each agent in one trajectory of this kind (ints >= 0, one per agent).
    """

    prob: float
    reward_mean: float
    reward_std: float
    turns: tuple[int, ...]


@dataclass(frozen=True)
class LemmaSetup:
    """A tiny multi-agent system with known reward statistics per agent.

    Attributes:
        agents: agent names.
        logits: per agent, the logits of its softmax policy over its actions.
        kinds: the trajectory kinds (probabilities sum to 1).
    """

    agents: tuple[str, ...]
    logits: tuple[tuple[float, ...], ...]
    kinds: tuple[Kind, ...]

    def __post_init__(self) -> None:
        if len(self.logits) != len(self.agents):
            raise ValueError(
                f"give one logits tuple per agent: {len(self.agents)} agents, {len(self.logits)}"
            )
        if not np.isclose(sum(k.prob for k in self.kinds), 1.0):
            raise ValueError(f"kind probabilities must sum to 1, got {sum(k.prob for k in self.kinds)}")
        for k in self.kinds:
            if len(k.turns) != len(self.agents):
                raise ValueError(f"kind {k} gives {len(k.turns)} turn counts for {len(self.agents)} agents")
            if k.reward_std < 0 or min(k.turns) < 0:
                raise ValueError(f"kind {k}: reward_std and turns must be >= 0")
        for i, name in enumerate(self.agents):
            if sum(k.prob * k.turns[i] for k in self.kinds) == 0:
                raise ValueError(f"agent {name!r} never acts in any kind of trajectory")

    def policy(self, agent: int) -> np.ndarray:
        """``(A,)`` float64 softmax probabilities of ``agent``'s actions."""
        x = np.asarray(self.logits[agent], dtype=np.float64)
        e = np.exp(x - x.max())
        return e / e.sum()


@dataclass(frozen=True)
class AgentPrediction:
    r"""Population values of one agent, exact from the setup.

    Attributes:
        mu_k, sigma_k: mean and std of the team reward over the agent's turns.
        mu, sigma: mean and std of the team reward over trajectories.
        z2: :math:`E\|z\|^2 = 1 - \|\pi\|^2` for a softmax policy with tabular logits.
        factor: :math:`(\sigma_k^2 + (\mu_k - \mu)^2)/\sigma^2` (Lemma 4.2); under Dr. MAS it is 1 (eq. 6).
    """

    mu_k: float
    sigma_k: float
    mu: float
    sigma: float
    z2: float
    factor: float

    @property
    def deviation(self) -> float:
        r""":math:`|\mu_k - \mu| / \sigma`, the standardised mean deviation of Prop. 4.3."""
        return abs(self.mu_k - self.mu) / self.sigma


@dataclass(frozen=True)
class AgentMeasurement:
    r"""Monte Carlo second moments of one agent's per-turn gradient.

    Attributes:
        turns: number of the agent's turns in the sample.
        z2: mean :math:`\|z\|^2` over them.
        g2: mean :math:`\|g\|^2 = \|z\|^2 A^2` over them, per advantage key (e.g. ``"grpo"``, ``"drmas"``).
        a2: mean :math:`A^2` per key.
        delta: :math:`\Delta = \mathrm{mean}(\|z\|^2 A^2) - \mathrm{mean}(\|z\|^2)\,\mathrm{mean}(A^2)` per key.
        g2_se: standard error of ``g2`` per key.
    """

    turns: int
    z2: float
    g2: dict[str, float]
    a2: dict[str, float]
    delta: dict[str, float]
    g2_se: dict[str, float]


def predict(setup: LemmaSetup) -> dict[str, AgentPrediction]:
    """Exact population statistics and the Lemma 4.2 factor of each agent (no sampling).

    Only valid without ``action_bonus`` (the reward then does not depend on the actions).
    """
    q = np.array([k.prob for k in setup.kinds])
    m = np.array([k.reward_mean for k in setup.kinds])
    s2 = np.array([k.reward_std for k in setup.kinds]) ** 2
    mu = float(q @ m)
    sigma2 = float(q @ (s2 + m**2) - mu**2)
    out: dict[str, AgentPrediction] = {}
    for i, name in enumerate(setup.agents):
        w = q * np.array([k.turns[i] for k in setup.kinds], dtype=np.float64)
        w = w / w.sum()
        mu_k = float(w @ m)
        var_k = float(w @ (s2 + m**2) - mu_k**2)
        pi = setup.policy(i)
        out[name] = AgentPrediction(
            mu_k=mu_k,
            sigma_k=float(np.sqrt(max(var_k, 0.0))),
            mu=mu,
            sigma=float(np.sqrt(sigma2)),
            z2=float(1.0 - pi @ pi),
            factor=(var_k + (mu_k - mu) ** 2) / sigma2,
        )
    return out


def measure(
    setup: LemmaSetup,
    n_traj: int,
    *,
    seed: int = 0,
    group_size: int | None = None,
    action_bonus: float = 0.0,
) -> dict[str, AgentMeasurement]:
    r"""Sample ``n_traj`` trajectories and measure each agent's gradient second moments.

    Args:
        setup: the system.
        n_traj: number of trajectories (>= 2).
        seed: RNG seed.
        group_size: ``None`` = one pool (``scope="batch"``: the statistics of the whole sample, i.e. the
            population's); an int G = task groups of G trajectories with per-group statistics, as in training.
        action_bonus: added to the team reward when agent 0's first turn picks its least likely action (a
            reward that depends on the agent's action, so :math:`\Delta_0 \neq 0`); 0 keeps the lemma's
            :math:`\Delta_k \approx 0` construction.

    Returns:
        ``{agent: AgentMeasurement}`` with keys ``"grpo"`` (global baseline) and ``"drmas"`` (eq. 5).
    """
    if n_traj < 2:
        raise ValueError(f"n_traj must be >= 2, got {n_traj}")
    rng = np.random.default_rng(seed)
    q = np.array([k.prob for k in setup.kinds])
    kind = rng.choice(len(setup.kinds), size=n_traj, p=q)
    m = np.array([k.reward_mean for k in setup.kinds])
    s = np.array([k.reward_std for k in setup.kinds])
    reward = m[kind] + s[kind] * rng.standard_normal(n_traj)
    turns = np.array([k.turns for k in setup.kinds], dtype=np.int64)[kind]  # (n_traj, K)

    # one row per agent turn: its trajectory, agent and sampled action
    traj_rows, agent_rows, z2_rows, first_rows, action_rows = [], [], [], [], []
    for i in range(len(setup.agents)):
        pi = setup.policy(i)
        n_i = turns[:, i]
        tr = np.repeat(np.arange(n_traj), n_i)
        act = rng.choice(len(pi), size=tr.size, p=pi)
        # z = e_a - pi is grad_theta log softmax(theta)_a for tabular logits theta
        z2 = 1.0 - 2.0 * pi[act] + pi @ pi
        starts = np.concatenate([[0], np.cumsum(n_i)[:-1]])
        first = np.zeros(tr.size, dtype=bool)
        first[starts[n_i > 0]] = True
        traj_rows.append(tr)
        agent_rows.append(np.full(tr.size, i))
        z2_rows.append(z2)
        first_rows.append(first)
        action_rows.append(act)
    traj = np.concatenate(traj_rows)
    agent = np.concatenate(agent_rows)
    z2 = np.concatenate(z2_rows)
    if action_bonus:
        rare = int(np.argmin(setup.policy(0)))
        hit = (agent == 0) & np.concatenate(first_rows) & (np.concatenate(action_rows) == rare)
        reward = reward + action_bonus * np.bincount(traj[hit], minlength=n_traj).clip(max=1)
    scores = reward[traj]
    if group_size is None:
        groups, scope = np.zeros(traj.size, dtype=np.int64), "batch"
    else:
        groups, scope = traj // group_size, "group"
    adv = {
        mode: compute_advantages(scores, groups, traj, agent, mode=mode, scope=scope)
        for mode in ("grpo", "drmas")
    }
    out: dict[str, AgentMeasurement] = {}
    for i, name in enumerate(setup.agents):
        mine = agent == i
        zi = z2[mine]
        g2, a2, delta, se = {}, {}, {}, {}
        for mode, a in adv.items():
            ai2 = a[mine] ** 2
            gi2 = zi * ai2
            g2[mode] = float(gi2.mean())
            a2[mode] = float(ai2.mean())
            delta[mode] = float(gi2.mean() - zi.mean() * ai2.mean())
            se[mode] = float(gi2.std() / np.sqrt(gi2.size))
        out[name] = AgentMeasurement(int(mine.sum()), float(zi.mean()), g2, a2, delta, se)
    return out


def sweep_setup(
    mean_shift: float,
    *,
    rare_prob: float = 0.2,
    rare_std: float = 0.5,
    logits: Sequence[Sequence[float]] = ((0.0, 1.0, 2.0), (0.5, -0.5, 0.0, 1.5), (1.0, 0.0)),
) -> LemmaSetup:
    r"""A three-agent setup whose ``checker`` sees a reward distribution shifted by ``mean_shift``.

    Two kinds: *common* (probability 1 - q) with reward :math:`N(0, s_a^2)` and *rare* (q) with
    :math:`N(m, s_b^2)`, ``m = mean_shift``. ``solver`` acts once in every trajectory (its factor is exactly 1);
    ``verifier`` once in common and twice in rare ones; ``checker`` twice in rare ones only, so
    :math:`\mu_k = m`, :math:`\sigma_k = s_b`. :math:`s_a` is chosen so that :math:`\sigma = 1`; then
    :math:`|\mu_k - \mu|/\sigma = (1-q) m` and the checker's factor is :math:`s_b^2 + (1-q)^2 m^2`.

    Raises:
        ValueError: ``mean_shift`` too large for σ = 1 (needs :math:`q s_b^2 + q(1-q)m^2 < 1`).
    """
    q, sb = rare_prob, rare_std
    sa2 = (1.0 - q * sb**2 - q * (1 - q) * mean_shift**2) / (1 - q)
    if sa2 <= 0:
        raise ValueError(
            f"mean_shift {mean_shift} too large for sigma = 1 with rare_prob {q}, rare_std {sb}; "
            f"use |mean_shift| < {np.sqrt((1 - q * sb**2) / (q * (1 - q))):.3f}"
        )
    return LemmaSetup(
        agents=("solver", "verifier", "checker"),
        logits=tuple(tuple(float(x) for x in lg) for lg in logits),
        kinds=(
            Kind(prob=1 - q, reward_mean=0.0, reward_std=float(np.sqrt(sa2)), turns=(1, 1, 0)),
            Kind(prob=q, reward_mean=float(mean_shift), reward_std=sb, turns=(1, 2, 2)),
        ),
    )

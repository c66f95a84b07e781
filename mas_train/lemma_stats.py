"""Lemma 4.2 of the Dr. MAS paper, live: how much one global GRPO baseline inflates each agent's advantages.

For agent k with reward mean μ_k and std σ_k inside a task group whose global mean and std are μ and σ, GRPO's
advantage (R − μ)/σ has E[A²] = (σ_k² + (μ_k − μ)²)/σ² over k's turns (Lemma 4.2), where Dr. MAS's per-agent
normalisation (eq. 5) keeps it at 1. :func:`lemma_factors` measures it per agent on a batch, whatever mode trains,
and :func:`lemma_metrics` names it for the step's log (``lemma/factor/<agent>``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from mas_train.advantages import combine_keys, factorize, factorize_named, finite_scores, mean_std_by_key

__all__ = ["AgentLemmaStats", "lemma_factors", "lemma_metrics"]


@dataclass(frozen=True)
class AgentLemmaStats:
    r"""Lemma 4.2 statistics of one agent, averaged over the task groups where they are defined.

    A task group counts for agent k when k acted in it and the global std of its trajectory scores is > 0
    (where σ = 0 the factor is undefined: GRPO's advantage is 0 there). Every mean below is over those groups,
    each group weighted equally.

    Attributes:
        groups: number of task groups in which the agent acted.
        defined_frac: fraction of those groups with σ > 0, in [0, 1] (NaN when ``groups`` is 0).
        factor: mean over the defined groups of :math:`(\sigma_k^2 + (\mu_k - \mu)^2) / \sigma^2`
            (Lemma 4.2; 1 means a global baseline costs this agent nothing); NaN when no group is defined.
        mu_k: mean of the per-group μ_k: the mean trajectory score over the agent's turns (eq. 5's μ_k when no
            turn is penalised).
        sigma_k: mean of the per-group σ_k, the population std of the same values.
        mu: mean of the per-group global mean μ (eq. 2, over trajectories).
        sigma: mean of the per-group global population std σ.
    """

    groups: int
    defined_frac: float
    factor: float
    mu_k: float
    sigma_k: float
    mu: float
    sigma: float


def lemma_factors(
    scores: Sequence[float] | np.ndarray,
    group_ids: Sequence[Hashable] | np.ndarray,
    traj_ids: Sequence[Hashable] | np.ndarray,
    agent_ids: Sequence[Hashable] | np.ndarray,
) -> dict[str, AgentLemmaStats]:
    r"""Per agent, the inflation factor a global GRPO baseline puts on its gradient second moment.

    Lemma 4.2 (Dr. MAS, arXiv 2602.08847): with the global advantage :math:`(r - \mu)/\sigma`, the second
    moment of agent k's per-turn gradient :math:`z \cdot A` is
    :math:`E\|z\|^2 \, (\sigma_k^2 + (\mu_k - \mu)^2)/\sigma^2 + \Delta_k`; this returns that factor from the
    batch's scores, independent of the ``advantage_mode`` the run trains with. Statistics per task group
    (``scope="group"``), population stds: μ, σ over the trajectory scores :math:`r_i` (eq. 2); μ_k, σ_k over
    the trajectory scores of agent k's turns (a trajectory counts once per turn of k), i.e. over the reward
    GRPO's advantage gives those turns, so the factor equals the mean of GRPO's :math:`A^2` over agent k's turns.
    Without invalid-action penalties a turn's score is its trajectory's, and μ_k, σ_k are eq. 5's; with
    penalties eq. 5 (``drmas``) uses the turn's own score ``s``, which this factor does not.

    Args:
        scores, group_ids, traj_ids, agent_ids: ``(N,)`` each, as for :func:`compute_advantages`.

    Returns:
        ``{agent: AgentLemmaStats}`` in order of first appearance (see :class:`AgentLemmaStats`).

    Raises:
        ValueError: as :func:`compute_advantages` (lengths, NaN/inf scores, unhashable ids).
    """
    s = finite_scores(scores)
    n = s.shape[0]
    g = factorize(group_ids, "group_ids", n)
    t = combine_keys(g, factorize(traj_ids, "traj_ids", n))
    a_codes, agent_names = factorize_named(agent_ids, "agent_ids", n)
    if n == 0:
        return {}
    ga = combine_keys(g, a_codes)
    n_traj = int(t.max()) + 1
    r = np.bincount(t, weights=s, minlength=n_traj) / np.bincount(t, minlength=n_traj)
    traj_group = np.zeros(n_traj, dtype=np.int64)
    traj_group[t] = g
    mu_g, sigma_g = mean_std_by_key(r, traj_group)
    # Lemma 4.2's mu_k, sigma_k are of the reward the global baseline is applied to, over agent k's turns: under
    # GRPO (eq. 2) every turn of trajectory i gets r_i, so they are taken over r_i, not over the turn's own score
    # s (which carries its invalid-action penalty undiluted). The factor is then exactly the mean of GRPO's A^2
    # over agent k's turns of the group (up to eps); without penalties s = r and these are eq. 5's statistics.
    mu_ga, sigma_ga = mean_std_by_key(r[t], ga)
    # one row per (group, agent) key: its group, its agent
    n_ga = int(ga.max()) + 1
    key_group = np.zeros(n_ga, dtype=np.int64)
    key_agent = np.zeros(n_ga, dtype=np.int64)
    key_group[ga] = g
    key_agent[ga] = a_codes
    nan = float("nan")
    out: dict[str, AgentLemmaStats] = {}
    for code, name in enumerate(agent_names):
        keys = np.flatnonzero(key_agent == code)
        grp = key_group[keys]
        ok = sigma_g[grp] > 0
        if not ok.any():
            out[name] = AgentLemmaStats(len(keys), 0.0, nan, nan, nan, nan, nan)
            continue
        k_ok, g_ok = keys[ok], grp[ok]
        sigma = sigma_g[g_ok]
        factor = (sigma_ga[k_ok] ** 2 + (mu_ga[k_ok] - mu_g[g_ok]) ** 2) / sigma**2
        out[name] = AgentLemmaStats(
            groups=len(keys),
            defined_frac=float(ok.mean()),
            factor=float(factor.mean()),
            mu_k=float(mu_ga[k_ok].mean()),
            sigma_k=float(sigma_ga[k_ok].mean()),
            mu=float(mu_g[g_ok].mean()),
            sigma=float(sigma.mean()),
        )
    return out


def lemma_metrics(
    scores: Sequence[float] | np.ndarray,
    group_ids: Sequence[Hashable] | np.ndarray,
    traj_ids: Sequence[Hashable] | np.ndarray,
    agent_ids: Sequence[Hashable] | np.ndarray,
    *,
    prefix: str = "lemma",
) -> dict[str, float]:
    """:func:`lemma_factors` as flat, log-ready metrics.

    Keys: ``<prefix>/factor/<agent>``, ``<prefix>/mu_k/<agent>``, ``<prefix>/sigma_k/<agent>``,
    ``<prefix>/mu/<agent>``, ``<prefix>/sigma/<agent>``, ``<prefix>/defined_frac/<agent>`` (NaN where undefined;
    the JSONL sink writes it as ``null``). Same arguments and errors as :func:`lemma_factors`.
    """
    out: dict[str, float] = {}
    for agent, st in lemma_factors(scores, group_ids, traj_ids, agent_ids).items():
        out[f"{prefix}/factor/{agent}"] = st.factor
        out[f"{prefix}/mu_k/{agent}"] = st.mu_k
        out[f"{prefix}/sigma_k/{agent}"] = st.sigma_k
        out[f"{prefix}/mu/{agent}"] = st.mu
        out[f"{prefix}/sigma/{agent}"] = st.sigma
        out[f"{prefix}/defined_frac/{agent}"] = st.defined_frac
    return out

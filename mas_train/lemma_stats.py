"""Lemma 4.2 of the Dr. MAS paper, live: how much one global GRPO baseline inflates each agent's advantages, and
the other per-agent diagnostics a step logs.

For agent k with reward mean μ_k and std σ_k inside a task group whose global mean and std are μ and σ, GRPO's
advantage (R − μ)/σ has E[A²] = (σ_k² + (μ_k − μ)²)/σ² over k's turns (Lemma 4.2), where Dr. MAS's per-agent
normalisation (eq. 5) keeps it at 1. :func:`lemma_factors` measures it per agent on a batch, whatever mode trains,
together with the *noise share* (μ_k − μ)² / (σ_k² + (μ_k − μ)²), the part of that E[A²] that is a constant
offset of every one of k's advantages rather than a contrast between them; :func:`lemma_metrics` names both for
the step's log (``lemma/factor/<agent>``, ``lemma/noise_share/<agent>``).

:func:`success_logp` is the Lazy Likelihood Displacement probe (arXiv 2512.04220): per agent, the mean per-token
sampling log-probability of its turns in successful trajectories; :func:`lld_metrics` logs it as
``lld/success_logp/<agent>``. Step over step, a falling curve is the signature of LLD (the likelihood of correct
answers drops while they are being reinforced), a confounder of "GRPO collapsed".
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from mas_train.cells import combine_keys, factorize, factorize_named, finite_scores, mean_std_by_key

__all__ = ["AgentLemmaStats", "lemma_factors", "lemma_metrics", "lld_metrics", "noise_share", "success_logp"]


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
        noise_share: mean over the defined groups of :func:`noise_share` of the group's μ_k, σ_k, μ, in [0, 1]
            (0: GRPO's advantages of k are a pure contrast; 1: a pure constant offset); NaN when no group is
            defined.
        mu_k: mean of the per-group μ_k: the mean trajectory score over the agent's turns (eq. 5's μ_k when no
            turn is penalised).
        sigma_k: mean of the per-group σ_k, the population std of the same values.
        mu: mean of the per-group global mean μ (eq. 2, over trajectories).
        sigma: mean of the per-group global population std σ.
    """

    groups: int
    defined_frac: float
    factor: float
    noise_share: float
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
            out[name] = AgentLemmaStats(len(keys), 0.0, nan, nan, nan, nan, nan, nan)
            continue
        k_ok, g_ok = keys[ok], grp[ok]
        sigma = sigma_g[g_ok]
        factor = (sigma_ga[k_ok] ** 2 + (mu_ga[k_ok] - mu_g[g_ok]) ** 2) / sigma**2
        share = noise_share(mu_ga[k_ok], sigma_ga[k_ok], mu_g[g_ok])
        out[name] = AgentLemmaStats(
            groups=len(keys),
            defined_frac=float(ok.mean()),
            factor=float(factor.mean()),
            noise_share=float(share.mean()),
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

    Keys: ``<prefix>/factor/<agent>``, ``<prefix>/noise_share/<agent>``, ``<prefix>/mu_k/<agent>``,
    ``<prefix>/sigma_k/<agent>``, ``<prefix>/mu/<agent>``, ``<prefix>/sigma/<agent>``,
    ``<prefix>/defined_frac/<agent>`` (NaN where undefined; the JSONL sink writes it as ``null``). Same arguments and errors as :func:`lemma_factors`.
    """
    out: dict[str, float] = {}
    for agent, st in lemma_factors(scores, group_ids, traj_ids, agent_ids).items():
        out[f"{prefix}/factor/{agent}"] = st.factor
        out[f"{prefix}/noise_share/{agent}"] = st.noise_share
        out[f"{prefix}/mu_k/{agent}"] = st.mu_k
        out[f"{prefix}/sigma_k/{agent}"] = st.sigma_k
        out[f"{prefix}/mu/{agent}"] = st.mu
        out[f"{prefix}/sigma/{agent}"] = st.sigma
        out[f"{prefix}/defined_frac/{agent}"] = st.defined_frac
    return out


def noise_share(mu_k: np.ndarray, sigma_k: np.ndarray, mu: np.ndarray) -> np.ndarray:
    r"""The share of GRPO's second moment of agent k's advantages that is a constant offset.

    Lemma 4.2 of the Dr. MAS paper (arXiv 2602.08847) writes GRPO's :math:`E[A^2]` over agent k's turns as
    :math:`(\sigma_k^2 + (\mu_k - \mu)^2) / \sigma^2`: a spread term σ_k² (the contrast between k's turns,
    which carries the learning signal) and an offset term (μ_k − μ)² (the same shift added to every one of k's
    advantages). This returns the offset's share,

    .. math:: \frac{(\mu_k - \mu)^2}{\sigma_k^2 + (\mu_k - \mu)^2} \in [0, 1],

    and 0 where the denominator is 0 (k's turns all have the global mean: no offset, no spread). σ cancels, so it
    is defined even where the factor is not; :func:`lemma_factors` averages it over the same groups as the factor.

    Args:
        mu_k, sigma_k, mu: arrays of one shape (float), one entry per (task group, agent) cell.

    Returns:
        float64 array of that shape, in [0, 1].
    """
    offset = (np.asarray(mu_k, dtype=np.float64) - np.asarray(mu, dtype=np.float64)) ** 2
    denom = np.asarray(sigma_k, dtype=np.float64) ** 2 + offset
    out: np.ndarray = np.where(denom > 0, offset / np.where(denom > 0, denom, 1.0), 0.0)
    return out


def success_logp(
    agent_ids: Sequence[Hashable],
    success: Sequence[bool],
    logprobs: Sequence[Sequence[float]],
) -> dict[str, float]:
    """Per agent, the mean per-token log-probability of its turns in successful trajectories.

    The Lazy Likelihood Displacement probe (arXiv 2512.04220): the mean is over every completion token of the
    agent's turns whose trajectory succeeded (token-weighted: a turn of 30 tokens counts 30 times), of the
    sampling log-probability the backend returned for it (``Sample.sampling_logprobs``, nats). Logged step over
    step, a falling value means the policy grows less likely to produce the kind of answer that succeeds.

    Args:
        agent_ids: ``(N,)`` the agent of each turn.
        success: ``(N,)`` whether the turn's trajectory succeeded (``Sample.success``; for the shipped envs the
            team reward is then its maximum, 1).
        logprobs: ``N`` sequences of per-token log-probabilities (floats, may be empty).

    Returns:
        ``{agent: mean}`` for every agent in order of first appearance; NaN for an agent with no token in a
        successful trajectory this step.

    Raises:
        ValueError: inputs of different lengths, or a NaN/inf log-probability.
    """
    n = len(agent_ids)
    if len(success) != n or len(logprobs) != n:
        raise ValueError(
            f"agent_ids, success and logprobs need one entry per turn, got {n}, {len(success)}, {len(logprobs)}"
        )
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for agent, ok, lp in zip(agent_ids, success, logprobs, strict=True):
        name = str(agent)
        sums.setdefault(name, 0.0)
        counts.setdefault(name, 0)
        if not ok or not len(lp):
            continue
        arr = np.asarray(lp, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise ValueError(
                f"a turn of {name!r} has a NaN/inf log-probability: {arr[~np.isfinite(arr)][:3]}"
            )
        sums[name] += float(arr.sum())
        counts[name] += int(arr.size)
    return {a: (sums[a] / counts[a] if counts[a] else float("nan")) for a in sums}


def lld_metrics(
    agent_ids: Sequence[Hashable],
    success: Sequence[bool],
    logprobs: Sequence[Sequence[float]],
    *,
    prefix: str = "lld",
) -> dict[str, float]:
    """:func:`success_logp` as log-ready metrics ``<prefix>/success_logp/<agent>`` (NaN is written as ``null``).
    Same arguments and errors as :func:`success_logp`."""
    return {f"{prefix}/success_logp/{a}": v for a, v in success_logp(agent_ids, success, logprobs).items()}

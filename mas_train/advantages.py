r"""Advantages for multi-agent GRPO: global (GRPO), per-agent (Dr. MAS) normalisation and SPIRAL's RAE.

Pure, vectorised numpy; the only state is RAE's per-agent baseline (:class:`RoleBaseline`), which the caller
keeps across steps and passes in. One *sample* is one agent turn; its score is
``s = R - c * invalid`` (R the team reward of its trajectory, c the invalid-action penalty), or with per-agent
reward weights ``s = w_team R + w_role role_reward - c * invalid`` (:mod:`mas_train.scoring`). Samples are
grouped into *task groups* (the G trajectories sampled for one task), trajectories and agents.

Notation for one task group (Dr. MAS, arXiv 2602.08847):

* trajectory score :math:`r_i` = mean of the step scores of trajectory i (equal to R when nothing is penalised);
  in a game, where each seat has its own return, the trainer passes each seat's turns of a trajectory as a
  trajectory of their own, so that :math:`r_i` is one seat's return and GRPO's μ, σ pool the seats' returns
  (averaging both seats' turns would give about 0 in a zero-sum game, and a seat acting once would get the sign
  of the other seat's return where that one acts twice);
* global statistics (eq. 2): :math:`\mu, \sigma` = mean and **population** std of :math:`r_1..r_G`;
* per-agent statistics (eq. 5, Algorithm 1 lines 37-41): :math:`\mu_k, \sigma_k` = mean and **population** std
  of the step scores of agent k in the group -- a trajectory counts once per turn of k;
* turn-score std :math:`\sigma_s` = population std of the step scores of *every* turn in the group (all agents,
  a trajectory counts once per turn), the global std on the scale of the step scores.

Modes (the mean and std used; ε = 1e-6):

=============  ============================  =====================================================
mode           statistics                    advantage of a sample of agent k in trajectory i
=============  ============================  =====================================================
``grpo``       (μ, σ)      eq. 2             :math:`(r_i - \mu) / (\sigma + \varepsilon)` (every step of i)
``drmas``      (μ_k, σ_k)  eq. 5             :math:`(s - \mu_k) / (\sigma_k + \varepsilon)`
``agent_mean`` (μ_k, σ_s)  ablation          :math:`(s - \mu_k) / (\sigma_s + \varepsilon)`
``agent_std``  (μ, σ_k)    ablation          :math:`(s - \mu) / (\sigma_k + \varepsilon)`
``rae``        (b_k, none) SPIRAL RAE        :math:`s - b_k` (b_k: agent k's moving average, below)
=============  ============================  =====================================================

``rae`` (Role-conditioned Advantage Estimation, SPIRAL, arXiv 2506.24119) keeps one exponential moving average
b_k of agent (seat) k's trajectory score across steps and neither centres on the task group nor divides by a std,
so it works at G = 1. As SPIRAL's code does (``spiral-rl/spiral`` at commit a02d0ed, ``train_spiral.py``
``SelfPlayActor.prepare_trajectories``, lines 488-493, with ``spiral/utils.py`` ``EMA``, lines 18-32; default
decay ``role_baseline_ema_gamma = 0.95``, line 79): the baseline starts at 0 and is updated once per (trajectory,
agent), in the order the trajectories appear in the batch, and each trajectory is scored against the baseline
*before* its own update ("Get the baseline before updating to be unbiased")::

    A = s - b_k;    then  b_k <- d * b_k + (1 - d) * r_{i,k}

with d the decay and r_{i,k} the mean of agent k's step scores in trajectory i (SPIRAL's per-game reward of the
player; equal to s when nothing is penalised). SPIRAL keys the baseline by player id within a run of one game; we
key it by agent id. Its learner then uses this return as the advantage unchanged
(``SelfPlayLearner.compute_monte_carlo_advantages``, lines 820-824, "Return without baseline"). ``scope``,
``stats`` and ``eps`` do not apply to it. SPIRAL's settings around it (turn discount ``gamma`` = 1, i.e. none;
``filter_zero_adv``, which drops turns whose advantage is exactly 0) are not part of this mode.

``agent_mean`` (Table 3's (μ_k, σ)) takes its numerator and its std from the same step scores s: μ_k and σ_s
are both over turns. (An earlier version divided by the trajectory scores' σ: with invalid-action penalties the step
scores, each carrying its penalty c in full, spread far more than the trajectory means, which average the
penalty over the trajectory's turns, and its advantages were inflated up to E[A²] = 9; docs/results.md.)
Without penalties and with every trajectory the same length, σ_s = σ.

Where the std a mode divides by is 0 (all values equal, including a single value) the advantage is exactly 0:
there is no learning signal, and it is never inflated by ``1/ε``. Those samples are flagged (``zero_std``) and
their fraction is reported per agent.

``stats`` says how every mean and std above is estimated from the n values of its cell:

* ``"paper"`` (default): mean and population std (ddof = 0), as the paper writes them (eq. 2, eq. 5,
  Algorithm 1 line 40); a cell of one value has σ = 0, so its sample gets advantage 0 (no signal);
* ``"reference"``: as the reference code (``verl/trainer/ppo/core_algos.py::compute_grpo_outcome_advantage``):
  the unbiased std (ddof = 1, ``torch.std``), and a cell of one value gets μ := 0, σ := 1, i.e. its raw,
  uncentred score as advantage (``s / (1 + ε)``). With n values the unbiased std is the population one times
  :math:`\sqrt{n/(n-1)}`, so every advantage of an n-sample cell is :math:`\sqrt{(n-1)/n}` times the paper's
  (0.87 at n = 4) and a cell's E[A²] is (n-1)/n instead of 1.

``scope="group"`` (default) computes the statistics per task group, as the reference code does;
``scope="batch"`` pools every task group of the batch (one μ/σ over all trajectories, one μ_k/σ_k per agent);
``scope="turn"`` (AT-GRPO's turn-wise grouping, PettingLLMs) takes the per-agent statistics per
(task group, agent, turn position p), p being the 0-based index of the turn among agent k's turns in its
trajectory: :math:`\mu_{k,p}, \sigma_{k,p}` over the n_{k,p} turns of k at position p in the group. A cell with
fewer than ``min_turn_samples`` turns (a position only some trajectories reach, e.g. a retry after a rejection)
falls back to the agent's task-group statistics :math:`\mu_k, \sigma_k` (eq. 5) instead of giving its turns no
signal; the global μ, σ (and σ_s) stay per task group. Each turn's advantage uses only its own score minus one
baseline that depends on (task group, agent, position), never a sum over later turns, so the stopping-time bias
of verl #7244 (a baseline whose number of terms is set by the trajectory's own length) cannot arise
(docs/advantages.md, "Turn scope").

Differences from the reference code (``verl/trainer/ppo/core_algos.py::compute_grpo_outcome_advantage``):

* with ``stats="paper"`` (default): it uses the unbiased (N-1) ``torch.std`` where we use the population std
  the paper writes, and a key with a single sample gets μ := 0, σ := 1 there (the raw, uncentred score as
  advantage) where it gets 0 here; ``stats="reference"`` does both as it does;
* a cell of n >= 2 equal values gives 0 in both; in the mixed modes, where the numerator need not be 0 when the
  std is, we give 0 where the reference code's rule would give num / ε;
* its ablation branch selects step- vs trajectory-weighted statistics inside the per-agent key, not the paper's
  mixed (μ_k, σ) / (μ, σ_k); we implement the paper's mixtures;
* it computes statistics after duplicating padding rows; we never pad before the advantage.

What the trainer logs from :class:`AdvantageResult.metrics`: per agent the mean and std of its advantages, its
sample count, and the fraction of its samples whose std was 0 (``advantages/zero_std_frac/<agent>``).

:func:`lemma_factors` / :func:`lemma_metrics` compute, whatever the mode, the factor by which one global
baseline would inflate agent k's gradient second moment (Lemma 4.2):
:math:`E\|z\|^2 (\sigma_k^2 + (\mu_k - \mu)^2) / \sigma^2`; under Dr. MAS the factor is 1 (eq. 6).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mas_train.cells import combine_keys, factorize, factorize_named, finite_scores, mean_std_by_key
from mas_train.role_baseline import RAE_DEFAULT_DECAY, RoleBaseline

__all__ = [
    "DEFAULT_MIN_TURN_SAMPLES",
    "MODES",
    "SCOPES",
    "STATS",
    "AdvantageResult",
    "AgentAdvantageStats",
    "RAE_DEFAULT_DECAY",
    "RoleBaseline",
    "combine_keys",
    "compute_advantages",
    "compute_advantages_with_stats",
    "factorize",
    "finite_scores",
    "factorize_named",
    "mean_std_by_key",
]

MODES = ("drmas", "grpo", "agent_mean", "agent_std", "rae")
SCOPES = ("group", "batch", "turn")
#: how a cell's mean and std are estimated: the paper's population std (a one-value cell gives no signal), or the
#: reference code's unbiased std (a one-value cell gives its raw score); see the module docstring
STATS = ("paper", "reference")
#: turn-scope cells with fewer turns than this use the agent's task-group statistics (docs/advantages.md)
DEFAULT_MIN_TURN_SAMPLES = 2


@dataclass(frozen=True)
class AgentAdvantageStats:
    """Advantage statistics of one agent's samples in a batch.

    Attributes:
        count: number of samples (turns) of the agent.
        mean: mean of their advantages.
        std: population std of their advantages.
        zero_std_frac: fraction of them whose divisor std was 0 (advantage set to 0), in [0, 1].
    """

    count: int
    mean: float
    std: float
    zero_std_frac: float


@dataclass(frozen=True)
class AdvantageResult:
    """Output of :func:`compute_advantages_with_stats`.

    Attributes:
        advantages: ``(N,)`` float64, one per sample, in input order.
        zero_std: ``(N,)`` bool, True where the std the mode divides by was 0 (the advantage is then 0).
        per_agent: stats per agent id (as ``str``), in order of first appearance.
        stat_group: ``(N,)`` int64 codes 0..K-1, the statistics cell of each sample: for ``drmas``,
            ``agent_mean`` and ``agent_std`` the cell its per-agent μ_k / σ_k are taken over ((task group,
            agent), (agent) for ``scope="batch"``, (task group, agent, position) or its fallback for
            ``scope="turn"``; the turns of a group's too-small cells of one agent share one fallback cell, whose
            statistics are those of all the agent's turns in the group); for ``grpo``, which has no per-agent
            statistics, its task group (0 for the batch); for ``rae`` its agent (whose baseline it used).
        turn_fallback: ``(N,)`` bool, True where a ``scope="turn"`` cell was too small and the sample used its
            agent's task-group statistics instead (all False for the other scopes).
        baseline: ``rae`` only: agent id -> its baseline b_k after this batch's updates (empty otherwise).
    """

    advantages: np.ndarray
    zero_std: np.ndarray
    per_agent: dict[str, AgentAdvantageStats]
    stat_group: np.ndarray
    turn_fallback: np.ndarray
    baseline: dict[str, float] = field(default_factory=dict)

    def metrics(self, prefix: str = "advantages") -> dict[str, float]:
        """Flat, log-ready metrics: ``<prefix>/{mean,std,count,zero_std_frac}/<agent>``, and for ``rae``
        ``<prefix>/baseline/<agent>`` (b_k after the batch)."""
        out: dict[str, float] = {}
        for agent, st in self.per_agent.items():
            out[f"{prefix}/mean/{agent}"] = st.mean
            out[f"{prefix}/std/{agent}"] = st.std
            out[f"{prefix}/count/{agent}"] = float(st.count)
            out[f"{prefix}/zero_std_frac/{agent}"] = st.zero_std_frac
        for agent, b in self.baseline.items():
            out[f"{prefix}/baseline/{agent}"] = b
        return out


def compute_advantages(
    scores: Sequence[float] | np.ndarray,
    group_ids: Sequence[Hashable] | np.ndarray,
    traj_ids: Sequence[Hashable] | np.ndarray,
    agent_ids: Sequence[Hashable] | np.ndarray,
    *,
    mode: str = "drmas",
    eps: float = 1e-6,
    scope: str = "group",
    turn_ids: Sequence[int] | np.ndarray | None = None,
    min_turn_samples: int = DEFAULT_MIN_TURN_SAMPLES,
    stats: str = "paper",
    baseline: RoleBaseline | None = None,
) -> np.ndarray:
    """One advantage per sample (see the module docstring for the formulas).

    Args:
        scores: ``(N,)`` per-sample scores ``s = w_team R + w_role role_reward - c * invalid`` (finite floats).
        group_ids: ``(N,)`` task-group id of each sample (e.g. the task uid).
        traj_ids: ``(N,)`` trajectory id of each sample; only needs to be unique within its task group.
        agent_ids: ``(N,)`` agent of each sample.
        mode: ``"drmas"`` (eq. 5), ``"grpo"`` (eq. 2), ``"agent_mean"`` (μ_k, σ_s), ``"agent_std"`` (μ, σ_k) or
            ``"rae"`` (SPIRAL, ``s - b_k``; needs ``baseline``).
        eps: ε added to the std (>= 0).
        scope: ``"group"`` (statistics per task group), ``"batch"`` (pooled over the batch) or ``"turn"``
            (per-agent statistics per task group, agent and turn position; not with ``mode="grpo"``).
        turn_ids: ``(N,)`` int, the turn index of each sample within its trajectory (``Sample.turn``); only
            their order within a (trajectory, agent) matters. Required for ``scope="turn"``, ignored otherwise.
        min_turn_samples: ``scope="turn"``: a (task group, agent, position) cell with fewer turns uses the
            agent's task-group statistics (>= 1; 1 never falls back).
        stats: ``"paper"`` (population std; a one-value cell gives 0) or ``"reference"`` (unbiased std; a
            one-value cell gives its raw score), see the module docstring.
        baseline: ``mode="rae"`` only: the run's per-agent baselines, read and updated in place.

    Returns:
        ``(N,)`` float64 advantages, in input order.

    Raises:
        ValueError: unknown mode, scope or stats, ``grpo`` with ``scope="turn"``, negative/non-finite eps, inputs of
            different lengths or not 1-D, NaN/inf scores (the message gives their count and first indices),
            missing or repeated turn ids (one agent twice at one turn of a trajectory) for ``scope="turn"``,
            ``min_turn_samples < 1``, ``mode="rae"`` without a ``baseline`` or a ``baseline`` with another mode.
    """
    return compute_advantages_with_stats(
        scores,
        group_ids,
        traj_ids,
        agent_ids,
        mode=mode,
        eps=eps,
        scope=scope,
        turn_ids=turn_ids,
        min_turn_samples=min_turn_samples,
        stats=stats,
        baseline=baseline,
    ).advantages


def compute_advantages_with_stats(
    scores: Sequence[float] | np.ndarray,
    group_ids: Sequence[Hashable] | np.ndarray,
    traj_ids: Sequence[Hashable] | np.ndarray,
    agent_ids: Sequence[Hashable] | np.ndarray,
    *,
    mode: str = "drmas",
    eps: float = 1e-6,
    scope: str = "group",
    turn_ids: Sequence[int] | np.ndarray | None = None,
    min_turn_samples: int = DEFAULT_MIN_TURN_SAMPLES,
    stats: str = "paper",
    baseline: RoleBaseline | None = None,
) -> AdvantageResult:
    """:func:`compute_advantages` plus the zero-std mask, the statistics cells and per-agent statistics to log.

    Same arguments and errors as :func:`compute_advantages`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {list(SCOPES)}, got {scope!r}")
    if stats not in STATS:
        raise ValueError(f"stats must be one of {list(STATS)}, got {stats!r}")
    if scope == "turn" and mode == "grpo":
        raise ValueError(
            "scope='turn' groups the per-agent statistics by turn position, and mode='grpo' has none (one "
            "trajectory score per task group); use mode='drmas' (or agent_mean/agent_std), or scope='group'"
        )
    if (mode == "rae") != (baseline is not None):
        raise ValueError(
            "mode='rae' needs baseline=RoleBaseline(...) (its per-agent moving averages, kept across steps), and "
            f"no other mode takes one; got mode={mode!r} with baseline={baseline!r}"
        )
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if isinstance(min_turn_samples, bool) or not isinstance(min_turn_samples, (int, np.integer)):
        raise ValueError(f"min_turn_samples must be an int >= 1, got {min_turn_samples!r}")
    if min_turn_samples < 1:
        raise ValueError(f"min_turn_samples must be an int >= 1, got {min_turn_samples!r}")
    s = finite_scores(scores)
    n = s.shape[0]
    task_group = factorize(group_ids, "group_ids", n)
    g = np.zeros(n, dtype=np.int64) if scope == "batch" else task_group
    # trajectories are keyed by (task group, traj id) so ids may repeat across groups
    t = combine_keys(task_group, factorize(traj_ids, "traj_ids", n))
    a_codes, agent_names = factorize_named(agent_ids, "agent_ids", n)
    position = _turn_positions(turn_ids, t, a_codes, n) if scope == "turn" else None
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return AdvantageResult(np.zeros(0), np.zeros(0, dtype=bool), {}, empty, np.zeros(0, dtype=bool))

    # trajectory scores r_i and the task group of each trajectory
    n_traj = int(t.max()) + 1
    r = np.bincount(t, weights=s, minlength=n_traj) / np.bincount(t, minlength=n_traj)
    traj_group = np.zeros(n_traj, dtype=np.int64)
    traj_group[t] = g
    mu_g, sigma_g = mean_std_by_key(r, traj_group, stats=stats)  # eq. 2, over trajectories
    ga = combine_keys(g, a_codes)
    mu_ga, sigma_ga = mean_std_by_key(s, ga, stats=stats)  # eq. 5, over agent turns
    fallback = np.zeros(n, dtype=bool)
    cell = ga
    mu_k, sigma_k = mu_ga[ga], sigma_ga[ga]
    if position is not None:
        # AT-GRPO's cells (task group, agent, position); a cell below min_turn_samples keeps eq. 5's (group,
        # agent) statistics over all of the agent's turns in the group
        gap = combine_keys(ga, position)
        mu_p, sigma_p = mean_std_by_key(s, gap, stats=stats)
        fallback = np.bincount(gap)[gap] < min_turn_samples
        mu_k = np.where(fallback, mu_k, mu_p[gap])
        sigma_k = np.where(fallback, sigma_k, sigma_p[gap])
        cell = combine_keys(ga, np.where(fallback, 0, position + 1))  # 0: the agent's fallback cell

    if baseline is not None:
        return _rae(s, t, a_codes, agent_names, baseline, fallback)
    if mode == "grpo":
        num, sigma = r[t] - mu_g[g], sigma_g[g]
    elif mode == "drmas":
        num, sigma = s - mu_k, sigma_k
    elif mode == "agent_mean":
        # numerator and std on one scale: sigma_s over the same step scores as mu_k (module docstring)
        sigma_s = mean_std_by_key(s, g, stats=stats)[1]
        num, sigma = s - mu_k, sigma_s[g]
    else:  # agent_std
        num, sigma = s - mu_g[g], sigma_k
    zero_std = sigma == 0.0
    adv = np.where(zero_std, 0.0, num / np.where(zero_std, 1.0, sigma + eps))

    stat_group = g if mode == "grpo" else cell
    return AdvantageResult(
        advantages=adv,
        zero_std=zero_std,
        per_agent=_per_agent(adv, zero_std, a_codes, agent_names),
        stat_group=stat_group.astype(np.int64),
        turn_fallback=fallback,
    )


def _per_agent(
    adv: np.ndarray, zero_std: np.ndarray, a_codes: np.ndarray, agent_names: list[str]
) -> dict[str, AgentAdvantageStats]:
    per_agent: dict[str, AgentAdvantageStats] = {}
    for code, name in enumerate(agent_names):
        mask = a_codes == code
        per_agent[name] = AgentAdvantageStats(
            count=int(mask.sum()),
            mean=float(adv[mask].mean()),
            std=float(adv[mask].std()),
            zero_std_frac=float(zero_std[mask].mean()),
        )
    return per_agent


def _rae(
    s: np.ndarray,
    t: np.ndarray,
    a_codes: np.ndarray,
    agent_names: list[str],
    baseline: RoleBaseline,
    fallback: np.ndarray,
) -> AdvantageResult:
    """SPIRAL's RAE (module docstring): per (trajectory, agent) cell, in order of the cell's first sample in the
    batch, every turn gets ``s - b_k`` with b_k read before the cell's own update ``b_k <- d b_k + (1-d) r``."""
    cell = combine_keys(t, a_codes)
    n_cell = int(cell.max()) + 1
    r = np.bincount(cell, weights=s, minlength=n_cell) / np.bincount(cell, minlength=n_cell)
    first = np.full(n_cell, s.shape[0], dtype=np.int64)
    np.minimum.at(first, cell, np.arange(s.shape[0]))
    b_cell = np.empty(n_cell)
    for c in np.argsort(first, kind="stable"):
        agent = agent_names[int(a_codes[first[c]])]
        b_cell[c] = baseline.get(agent)
        baseline.update(agent, float(r[c]))
    adv = s - b_cell[cell]
    zero_std = np.zeros(s.shape[0], dtype=bool)  # RAE divides by no std
    return AdvantageResult(
        advantages=adv,
        zero_std=zero_std,
        per_agent=_per_agent(adv, zero_std, a_codes, agent_names),
        stat_group=a_codes.astype(np.int64),
        turn_fallback=fallback,
        baseline={name: baseline.get(name) for name in agent_names},
    )


def _turn_positions(
    turn_ids: Sequence[int] | np.ndarray | None, t: np.ndarray, a: np.ndarray, n: int
) -> np.ndarray:
    """0-based position of each sample among its agent's samples in its trajectory, in turn order.

    Raises:
        ValueError: no turn ids, a wrong length, non-integers, or one agent twice at one turn of a trajectory
            (a trajectory split or counted twice).
    """
    if turn_ids is None:
        raise ValueError("scope='turn' needs turn_ids: the turn index of each sample in its trajectory")
    turns = np.asarray(turn_ids)
    if turns.ndim != 1 or turns.shape[0] != n:
        raise ValueError(f"turn_ids has shape {turns.shape} but scores has {n} entries; give one per sample")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(turns.dtype, np.integer):
        raise ValueError(f"turn_ids must be integers (Sample.turn), got dtype {turns.dtype}")
    ta = combine_keys(t, a)
    order = np.lexsort((turns, ta))  # by (trajectory, agent), then turn
    sorted_ta, sorted_turn = ta[order], turns[order]
    same = sorted_ta[1:] == sorted_ta[:-1]
    dup = same & (sorted_turn[1:] == sorted_turn[:-1])
    if dup.any():
        i = int(order[1:][dup][0])
        raise ValueError(
            f"sample {i} repeats turn {int(turns[i])} of its agent in its trajectory: each (trajectory, agent, "
            "turn) must be one sample (a trajectory split into parts must keep one traj id and distinct turns)"
        )
    # position = index within its (trajectory, agent) run of the sorted order
    start = np.concatenate(([True], ~same))
    run_start = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n) - run_start
    return position

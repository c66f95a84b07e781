"""Property tests (Hypothesis) of the grouping invariants of `mas_train.advantages`, for every mode and scope.

Random batches: 1-4 task groups of 1-5 trajectories, each a random sequence of 1-5 turns of up to 3 agents,
scores from a grid (so equal scores, and hence zero stds, are common), trajectory ids that repeat across task
groups (as `traj_uid` may), random `min_turn_samples` and eps in {0, 1e-6}. Every call runs under
``np.errstate(divide="raise", invalid="raise")``: a division by zero anywhere fails the test.

The invariants: every sample lands in exactly one statistics group, the one a naive loop assigns it, and gets
that loop's advantage; advantages are finite; a task group of identical scores gives 0; per-agent statistics
never mix agents; permuting samples permutes advantages; a singleton gives 0 and never divides; a trajectory
counts once in the global statistics however many turns it has; a NaN score is refused, never propagated; the
Lemma 4.2 factor equals the mean of GRPO's A^2 per agent.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mas_train.advantages import MODES, SCOPES, STATS, compute_advantages_with_stats
from mas_train.lemma_stats import lemma_factors

# the modes computed from the batch alone (rae carries a baseline across steps: test_advantages_rae.py)
GROUP_MODES = tuple(m for m in MODES if m != "rae")

SCORES = (0.0, 1.0, 0.5, -0.1, 0.9, 0.25, 2.0)
AGENTS = ("solver", "verifier", "answerer")
# Few examples per test, the mode and scope drawn with the batch: the whole file stays a few seconds alone.
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
THOROUGH = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COMBOS = [(m, s) for m in GROUP_MODES for s in SCOPES if not (m == "grpo" and s == "turn")]
combos = st.sampled_from(COMBOS)


@st.composite
def batches(draw):
    """Columns (scores, group_ids, traj_ids, agent_ids, turn_ids) of one random batch."""
    n_agents = draw(st.integers(1, 3))
    rows = []
    for g in range(draw(st.integers(1, 4))):
        for t in range(draw(st.integers(1, 5))):
            for turn in range(draw(st.integers(1, 5))):
                agent = AGENTS[draw(st.integers(0, n_agents - 1))]
                rows.append((draw(st.sampled_from(SCORES)), f"task{g}", t, agent, turn))
    order = draw(st.permutations(range(len(rows))))
    rows = [rows[i] for i in order]
    return tuple(list(c) for c in zip(*rows, strict=True))


def run(cols, mode, scope, eps=1e-6, m=2, stats="paper"):
    s, g, t, a, turn = cols
    with np.errstate(divide="raise", invalid="raise"):
        return compute_advantages_with_stats(
            s, g, t, a, mode=mode, scope=scope, eps=eps, turn_ids=turn, min_turn_samples=m, stats=stats
        )


def _stats(values, stats="paper"):
    if stats == "reference" and len(values) == 1:
        return 0.0, 1.0  # the reference code's one-value rule
    mu = statistics.fmean(values)
    sd = statistics.stdev(values) if stats == "reference" else statistics.pstdev(values)
    return mu, (0.0 if sd <= 1e-12 * max(1.0, abs(mu)) else sd)


def reference(cols, mode, scope, eps, m, stats="paper"):
    """The formulas of docs/advantages.md as plain loops: (advantages, statistics key of each sample)."""
    s, g, t, a, turn = cols
    n = len(s)
    where = ["*"] * n if scope == "batch" else g
    traj = [(g[i], t[i]) for i in range(n)]  # a trajectory is (task group, traj id)
    traj_scores = defaultdict(list)
    for i in range(n):
        traj_scores[traj[i]].append(s[i])
    r = {k: statistics.fmean(v) for k, v in traj_scores.items()}
    glob = defaultdict(list)
    for k, v in r.items():
        glob["*" if scope == "batch" else k[0]].append(v)
    glob_stats = {k: _stats(v, stats) for k, v in glob.items()}
    turn_pool = defaultdict(list)  # every turn's score of the group (sigma_s of agent_mean)
    for i in range(n):
        turn_pool[where[i]].append(s[i])
    agent_pool = defaultdict(list)
    for i in range(n):
        agent_pool[(where[i], a[i])].append(s[i])
    key = [(where[i], a[i]) for i in range(n)]
    if scope == "turn":
        pos = [
            sorted(turn[j] for j in range(n) if traj[j] == traj[i] and a[j] == a[i]).index(turn[i])
            for i in range(n)
        ]
        cells = defaultdict(list)
        for i in range(n):
            cells[(g[i], a[i], pos[i])].append(s[i])
        key = [
            (g[i], a[i], pos[i]) if len(cells[(g[i], a[i], pos[i])]) >= m else (g[i], a[i], "fallback")
            for i in range(n)
        ]
    pools = {**{k: v for k, v in agent_pool.items()}}
    if scope == "turn":
        pools = {}
        for i in range(n):
            pools[key[i]] = cells[key[i]] if key[i][2] != "fallback" else agent_pool[(g[i], a[i])]
    adv = []
    for i in range(n):
        mu, sigma = glob_stats[where[i]]
        mu_k, sigma_k = _stats(pools[key[i]], stats)
        sigma_s = _stats(turn_pool[where[i]], stats)[1]
        num, div = {
            "grpo": (r[traj[i]] - mu, sigma),
            "drmas": (s[i] - mu_k, sigma_k),
            "agent_mean": (s[i] - mu_k, sigma_s),
            "agent_std": (s[i] - mu, sigma_k),
        }[mode]
        adv.append(0.0 if div == 0.0 else num / (div + eps))
    return np.array(adv), (where if mode == "grpo" else key)


@THOROUGH
@given(
    combo=combos,
    cols=batches(),
    eps=st.sampled_from([0.0, 1e-6]),
    m=st.integers(1, 4),
    stats=st.sampled_from(STATS),
)
def test_every_sample_lands_in_exactly_one_group_and_gets_the_reference_advantage(combo, cols, eps, m, stats):
    mode, scope = combo
    res = run(cols, mode, scope, eps, m, stats)
    expected, keys = reference(cols, mode, scope, eps, m, stats)
    assert res.advantages.shape == res.stat_group.shape == (len(cols[0]),)
    # the codes and the reference keys define the same partition of the samples
    pairs = set(zip(res.stat_group.tolist(), keys, strict=True))
    assert len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})
    np.testing.assert_allclose(res.advantages, expected, rtol=1e-9, atol=1e-9)
    assert np.isfinite(res.advantages).all()


@FAST
@given(combo=combos, cols=batches(), value=st.sampled_from(SCORES), which=st.integers(0, 3))
def test_a_task_group_of_identical_scores_gives_zero(combo, cols, value, which):
    mode, scope = combo
    s, g, *rest = cols
    target = sorted(set(g))[which % len(set(g))]
    s = [value if gi == target else si for si, gi in zip(s, g, strict=True)]
    res = run((s, g, *rest), mode, scope if scope != "batch" else "group")
    mine = np.array(g) == target
    assert (res.advantages[mine] == 0.0).all()
    assert res.zero_std[mine].all()


@FAST
@given(
    scope=st.sampled_from(SCOPES),
    cols=batches(),
    shift=st.sampled_from([0.5, -1.0, 3.0]),
    m=st.integers(1, 3),
)
def test_per_agent_statistics_never_mix_agents(scope, cols, shift, m):
    s, g, t, a, turn = cols
    victim = a[0]
    moved = [si + shift if ai == victim else si for si, ai in zip(s, a, strict=True)]
    before = run(cols, "drmas", scope, m=m)
    after = run((moved, g, t, a, turn), "drmas", scope, m=m)
    others = np.array(a) != victim
    np.testing.assert_array_equal(before.advantages[others], after.advantages[others])
    # and the statistics groups never hold two agents
    by_group = defaultdict(set)
    for code, agent in zip(before.stat_group.tolist(), a, strict=True):
        by_group[code].add(agent)
    assert all(len(v) == 1 for v in by_group.values())


@FAST
@given(combo=combos, data=st.data())
def test_permuting_samples_permutes_advantages(combo, data):
    mode, scope = combo
    cols = data.draw(batches())
    perm = data.draw(st.permutations(range(len(cols[0]))))
    shuffled = tuple([c[i] for i in perm] for c in cols)
    a = run(cols, mode, scope).advantages
    b = run(shuffled, mode, scope).advantages
    np.testing.assert_allclose(b, a[list(perm)], rtol=1e-12, atol=1e-12)


@FAST
@given(combo=combos, cols=batches(), score=st.sampled_from(SCORES), eps=st.sampled_from([0.0, 1e-6]))
def test_a_singleton_gives_zero_and_never_divides(combo, cols, score, eps):
    mode, scope = combo
    # add a task group with one trajectory of one turn by an agent of its own
    s, g, t, a, turn = (list(c) for c in cols)
    s.append(score), g.append("lonely"), t.append(0), a.append("judge"), turn.append(0)
    res = run((s, g, t, a, turn), mode, "group" if scope == "batch" else scope, eps)
    assert res.advantages[-1] == 0.0 and res.zero_std[-1]
    assert res.per_agent["judge"].zero_std_frac == 1.0


@FAST
@given(
    scope=st.sampled_from(("group", "batch")),
    cols=batches(),
    copies=st.integers(2, 4),
    which=st.integers(0, 50),
)
def test_a_trajectory_counts_once_however_many_turns_it_has(scope, cols, copies, which):
    """Repeating every turn of one trajectory (a trajectory split into parts, each a sample) leaves every GRPO
    advantage unchanged: the global statistics are over trajectories, not turns (miles #2378)."""
    s, g, t, a, turn = cols
    trajs = sorted(set(zip(g, t, strict=True)))
    tg, tt = trajs[which % len(trajs)]
    extra = [i for i in range(len(s)) if (g[i], t[i]) == (tg, tt)]
    rows = list(zip(s, g, t, a, turn, strict=True))
    for k in range(1, copies):
        rows += [(s[i], g[i], t[i], a[i], turn[i] + 100 * k) for i in extra]
    longer = tuple(list(c) for c in zip(*rows, strict=True))
    before = run(cols, "grpo", scope).advantages
    after = run(longer, "grpo", scope).advantages
    np.testing.assert_allclose(after[: len(s)], before, rtol=1e-12, atol=1e-12)


@FAST
@given(
    combo=combos,
    cols=batches(),
    where=st.integers(0, 1000),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
)
def test_a_nan_score_is_refused_not_propagated(combo, cols, where, bad):
    mode, scope = combo
    s, *rest = cols
    s = list(s)
    s[where % len(s)] = bad
    with pytest.raises(ValueError, match=r"scores contain 1 NaN/inf value\(s\), first at indices"):
        run((s, *rest), mode, scope)


@FAST
@given(cols=batches())
def test_lemma_factor_is_the_mean_of_grpo_a_squared_per_agent(cols):
    s, g, t, a, _ = cols
    adv = run(cols, "grpo", "group", eps=0.0).advantages
    res = run(cols, "grpo", "group", eps=0.0)
    lemma = lemma_factors(s, g, t, a)
    for agent in set(a):
        per_group = []
        for grp in sorted(set(g)):
            mine = (np.array(a) == agent) & (np.array(g) == grp)
            if mine.any() and not res.zero_std[mine].all():
                per_group.append(float(np.mean(adv[mine] ** 2)))
        if per_group:
            assert lemma[agent].factor == pytest.approx(statistics.fmean(per_group), rel=1e-9)
        else:
            assert math.isnan(lemma[agent].factor)

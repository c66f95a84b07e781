"""Metric names and their computation: step metrics of a rollout, env metrics, avg@k and pass@k.

Every metric a run logs is named here or by a function here, in fixed namespaces (cleanrl's habit):

* ``charts/…``: rollout statistics of a training step (:func:`rollout_metrics`);
* ``env/<name>``: the env's own per-episode metrics (``Outcome.metrics``), averaged over the step's
  episodes that report them (:func:`env_metrics`); evaluation logs them as ``eval/env/<name>``;
* ``losses/…``: per-model-group loss, entropy, clip ratios, KL and ``losses/group_grad_norm/<group>``;
  ``losses/grad_norm/<agent>`` is the gradient norm of that agent's samples alone;
* ``lemma/…``: the Lemma 4.2 statistics of the step's scores per agent;
* ``weights/…``: per model group, the weight version it trained at and its samples' version check
  (:meth:`~mas_train.hosting.worker.ModelGroupWorker.update`);
* ``diversity/…``: how many different first turns (and parsed answers) each agent wrote across a task's G
  samples (:func:`diversity_metrics`);
* ``eval/…``: evaluation (``mas_train.eval``); ``time/…``: seconds per phase of the step.

avg@k and pass@k over k sampled trajectories per task, overall and per data source:

One entry per *trajectory*: its task uid and whether it solved the task. With k trajectories per task:

* avg@k  = mean over tasks of the task's success rate (c / k);
* pass@k = mean over tasks of 1[at least one success] -- the plain k-sample estimate the Dr. MAS reference
  reports (``metric_utils.py::compute_pass_at_k_and_avg_at_k``);
* with ``unbiased=True``, pass@k uses the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374, eq. 1)
  from n >= k samples per task: ``1 - C(n - c, k) / C(n, k)``.

"Overall" averages over all tasks (each task weighs the same, whatever its data source), as the reference does.
Results are flat, log-ready dicts: ``{"pass@k": .., "<source>/pass@k": ..}``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mas_train.samples import RolloutBatch, Sample

__all__ = [
    "avg_at_k",
    "diversity_metrics",
    "env_metrics",
    "pass_at_k",
    "pass_at_k_and_avg_at_k",
    "rollout_metrics",
    "update_metrics",
    "unbiased_pass_at_k",
]


def env_metrics(per_episode: Sequence[Mapping[str, float]], prefix: str = "env/") -> dict[str, float]:
    """Mean of each env metric over the episodes that report it: ``{prefix + name: mean}``.

    Args:
        per_episode: one mapping per episode (``Trajectory.metrics``); an episode may leave a name out.
        prefix: ``"env/"`` for training steps, ``"eval/env/"`` for evaluation.
    """
    values: dict[str, list[float]] = defaultdict(list)
    for m in per_episode:
        for k, v in m.items():
            values[k].append(float(v))
    return {f"{prefix}{k}": float(np.mean(v)) for k, v in sorted(values.items())}


def update_metrics(group: str, out: Mapping[str, float]) -> dict[str, float]:
    """Names of one model group's update results (:meth:`~mas_train.grpo.update.GroupGRPOTrainer.update`):
    ``grad_norm/<agent>`` → ``losses/grad_norm/<agent>`` (that agent's samples alone, Fig. 4),
    ``mismatch/<stat>/<agent>`` → ``charts/sampling/mismatch/<stat>/<agent>`` (sampler vs trainer), ``grad_norm`` →
    ``losses/group_grad_norm/<group>``, loss / entropy / KL / clip ratios → ``losses/<name>/<group>``,
    ``learning_rate`` → ``charts/learning_rate/<group>``, ``weights/<name>`` (the worker's weight-version check:
    ``trained_at_version``, ``samples_checked``, ``stale_samples``) → ``weights/<name>/<group>``, anything else →
    ``charts/<name>/<group>``."""
    m: dict[str, float] = {}
    for k, v in out.items():
        if k.startswith("grad_norm/"):
            m[f"losses/grad_norm/{k.split('/', 1)[1]}"] = v
        elif k.startswith("mismatch/"):  # per agent: mismatch/<stat>/<agent>
            m[f"charts/sampling/{k}"] = v
        elif k == "grad_norm":
            m[f"losses/group_grad_norm/{group}"] = v
        elif k in ("loss", "entropy", "kl") or k.startswith("clip_ratio"):
            m[f"losses/{k}/{group}"] = v
        elif k.startswith("weights/"):  # the worker's weight-version check
            m[f"{k}/{group}"] = v
        else:
            m[f"charts/{k}/{group}"] = v
    return m


def rollout_metrics(batch: RolloutBatch, penalty: float) -> dict[str, float]:
    """Per-step rollout metrics of a :class:`~mas_train.rollout.RolloutBatch` (``charts/…`` and ``env/…``).

    ``charts/reward`` and ``charts/success_rate`` average over trajectories; ``charts/score`` averages the
    per-turn score ``s = R - c*invalid``; ``charts/invalid_rate`` is the fraction of turns judged malformed;
    ``charts/turns/<agent>`` is the mean number of that agent's turns per trajectory; ``charts/tokens/<agent>``
    the mean completion length of its turns; ``charts/truncated_rate/<agent>`` the fraction of its turns that hit
    ``max_new_tokens``; ``charts/prompt_tokens/<agent>`` its mean prompt length; ``charts/role_reward/<agent>`` the mean role score of
    its turns that have one (envs with role rewards, whatever the reward weights); ``env/<name>`` see
    :func:`env_metrics`.
    """
    trajs, samples = batch.trajectories, batch.samples
    nan = float("nan")
    m: dict[str, float] = {
        "charts/reward": float(np.mean([t.team_reward for t in trajs])) if trajs else nan,
        "charts/success_rate": float(np.mean([t.success for t in trajs])) if trajs else nan,
        "charts/turns": float(np.mean([t.num_turns for t in trajs])) if trajs else nan,
        "charts/invalid_rate": float(np.mean([s.invalid for s in samples])) if samples else nan,
        "charts/score": float(np.mean([s.score(penalty) for s in samples])) if samples else nan,
        "charts/num_samples": float(len(samples)),
        "charts/prompt_overflow": float(sum(batch.prompt_overflows.values())),
    }
    agents = sorted({a for t in trajs for a in t.turns_per_agent} | {s.agent for s in samples})
    for a in agents:
        mine = [s for s in samples if s.agent == a]
        m[f"charts/turns/{a}"] = float(np.mean([t.turns_per_agent.get(a, 0) for t in trajs]))
        if mine:
            m[f"charts/invalid_rate/{a}"] = float(np.mean([s.invalid for s in mine]))
            m[f"charts/tokens/{a}"] = float(np.mean([len(s.completion_ids) for s in mine]))
            m[f"charts/prompt_tokens/{a}"] = float(np.mean([len(s.prompt_ids) for s in mine]))
            m[f"charts/truncated_rate/{a}"] = float(np.mean([s.finish_reason == "length" for s in mine]))
            role = [s.role_reward for s in mine if s.role_reward is not None]
            if role:
                m[f"charts/role_reward/{a}"] = float(np.mean(role))
    m.update(env_metrics([t.metrics for t in trajs]))
    return m


def diversity_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """Per-agent diversity of a step's rollouts: has an agent's G samples of a task collapsed onto one answer?

    Definition. For each (task group, agent) take the agent's *first* turn (smallest ``Sample.turn``) in each
    trajectory of the group where it acted, n of them (n <= G, the group's ``num_generations``); a second or
    later turn of the agent in a trajectory is not compared, because it follows a different history. The
    agent that opens an episode sees the same prompt in all G trajectories (in every bundled env), so its
    count measures its own sampling; a later agent's first prompt also holds what its teammates said, so its
    count includes their diversity. Groups with n < 2 (the agent acted in at most one trajectory) are skipped.

    * ``diversity/distinct/<agent>``: the number of distinct completion token-id sequences among the n first
      turns, averaged over the step's kept groups: a float in [1, G]; 1 = every sample of a task is the same.
    * ``diversity/distinct_frac/<agent>``: per group distinct / n, averaged: 1.0 = all different, 1/G = all G
      collapsed onto one completion.
    * ``diversity/distinct_answers/<agent>``: the number of distinct *final* answers among the same n
      trajectories, averaged over the same groups. A trajectory's final answer is the parsed answer
      (``Sample.answer``, from the env's ``Transition.answer``) of the agent's *last* turn in it, the one the
      bundled envs grade (a math solver's last attempt, search's answer turn); "no answer" (``None``) counts as
      one value. Logged only when at least one of those final answers of the step is not ``None`` (so never
      for an agent whose env reports no answers).

    Args:
        samples: the step's samples (any order).

    Returns:
        The keys above for each agent with at least one kept group; ``{}`` when there is none.
    """
    # (task, agent) -> traj -> the agent's first / last turn in it
    first: dict[tuple[str, str], dict[str, Sample]] = defaultdict(dict)
    last: dict[tuple[str, str], dict[str, Sample]] = defaultdict(dict)
    for s in samples:
        a, b = first[(s.task_uid, s.agent)], last[(s.task_uid, s.agent)]
        if s.traj_uid not in a or s.turn < a[s.traj_uid].turn:
            a[s.traj_uid] = s
        if s.traj_uid not in b or s.turn > b[s.traj_uid].turn:
            b[s.traj_uid] = s
    distinct: dict[str, list[int]] = defaultdict(list)
    frac: dict[str, list[float]] = defaultdict(list)
    answers: dict[str, list[int]] = defaultdict(list)
    answered: set[str] = set()
    for key, by_traj in first.items():
        turns, agent = list(by_traj.values()), key[1]
        if len(turns) < 2:
            continue
        d = len({tuple(s.completion_ids) for s in turns})
        distinct[agent].append(d)
        frac[agent].append(d / len(turns))
        final = [s.answer for s in last[key].values()]
        answers[agent].append(len(set(final)))
        if any(x is not None for x in final):
            answered.add(agent)
    m: dict[str, float] = {}
    for agent in sorted(distinct):
        m[f"diversity/distinct/{agent}"] = float(np.mean(distinct[agent]))
        m[f"diversity/distinct_frac/{agent}"] = float(np.mean(frac[agent]))
        if agent in answered:
            m[f"diversity/distinct_answers/{agent}"] = float(np.mean(answers[agent]))
    return m


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task from n samples with c successes (Chen et al. 2021, eq. 1).

    ``1 - C(n-c, k) / C(n, k)``, computed as a product to stay exact for large n.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_and_avg_at_k(
    uids: Sequence[Hashable],
    successes: Sequence[bool | int | float],
    data_sources: Sequence[str] | None = None,
    *,
    k: int | None = None,
    unbiased: bool = False,
) -> dict[str, float]:
    """avg@k and pass@k, overall and per data source.

    Args:
        uids: ``(N,)`` task id of each trajectory.
        successes: ``(N,)`` whether each trajectory solved its task (bool, or 0/1).
        data_sources: ``(N,)`` data source of each trajectory (constant within a task), or None.
        k: samples per task. Default: the number of trajectories per task (which must then be equal for every
            task). The plain estimate needs exactly k per task; ``unbiased=True`` needs at least k.
        unbiased: use Chen et al.'s unbiased pass@k estimator instead of the plain k-sample estimate.

    Returns:
        ``{"avg@k": .., "pass@k": .., "<source>/avg@k": .., "<source>/pass@k": ..}`` with k the number, values
        in [0, 1]; the per-source keys only when ``data_sources`` is given. Empty input gives ``{}``.

    Raises:
        ValueError: inputs of different lengths, successes not 0/1, a task with two data sources, or task sizes
            that do not fit k (the message names the task).
    """
    n = len(uids)
    succ = np.asarray(successes, dtype=np.float64).reshape(-1)
    if succ.shape[0] != n:
        raise ValueError(f"successes has {succ.shape[0]} entries but uids has {n}; give one per trajectory")
    if data_sources is not None and len(data_sources) != n:
        raise ValueError(f"data_sources has {len(data_sources)} entries but uids has {n}")
    if not np.isin(succ, (0.0, 1.0)).all():
        raise ValueError(f"successes must be bool or 0/1, got {sorted(set(succ.tolist()) - {0.0, 1.0})[:5]}")
    if n == 0:
        return {}

    index: dict[Hashable, int] = {}
    codes = np.fromiter((index.setdefault(u, len(index)) for u in uids), dtype=np.int64, count=n)
    tasks = list(index)
    sizes = np.bincount(codes, minlength=len(tasks))
    correct = np.bincount(codes, weights=succ, minlength=len(tasks))

    if k is None:
        if len(set(sizes.tolist())) > 1:
            raise ValueError(
                f"tasks have different numbers of trajectories ({sorted(set(sizes.tolist()))}); pass k explicitly "
                "(with unbiased=True) or give every task the same number"
            )
        k = int(sizes[0])
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    wrong = np.flatnonzero(sizes < k if unbiased else sizes != k)
    if wrong.size:
        need = f"at least {k}" if unbiased else f"exactly {k} (or use unbiased=True)"
        raise ValueError(
            f"task {tasks[wrong[0]]!r} has {sizes[wrong[0]]} trajectories; pass@{k} needs {need}"
        )

    avg = correct / sizes
    if unbiased:
        passed = np.array(
            [unbiased_pass_at_k(int(m), int(c), k) for m, c in zip(sizes, correct, strict=True)]
        )
    else:
        passed = (correct > 0).astype(np.float64)

    out = {f"avg@{k}": float(avg.mean()), f"pass@{k}": float(passed.mean())}
    if data_sources is not None:
        task_source: dict[int, str] = {}
        for code, src in zip(codes.tolist(), data_sources, strict=True):
            if task_source.setdefault(code, src) != src:
                raise ValueError(
                    f"task {tasks[code]!r} has two data sources: {task_source[code]!r} and {src!r}"
                )
        sources = np.array([task_source[i] for i in range(len(tasks))], dtype=object)
        for src in dict.fromkeys(task_source.values()):
            mask = sources == src
            out[f"{src}/avg@{k}"] = float(avg[mask].mean())
            out[f"{src}/pass@{k}"] = float(passed[mask].mean())
    return out


def pass_at_k(
    uids: Sequence[Hashable],
    successes: Sequence[bool | int | float],
    data_sources: Sequence[str] | None = None,
    *,
    k: int | None = None,
    unbiased: bool = False,
) -> dict[str, float]:
    """pass@k overall and per data source: the ``pass@`` entries of :func:`pass_at_k_and_avg_at_k`.

    Example: uids ``[a, a, b, b]``, successes ``[1, 0, 0, 0]`` → ``{"pass@2": 0.5}``.
    """
    both = pass_at_k_and_avg_at_k(uids, successes, data_sources, k=k, unbiased=unbiased)
    return {key: v for key, v in both.items() if key.rsplit("/", 1)[-1].startswith("pass@")}


def avg_at_k(
    uids: Sequence[Hashable],
    successes: Sequence[bool | int | float],
    data_sources: Sequence[str] | None = None,
    *,
    k: int | None = None,
) -> dict[str, float]:
    """avg@k overall and per data source: the ``avg@`` entries of :func:`pass_at_k_and_avg_at_k`.

    Example: uids ``[a, a, b, b]``, successes ``[1, 0, 0, 0]`` → ``{"avg@2": 0.25}``.
    """
    both = pass_at_k_and_avg_at_k(uids, successes, data_sources, k=k)
    return {key: v for key, v in both.items() if key.rsplit("/", 1)[-1].startswith("avg@")}

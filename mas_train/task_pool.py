"""Which tasks a training step trains on: a task pool keyed by recent solve rate, and dynamic sampling.

**Signal per (model group, agent) cell.** Under Dr. MAS an agent learns from a task group only when its own
turn scores differ there (eq. 5: σ_k = 0 gives advantage 0), so one task group can carry signal for one agent
and none for another. :func:`group_signals` reads, per task group and trainable agent (the agent fixes its
model group, so the agent names the cell):

* the agent's **rewards, one per trajectory**: the mean of its turn scores in that trajectory, so an agent that
  acts three times in one trajectory is not counted three times (slime #2381);
* **signal**: their population std exceeds ``std_tol * max(1, |mean|)`` (a tolerance, since float rounding makes
  equal rewards look unequal; NeMo-RL #4158);
* **solve rate**: the fraction of those trajectories whose outcome reward for the agent (``Sample.team_reward``:
  the team's R, or the seat's own return in a game) is positive.

**Task pool** (:class:`TaskPool`, prime-rl's difficulty pools). Every training task has, per trainable agent, a
moving average of its solve rate, ``rate += ema * (new - rate)``, updated each time the task is rolled out. A
task's rate is that of its most informative cell (the agent whose rate is nearest 0.5: a task is "easy" only if it
is easy for every agent). Tasks never drawn form the ``unseen`` pool, taken in the data order of
:class:`~mas_train.tasks.TaskSampler`; a seen task belongs to the narrowest configured band ``[min, max]`` holding
its rate (ties: the first named). Each draw picks a pool with probability ``weight / Σ weights`` of the pools that
still hold a task, then a task uniformly within it (the unseen pool: its next task in data order); a step never
draws one task twice. By default saturated tasks (rate exactly 1 or 0) are drawn with weight 0.1 against 1 for
the rest: rarely, not never. The whole state (rates, the data position, the number of draws that seeds the
generator) is saved with each checkpoint, so a resumed run draws what an uninterrupted one would.

**Dynamic sampling** (:func:`collect_step`, DAPO §3.2 per cell): a step draws ``tasks_per_step`` tasks, rolls
them out, keeps the task groups with signal for at least one trainable cell and, while fewer than
``tasks_per_step`` were kept and fewer than ``max_rounds`` rollouts were made, draws ``ceil(missing *
oversample)`` more. The first ``tasks_per_step`` groups with signal, in draw order, are trained on; the step's
reward metrics still count every episode generated.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mas_train.samples import RolloutBatch, Sample
from mas_train.tasks import TaskSampler

if TYPE_CHECKING:
    from mas_train.config.sections import DynamicSamplingConfig, TaskPoolConfig
    from mas_train.league import League
    from mas_train.rollout import RolloutCollector

__all__ = ["CellSignal", "StepRollout", "TaskPool", "collect_step", "group_signals", "merge_batches"]

UNSEEN = "unseen"


@dataclass(frozen=True)
class CellSignal:
    """One trainable agent's view of one task group (see the module docstring).

    Attributes:
        trajectories: trajectories in which the agent acted.
        solve_rate: fraction of them whose outcome reward for the agent is positive, in [0, 1].
        signal: whether its per-trajectory rewards differ beyond the tolerance.
    """

    trajectories: int
    solve_rate: float
    signal: bool


def group_signals(
    samples: Sequence[Sample],
    scores: Sequence[float] | np.ndarray,
    agents: Sequence[str],
    *,
    std_tol: float = 1e-6,
) -> dict[str, dict[str, CellSignal]]:
    """Per task group (``Sample.task_uid``) and agent in ``agents``: its :class:`CellSignal`.

    Args:
        samples: one step's samples (N).
        scores: ``(N,)`` each turn's score (:func:`mas_train.scoring.turn_scores`), aligned with ``samples``.
        agents: the trainable agents; others are ignored.
        std_tol: relative tolerance of "constant" (module docstring).

    Returns:
        ``{task_uid: {agent: CellSignal}}``; an agent that did not act in a group is absent from it.

    Raises:
        ValueError: ``scores`` and ``samples`` differ in length.
    """
    if len(scores) != len(samples):
        raise ValueError(f"{len(scores)} scores for {len(samples)} samples; give one score per sample")
    wanted = set(agents)
    # (group, agent) -> traj -> [sum of scores, turns, positive outcome]
    per: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(dict)
    for s, score in zip(samples, scores, strict=True):
        if s.agent not in wanted:
            continue
        acc = per[(s.task_uid, s.agent)].setdefault(s.traj_uid, [0.0, 0.0, float(s.team_reward > 0)])
        acc[0] += float(score)
        acc[1] += 1.0
    out: dict[str, dict[str, CellSignal]] = defaultdict(dict)
    for (group, agent), trajs in per.items():
        rewards = np.array([v[0] / v[1] for v in trajs.values()])
        out[group][agent] = CellSignal(
            trajectories=len(trajs),
            solve_rate=float(np.mean([v[2] for v in trajs.values()])),
            signal=float(rewards.std()) > std_tol * max(1.0, abs(float(rewards.mean()))),
        )
    return dict(out)


class TaskPool:
    """Draws training tasks by their recent solve rate (module docstring).

    Args:
        tasks: the training rows (non-empty).
        seed: seeds the data order of unseen tasks and the draws.
        config: the run's ``task_pool`` settings (:class:`~mas_train.config.sections.TaskPoolConfig`).

    Raises:
        ValueError: no tasks.
    """

    def __init__(self, tasks: Sequence[Mapping[str, object]], seed: int, config: TaskPoolConfig) -> None:
        self.order = TaskSampler(tasks, seed=seed)
        self.tasks = self.order.tasks
        self.seed = seed
        self.ema = float(config.ema)
        self.weights = {UNSEEN: float(config.unseen_weight)}
        # narrowest band first; the sort is stable, so equal widths keep the configured order
        self.bands = sorted(config.pools.items(), key=lambda kv: kv[1].max - kv[1].min)
        self.weights.update({name: float(b.weight) for name, b in config.pools.items()})
        self.rates: dict[int, dict[str, float]] = {}
        self.draws = 0

    # -- membership ----------------------------------------------------------------------------------------
    def task_rate(self, index: int) -> float | None:
        """The rate of task ``index``: its most informative agent's moving average; ``None`` if never seen."""
        rates = self.rates.get(index)
        if not rates:
            return None
        return min(rates.values(), key=lambda r: (abs(r - 0.5), r))

    def pool_of(self, index: int) -> str | None:
        """``"unseen"``, the name of the narrowest band holding the task's rate, or ``None`` (in no band: not
        drawn)."""
        rate = self.task_rate(index)
        if rate is None:
            return UNSEEN
        for name, band in self.bands:
            if band.min <= rate <= band.max:
                return name
        return None

    def members(self, exclude: frozenset[int] = frozenset()) -> dict[str, list[int]]:
        """The seen tasks of each named pool (sorted indices), leaving out ``exclude``."""
        out: dict[str, list[int]] = {name: [] for name, _ in self.bands}
        for index in sorted(self.rates):
            pool = self.pool_of(index)
            if pool is not None and index not in exclude:
                out[pool].append(index)
        return out

    def _next_unseen(self, exclude: frozenset[int], consume: bool) -> int | None:
        """The next never-drawn task in data order (advancing the data position past seen ones when
        ``consume``), or ``None`` when every task has been seen."""
        n = len(self.tasks)
        start = self.order.consumed
        # the rest of this epoch, then all of the next: every task not yet taken is in one of them
        for k in range(2 * n - start % n):
            index = self.order.index_at(start + k)
            if index not in self.rates and index not in exclude:
                if consume:
                    self.order.consumed = start + k + 1
                return index
        return None

    def probabilities(self, exclude: frozenset[int] = frozenset()) -> dict[str, float]:
        """Probability that the next draw comes from each pool (pools without a task, or of weight 0, get 0)."""
        sizes = {name: len(m) for name, m in self.members(exclude).items()}
        sizes[UNSEEN] = int(self._next_unseen(exclude, consume=False) is not None)
        live = {p: self.weights[p] for p, size in sizes.items() if size and self.weights[p] > 0}
        total = sum(live.values())
        return {p: (live.get(p, 0.0) / total if total else 0.0) for p in sizes}

    # -- drawing and observing -----------------------------------------------------------------------------
    def next(self, n: int, exclude: frozenset[int] = frozenset()) -> list[tuple[int, dict[str, object]]]:
        """Draw ``n`` distinct tasks, none of ``exclude`` (those an earlier rollout of the same step drew):
        ``(index, row)`` pairs (fewer when fewer tasks can be drawn)."""
        rng = np.random.default_rng([self.seed, 0x7A5C, self.draws])
        self.draws += 1
        chosen: list[int] = []
        for _ in range(n):
            exclude = exclude | frozenset(chosen)
            probs = self.probabilities(exclude)
            pools = [p for p, q in probs.items() if q > 0]
            if not pools:
                break
            pool = pools[int(rng.choice(len(pools), p=np.array([probs[p] for p in pools])))]
            if pool == UNSEEN:
                index = self._next_unseen(exclude, consume=True)
                assert index is not None  # the pool was non-empty
            else:
                members = self.members(exclude)[pool]
                index = members[int(rng.integers(len(members)))]
            chosen.append(index)
        return [(i, dict(self.tasks[i])) for i in chosen]

    def observe(self, index: int, cells: Mapping[str, CellSignal]) -> None:
        """Fold one rollout of task ``index`` (its cells from :func:`group_signals`) into its moving averages."""
        rates = self.rates.setdefault(index, {})
        for agent, cell in cells.items():
            old = rates.get(agent)
            rates[agent] = cell.solve_rate if old is None else old + self.ema * (cell.solve_rate - old)

    def sizes(self) -> dict[str, int]:
        """Tasks per pool now (``unseen`` counts the tasks never drawn)."""
        out = {name: len(m) for name, m in self.members().items()}
        out[UNSEEN] = len(self.tasks) - len(self.rates)
        return out

    # -- checkpoints ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, object]:
        return {
            "order": self.order.state_dict(),
            "draws": self.draws,
            "rates": {int(i): dict(r) for i, r in self.rates.items()},
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore rates, data position and draw count.

        Raises:
            ValueError: the saved pool had another seed or task count (different data).
        """
        order = state["order"]
        rates = state["rates"]
        assert isinstance(order, Mapping) and isinstance(rates, Mapping)
        self.order.load_state_dict(order)
        self.draws = int(str(state["draws"]))
        self.rates = {int(i): {str(a): float(v) for a, v in r.items()} for i, r in rates.items()}


@dataclass
class StepRollout:
    """What :func:`collect_step` gathered for one step.

    Attributes:
        batch: the task groups to train on (every generated one when dynamic sampling is off).
        generated: every episode generated in the step (for the reward metrics).
        rows: the task rows trained on, in draw order.
        metrics: ``sampling/…`` and ``task_pool/…`` metrics (docs/training.md "Task pool").
    """

    batch: RolloutBatch
    generated: RolloutBatch
    rows: list[dict[str, object]]
    metrics: dict[str, float] = field(default_factory=dict)


def merge_batches(batches: Sequence[RolloutBatch]) -> RolloutBatch:
    """One :class:`RolloutBatch` of several (samples, trajectories and texts concatenated; counts and times
    summed)."""
    out = RolloutBatch(samples=[], trajectories=[])
    for b in batches:
        out.samples += b.samples
        out.trajectories += b.trajectories
        out.texts += b.texts
        for k, v in b.prompt_overflows.items():
            out.prompt_overflows[k] = out.prompt_overflows.get(k, 0) + v
        for k, v in b.generate_calls.items():
            out.generate_calls[k] = out.generate_calls.get(k, 0) + v
        out.ticks += b.ticks
        out.generate_seconds += b.generate_seconds
        out.env_seconds += b.env_seconds
    return out


def _keep(batch: RolloutBatch, uids: set[str]) -> RolloutBatch:
    """``batch`` cut to the task groups ``uids`` (counts and times unchanged: they were spent)."""
    keep = [i for i, t in enumerate(batch.trajectories) if t.task_uid in uids]
    return dataclasses.replace(
        batch,
        samples=[s for s in batch.samples if s.task_uid in uids],
        trajectories=[batch.trajectories[i] for i in keep],
        texts=[batch.texts[i] for i in keep] if batch.texts else [],
    )


def collect_step(
    collector: RolloutCollector,
    draw: TaskPool | TaskSampler,
    *,
    tasks_per_step: int,
    num_generations: int,
    step: int,
    score: Callable[[Sequence[Sample]], Sequence[float]],
    trainable_agents: Sequence[str],
    dynamic: DynamicSamplingConfig | None = None,
    league: League | None = None,
) -> StepRollout:
    """Draw and roll out one step's tasks (module docstring), updating the pool's solve rates.

    Args:
        collector: the run's rollout collector.
        draw: a :class:`TaskPool`, or the plain :class:`~mas_train.tasks.TaskSampler` (data order).
        tasks_per_step: task groups to train on.
        num_generations: G.
        step: the training step being collected (0-based), for seeds and ids.
        score: maps samples to their turn scores (:func:`mas_train.scoring.turn_scores` with the run's
            penalty and weights).
        trainable_agents: the agents whose groups train (the cells that count for signal).
        dynamic: dynamic sampling settings; ``None`` or not enabled: one rollout of ``tasks_per_step`` tasks, all
            kept (the step is then exactly the data-order step when ``draw`` is a ``TaskSampler``).
        league: a game's league (:mod:`mas_train.league`) draws each task group's opponents; ``None``: self-play
            of the run's own model in every seat.
    """
    on = dynamic is not None and dynamic.enabled
    tol = dynamic.std_tol if dynamic is not None else 1e-6
    rounds: list[RolloutBatch] = []
    kept: list[tuple[str, dict[str, object]]] = []  # (task uid, row) with signal, in draw order
    metrics: dict[str, float] = defaultdict(float)
    zero_cells: dict[str, list[float]] = defaultdict(list)
    missing = tasks_per_step
    taken: list[int] = []  # pool indices drawn by this step's rollouts: a step never draws a task twice
    max_rounds = dynamic.max_rounds if on and dynamic is not None else 1
    for r in range(max_rounds):
        n = missing if r == 0 or dynamic is None else math.ceil(missing * dynamic.oversample)
        if isinstance(draw, TaskPool):
            drawn = draw.next(n, exclude=frozenset(taken))
            taken.extend(i for i, _ in drawn)
        else:
            drawn = [(-1, row) for row in draw.next(n)]
        if not drawn:
            break
        prefix = f"{step}/" if r == 0 else f"{step}/r{r}/"
        rows = [row for _, row in drawn]
        at = step + 1_000_003 * r
        if league is None:  # (a collector without opponents, e.g. a test's fake, is called as before)
            batch = collector.collect(rows, num_generations, step=at, uid_prefix=prefix)
        else:
            batch = collector.collect(
                rows, num_generations, step=at, uid_prefix=prefix, opponents=league.draw(step, r)
            )
        rounds.append(batch)
        signals = group_signals(batch.samples, score(batch.samples), trainable_agents, std_tol=tol)
        for t_idx, (index, row) in enumerate(drawn):
            uid = f"{prefix}{t_idx}:{row.get('id', t_idx)}"
            cells = signals.get(uid, {})
            if isinstance(draw, TaskPool):
                draw.observe(index, cells)
            for agent, cell in cells.items():
                zero_cells[agent].append(float(not cell.signal))
            has_signal = any(c.signal for c in cells.values())
            metrics["sampling/groups_generated"] += 1
            if not has_signal:
                metrics["sampling/saturated_episodes"] += num_generations
            if not on or (has_signal and len(kept) < tasks_per_step):
                kept.append((uid, row))
        missing = tasks_per_step - len(kept)
        if not on or missing <= 0:
            break
    generated = merge_batches(rounds)
    uids = {uid for uid, _ in kept}
    batch = generated if not on else _keep(generated, uids)
    metrics["sampling/groups_kept"] = float(len(kept))
    metrics["sampling/episodes_generated"] = float(len(generated.trajectories))
    metrics["sampling/rounds"] = float(len(rounds))
    for agent, flags in zero_cells.items():
        metrics[f"sampling/zero_std_cells/{agent}"] = float(np.mean(flags))
    if isinstance(draw, TaskPool):
        for pool, size in draw.sizes().items():
            metrics[f"task_pool/size/{pool}"] = float(size)
    return StepRollout(batch=batch, generated=generated, rows=[row for _, row in kept], metrics=dict(metrics))

"""The task pool and dynamic sampling (mas_train.task_pool): signal per (model group, agent) cell with one
reward per trajectory and a std tolerance, pool probabilities by hand, the moving average, exact resume, and the
refill rule of dynamic sampling on a scripted collector."""

from __future__ import annotations

import numpy as np
import pytest

from mas_train.config import TrainConfig
from mas_train.config.common import ConfigError
from mas_train.config.sections import DynamicSamplingConfig, PoolBand, TaskPoolConfig
from mas_train.samples import RolloutBatch, Sample, Trajectory
from mas_train.task_pool import CellSignal, TaskPool, collect_step, group_signals
from mas_train.tasks import TaskSampler


def _s(task, traj, agent, r, turn=0, invalid=False):
    return Sample(
        task_uid=task,
        traj_uid=f"{task}/{traj}",
        agent=agent,
        model_group=agent,
        turn=turn,
        prompt_ids=[1],
        completion_ids=[2],
        sampling_logprobs=[-0.5],
        invalid=invalid,
        team_reward=r,
        success=r > 0,
        weight_version=0,
        finish_reason="stop",
        data_source="t",
    )


def _scores(samples, c=0.1):
    return [s.team_reward - c * s.invalid for s in samples]


# -- signal per cell ------------------------------------------------------------------------------------------
def test_one_reward_per_trajectory():
    # The verifier acts twice per trajectory, one of its two turns invalid (c = 0.1): its turn scores are
    # 1.0 and 0.9 in every trajectory (they differ turn by turn), but each trajectory's reward is 0.95: no signal.
    # Its solve rate counts each trajectory once: 3 of 4 trajectories succeeded for the solver.
    samples = []
    for t, r in enumerate([1.0, 1.0, 1.0, 0.0]):
        samples.append(_s("g", t, "solver", r))
    for t in range(4):
        samples += [
            _s("h", t, "verifier", 1.0, 1, invalid=t % 2 == 0),
            _s("h", t, "verifier", 1.0, 2, t % 2 == 1),
        ]
    sig = group_signals(samples, _scores(samples), ["solver", "verifier"])
    assert sig["g"] == {"solver": CellSignal(trajectories=4, solve_rate=0.75, signal=True)}
    assert sig["h"] == {"verifier": CellSignal(trajectories=4, solve_rate=1.0, signal=False)}
    # the turn scores themselves do differ: counted per turn, the group would look informative
    assert np.std([x for x in _scores(samples)[4:]]) == pytest.approx(0.05)


def test_an_agent_acting_more_often_in_failures_counts_once_per_trajectory():
    # fixer-like: acts 3 times in the failing trajectory, once in each success -> rate 3/4 (not 3/6)
    samples = [_s("g", 0, "fixer", 0.0, k) for k in range(3)] + [_s("g", t, "fixer", 1.0) for t in (1, 2, 3)]
    (cell,) = group_signals(samples, _scores(samples), ["fixer"])["g"].values()
    assert cell == CellSignal(trajectories=4, solve_rate=0.75, signal=True)


def test_std_tolerance():
    # float noise: rewards 1.0 and 1.0 + 1e-12 are equal within the default tolerance, different without one
    samples = [_s("g", t, "solver", 1.0) for t in range(4)]
    scores = [1.0, 1.0 + 1e-12, 1.0, 1.0]
    assert not group_signals(samples, scores, ["solver"])["g"]["solver"].signal
    assert group_signals(samples, scores, ["solver"], std_tol=0.0)["g"]["solver"].signal
    # relative to |mean|: std 0.5 at mean 1000 is below a tolerance of 1e-3 * 1000
    big = [1000.0, 1001.0, 1000.0, 1001.0]
    assert not group_signals(samples, big, ["solver"], std_tol=1e-3)["g"]["solver"].signal
    assert group_signals(samples, big, ["solver"], std_tol=1e-4)["g"]["solver"].signal


def test_untrainable_agents_are_not_cells():
    samples = [_s("g", t, "solver", float(t % 2)) for t in range(4)] + [
        _s("g", t, "judge", 1.0) for t in range(4)
    ]
    assert set(group_signals(samples, _scores(samples), ["judge"])["g"]) == {"judge"}
    with pytest.raises(ValueError, match="one score per sample"):
        group_signals(samples, [1.0], ["solver"])


# -- the pool -------------------------------------------------------------------------------------------------
TASKS = [{"id": f"t{i}", "question": str(i)} for i in range(5)]


def _pool(**kw):
    return TaskPool(TASKS, seed=3, config=TaskPoolConfig(enabled=True, **kw))


def _cells(**rates):
    return {a: CellSignal(trajectories=4, solve_rate=r, signal=0 < r < 1) for a, r in rates.items()}


def test_pool_probabilities_by_hand():
    pool = _pool()
    pool.observe(0, _cells(solver=1.0))  # easy
    pool.observe(1, _cells(solver=0.0))  # hard
    pool.observe(2, _cells(solver=0.5))  # normal
    assert pool.sizes() == {"easy": 1, "hard": 1, "normal": 1, "unseen": 2}
    # weights unseen 1, normal 1, easy 0.1, hard 0.1: total 2.2
    probs = pool.probabilities()
    assert probs == pytest.approx(
        {"unseen": 1 / 2.2, "normal": 1 / 2.2, "easy": 0.1 / 2.2, "hard": 0.1 / 2.2}
    )
    # without task 2 the normal pool is empty: unseen 1 / 1.2, easy and hard 0.1 / 1.2 each
    probs = pool.probabilities(exclude=frozenset({2}))
    assert probs == pytest.approx({"unseen": 1 / 1.2, "normal": 0.0, "easy": 0.1 / 1.2, "hard": 0.1 / 1.2})
    # the first draw of each step follows those probabilities: task 2 (alone in normal) 0.4545, task 0 0.0455
    counts = np.zeros(5)
    for _ in range(4000):
        index, _row = pool.next(1)[0]
        counts[index] += 1
    assert counts[2] / 4000 == pytest.approx(1 / 2.2, abs=0.03)
    assert counts[0] / 4000 == pytest.approx(0.1 / 2.2, abs=0.012)
    assert (counts[3] + counts[4]) / 4000 == pytest.approx(1 / 2.2, abs=0.03)


def test_moving_average_and_most_informative_cell():
    pool = _pool(ema=0.5)
    pool.observe(0, _cells(solver=1.0))
    pool.observe(0, _cells(solver=0.0))
    assert pool.rates[0] == {"solver": 0.5}
    pool.observe(0, _cells(solver=1.0))
    assert pool.rates[0] == {"solver": 0.75}
    # one agent saturated, the other not: the task's rate is the informative one, so it is not "easy"
    pool.observe(1, _cells(solver=1.0, verifier=0.625))
    assert pool.task_rate(1) == 0.625 and pool.pool_of(1) == "normal"
    # always solved stays exactly 1.0 (rate += ema * (1 - 1)) and lands in the narrow band, not in normal
    for _ in range(5):
        pool.observe(2, _cells(solver=1.0))
    assert pool.task_rate(2) == 1.0 and pool.pool_of(2) == "easy"


def test_a_rate_in_no_band_is_never_drawn():
    pool = _pool(unseen_weight=0.0, pools={"mid": PoolBand(0.2, 0.8, 1.0)})
    pool.observe(0, _cells(solver=1.0))
    pool.observe(1, _cells(solver=0.5))
    assert pool.pool_of(0) is None and pool.pool_of(1) == "mid"
    assert {pool.next(1)[0][0] for _ in range(20)} == {1}


def test_unseen_tasks_come_in_data_order_and_a_step_never_repeats_a_task():
    pool = _pool()
    plain = TaskSampler(TASKS, seed=3)
    assert [row for _, row in pool.next(5)] == plain.next(5)
    assert pool.sizes()["unseen"] == 5  # drawn is not seen: only observe() makes a task seen
    pool = _pool()
    for i in range(5):
        pool.observe(i, _cells(solver=0.5))
    drawn = [i for i, _ in pool.next(5)]
    assert sorted(drawn) == [0, 1, 2, 3, 4]
    assert len(pool.next(9)) == 5  # only 5 distinct tasks exist


def test_pool_resumes_exactly():
    a = _pool()
    for step in range(3):
        for i, _ in a.next(2):
            a.observe(i, _cells(solver=(i * 0.3 + step * 0.2) % 1.0))
    state = a.state_dict()
    b = _pool()
    b.load_state_dict(state)
    for _ in range(4):
        da, db = a.next(2), b.next(2)
        assert da == db
        for i, _ in da:
            a.observe(i, _cells(solver=0.5))
            b.observe(i, _cells(solver=0.5))
    assert a.rates == b.rates
    other = TaskPool(TASKS[:4], seed=3, config=TaskPoolConfig(enabled=True))
    with pytest.raises(ValueError, match="same seed and train_data"):
        other.load_state_dict(state)


def test_config_is_checked():
    with pytest.raises(ConfigError, match="ema must be in"):
        TaskPoolConfig(enabled=True, ema=0.0)
    with pytest.raises(ConfigError, match="0 <= min <= max <= 1"):
        PoolBand(0.8, 0.2, 1.0)
    with pytest.raises(ConfigError, match="no task could be drawn"):
        TaskPoolConfig(enabled=True, unseen_weight=0.0, pools={"easy": PoolBand(1.0, 1.0, 0.0)})
    with pytest.raises(ConfigError, match="oversample must be >= 1"):
        DynamicSamplingConfig(enabled=True, oversample=0.5)
    # a setting of a section that is off would do nothing: refused, naming the switch
    with pytest.raises(
        ConfigError, match=r"^dynamic_sampling.max_rounds is set but dynamic_sampling.enabled"
    ):
        DynamicSamplingConfig(max_rounds=5)
    with pytest.raises(ConfigError, match=r"^task_pool.ema is set but task_pool.enabled is false"):
        TrainConfig.from_dict({"task_pool": {"ema": 0.3}})
    assert DynamicSamplingConfig(std_tol=1e-3).std_tol == 1e-3  # also decides the logged zero-std cells
    cfg = TrainConfig.from_dict({"task_pool": {"enabled": True, "pools": {"easy": {"weight": 0.3}}}})
    assert cfg.task_pool.pools["easy"] == PoolBand(1.0, 1.0, 0.3)
    assert cfg.task_pool.pools["normal"] == PoolBand(0.0, 1.0, 1.0)


# -- dynamic sampling -----------------------------------------------------------------------------------------
class _Collector:
    """Each task row's ``rewards`` are its G trajectories' team rewards; one solver turn per trajectory."""

    def __init__(self):
        self.calls = []

    def collect(self, tasks, num_generations, *, step=0, uid_prefix=""):
        self.calls.append(([t["id"] for t in tasks], step, uid_prefix))
        samples, trajs = [], []
        for t_idx, row in enumerate(tasks):
            uid = f"{uid_prefix}{t_idx}:{row['id']}"
            for g, r in enumerate(row["rewards"][:num_generations]):
                samples.append(_s(uid, g, "solver", r))
                trajs.append(Trajectory(uid, f"{uid}/{g}", "t", r, r > 0, 1, {"solver": 1}))
        return RolloutBatch(samples=samples, trajectories=trajs, ticks=1, generate_seconds=1.0)


ROWS = [
    {"id": "A", "rewards": [1, 1, 1, 1]},  # saturated
    {"id": "B", "rewards": [1, 0, 1, 0]},  # signal
    {"id": "C", "rewards": [0, 0, 0, 0]},  # saturated
    {"id": "D", "rewards": [0, 1, 1, 1]},  # signal
    {"id": "E", "rewards": [0, 1, 0, 0]},  # signal
]


def _step(dynamic, draw=None, tasks_per_step=2):
    col = _Collector()
    got = collect_step(
        col,
        draw or TaskSampler(ROWS, shuffle=False),
        tasks_per_step=tasks_per_step,
        num_generations=4,
        step=5,
        score=_scores,
        trainable_agents=["solver"],
        dynamic=dynamic,
    )
    return col, got


def test_dynamic_sampling_refills_the_step_with_groups_that_have_signal():
    col, got = _step(DynamicSamplingConfig(enabled=True, oversample=1.5, max_rounds=3))
    # round 0: A, B (B kept); 1 missing -> ceil(1.5) = 2 more: C, D (D kept); then full
    assert col.calls == [(["A", "B"], 5, "5/"), (["C", "D"], 5 + 1_000_003, "5/r1/")]
    assert [r["id"] for r in got.rows] == ["B", "D"]
    assert {s.task_uid for s in got.batch.samples} == {"5/1:B", "5/r1/1:D"}
    assert len(got.batch.trajectories) == 8 and len(got.generated.trajectories) == 16
    assert got.metrics["sampling/groups_generated"] == 4
    assert got.metrics["sampling/groups_kept"] == 2
    assert got.metrics["sampling/episodes_generated"] == 16
    assert got.metrics["sampling/rounds"] == 2
    assert got.metrics["sampling/saturated_episodes"] == 8  # A and C, 4 episodes each
    assert got.metrics["sampling/zero_std_cells/solver"] == 0.5


def test_dynamic_sampling_stops_at_max_rounds_and_keeps_only_the_first_groups():
    col, got = _step(DynamicSamplingConfig(enabled=True, oversample=1.0, max_rounds=2), tasks_per_step=3)
    # round 0: A B C -> B; round 1: 2 missing x 1.0 = D E -> both; full at 3
    assert [r["id"] for r in got.rows] == ["B", "D", "E"]
    col, got = _step(DynamicSamplingConfig(enabled=True, oversample=1.0, max_rounds=1), tasks_per_step=3)
    assert [r["id"] for r in got.rows] == ["B"] and got.metrics["sampling/rounds"] == 1


def test_without_dynamic_sampling_every_group_is_kept():
    col, got = _step(None)
    assert col.calls == [(["A", "B"], 5, "5/")]
    assert got.batch is got.generated and [r["id"] for r in got.rows] == ["A", "B"]
    assert got.metrics["sampling/saturated_episodes"] == 4


def test_the_pool_learns_solve_rates_from_the_step():
    pool = TaskPool(ROWS, seed=0, config=TaskPoolConfig(enabled=True))
    col, got = _step(DynamicSamplingConfig(enabled=True), draw=pool)
    # round 0 draws C (no signal) and E; round 1 must not draw E again although it is now a seen "normal" task
    assert [ids for ids, _step_seed, _prefix in col.calls] == [["C", "E"], ["D", "A"]]
    assert [r["id"] for r in got.rows] == ["E", "D"]
    assert {ROWS[i]["id"]: pool.task_rate(i) for i in pool.rates} == {
        "A": 1.0,
        "C": 0.0,
        "D": 0.75,
        "E": 0.25,
    }
    assert pool.sizes() == {"easy": 1, "hard": 1, "normal": 2, "unseen": 1}
    assert got.metrics["task_pool/size/unseen"] == 1

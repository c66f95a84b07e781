"""Per-agent reward weights: role scores reach the samples, the default weights leave every score bit-identical,
a zero weight ignores the role score, and a role weight the env cannot honour is refused before any model."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _train_fakes import ScriptGenerator  # noqa: E402

import mas_envs  # noqa: E402
from mas_envs.envs.math import prompts  # noqa: E402
from mas_train.advantages import compute_advantages  # noqa: E402
from mas_train.backends.base import SamplingParams  # noqa: E402
from mas_train.config import ConfigError, RewardWeights, TrainConfig  # noqa: E402
from mas_train.rollout import RolloutCollector, Sample  # noqa: E402
from mas_train.scoring import turn_scores  # noqa: E402
from mas_train.startup import check_reward_weights  # noqa: E402

# Task a: the solver's first answer (6) is wrong, the verifier rightly rejects, the retry (5) is right.
# Task b: the first answer (6) is right, the verifier wrongly rejects, the retry (5) is wrong.
TASKS = [
    {"id": "a", "question": "What is 2 + 3?", "answer": "5"},
    {"id": "b", "question": "What is 2 + 4?", "answer": "6"},
]


@pytest.fixture(scope="module")
def batch():
    from mas_train.models import build_qwen_tokenizer

    tok = build_qwen_tokenizer()

    def reply(text, sp):
        if prompts.VERIFIER_SYSTEM in text:
            return "Checked. <verify>reject</verify>"
        # the second attempt sees the team history
        return "so \\boxed{5}" if prompts.HISTORY_HEADER in text else "so \\boxed{6}"

    col = RolloutCollector(
        lambda: mas_envs.make("math-2agent"),
        generators={"g": ScriptGenerator(tok, reply)},
        tokenizers={"g": tok},
        agent_groups={"solver": "g", "verifier": "g"},
        sampling={a: SamplingParams(max_new_tokens=8) for a in ("solver", "verifier")},
    )
    return col.collect(TASKS, 2)


def test_role_scores_reach_every_sample(batch):
    got = [(s.task_uid, s.agent, s.turn, s.team_reward, s.role_reward) for s in batch.samples]
    per_traj_a = [("solver", 0, 1.0, 0.0), ("verifier", 1, 1.0, 1.0), ("solver", 2, 1.0, 1.0)]
    per_traj_b = [("solver", 0, 0.0, 1.0), ("verifier", 1, 0.0, 0.0), ("solver", 2, 0.0, 0.0)]
    for uid, rows in (("0:a", per_traj_a), ("1:b", per_traj_b)):
        mine = sorted((x[1:] for x in got if x[0] == uid), key=lambda r: r[1])
        assert mine == sorted(rows * 2, key=lambda r: r[1])


def _old_scores(samples, c):
    return [s.team_reward - c * float(s.invalid) for s in samples]


def test_default_weights_are_bit_identical_to_the_team_score(batch):
    samples = [*batch.samples, *(_sample(r, inv, None) for r in (0.0, 1.0, -0.0, 0.3) for inv in (0, 1))]
    default = {a: RewardWeights() for a in ("solver", "verifier")}
    for c in (0.1, 0.0, 0.37):
        for weights in (default, {}, {"solver": RewardWeights(team=1.0, role=0.0)}):
            new = np.array(turn_scores(samples, c, weights))
            assert new.tobytes() == np.array(_old_scores(samples, c)).tobytes()
    # the advantages the trainer computes from them are bit-identical too
    cols = (
        [s.task_uid for s in batch.samples],
        [s.traj_uid for s in batch.samples],
        [s.agent for s in batch.samples],
    )
    a_new = compute_advantages(turn_scores(batch.samples, 0.1, default), *cols)
    a_old = compute_advantages(_old_scores(batch.samples, 0.1), *cols)
    assert a_new.tobytes() == a_old.tobytes()


def _sample(team, invalid, role, agent="verifier"):
    return Sample(
        "t", "t/0", agent, "g", 1, [1], [2], [-0.1], bool(invalid), team, bool(team), 0, "stop", "x", role
    )


def test_a_role_score_with_weight_zero_changes_nothing_even_nan():
    for role in (None, 1.0, 0.0, float("nan"), float("inf")):
        s = _sample(1.0, True, role)
        assert s.score(0.1, 1.0, 0.0) == 1.0 - 0.1
        assert turn_scores([s], 0.1, {"verifier": RewardWeights(team=1.0, role=0.0)}) == [0.9]


def test_weighted_scores_by_hand(batch):
    weights = {"solver": RewardWeights(team=0.5, role=2.0), "verifier": RewardWeights(team=1.0, role=1.0)}
    scores = turn_scores(batch.samples, 0.1, weights)
    got = sorted({(s.task_uid, s.agent, s.turn, v) for s, v in zip(batch.samples, scores, strict=True)})
    assert got == [
        ("0:a", "solver", 0, 0.5 * 1 + 2.0 * 0),  # R = 1, wrong attempt
        ("0:a", "solver", 2, 0.5 * 1 + 2.0 * 1),  # right retry
        ("0:a", "verifier", 1, 1.0 + 1.0),  # right reject
        ("1:b", "solver", 0, 0.5 * 0 + 2.0 * 1),  # R = 0, right first attempt
        ("1:b", "solver", 2, 0.0),
        ("1:b", "verifier", 1, 0.0),  # wrong reject, team lost
    ]
    # a turn without a role score counts 0 for the role term; the penalty still applies
    assert _sample(1.0, True, None).score(0.1, 2.0, 3.0) == pytest.approx(2.0 - 0.1)
    assert _sample(1.0, False, 0.5).score(0.1, 0.0, 3.0) == 1.5


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "x"])
def test_bad_weights_are_refused(bad):
    with pytest.raises(ConfigError, match=r"reward_weights\.role must be a finite number >= 0"):
        RewardWeights(team=1.0, role=bad)


def _resolved(env, agents):
    cfg = TrainConfig.from_dict({"env": env, "agents": agents})
    probe = mas_envs.make(env)
    return cfg.resolve(list(probe.possible_agents)), probe


def test_a_role_weight_the_env_cannot_honour_is_refused_in_one_line():
    resolved, probe = _resolved("math-1agent", {"solver": {"reward_weights": {"role": 0.5}}})
    with pytest.raises(ConfigError) as err:
        check_reward_weights(resolved, probe)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(
        "agents.solver.reward_weights.role is 0.5, but env 'math-1agent' gives no role scores;"
    )
    # a team weight alone needs no role score; a role weight for a role-scored agent is fine
    check_reward_weights(*_resolved("math-1agent", {"solver": {"reward_weights": {"team": 2.0}}}))
    resolved, probe = _resolved("math-2agent", {"verifier": {"reward_weights": {"team": 1.0, "role": 1.0}}})
    check_reward_weights(resolved, probe)
    assert resolved.agents["verifier"].reward_weights == RewardWeights(team=1.0, role=1.0)
    assert resolved.agents["solver"].reward_weights == RewardWeights(team=1.0, role=0.0)


def test_prepare_refuses_it_before_loading_tasks_or_models():
    from mas_train.startup import prepare

    cfg = TrainConfig.from_dict({"env": "math-1agent", "agents": {"solver": {"reward_weights": {"role": 1}}}})
    with pytest.raises(
        ConfigError, match=r"^agents\.solver\.reward_weights\.role is 1, but env 'math-1agent'"
    ):
        prepare(cfg)


def test_the_trainer_scores_with_the_agents_weights_and_passes_turn_ids(
    tmp_path, tiny_qwen3_path, monkeypatch
):
    """One real train_step: the advantages see w_team*R + w_role*role_reward per turn and the samples' turns."""
    import zlib

    from _train_fakes import PARITY_TASKS, ParityEnv

    import mas_train.advantages as advantages
    from mas_envs.core import Outcome, wrap
    from mas_train.assemble import assemble_trainer

    class RoleParity(ParityEnv):
        role_reward_agents = ("verifier",)

        def episode_outcome(self):
            r = (zlib.crc32(self.last_answer.encode("utf-8", "surrogatepass")) % 1000) / 999
            verifier_turns = [e.turn for e in self.transcript if e.speaker == "verifier"]
            return Outcome(r, r > 0.5, role_rewards=dict.fromkeys(verifier_turns, 0.25))

    seen = {}
    real = advantages.compute_advantages_with_stats

    def spy(*cols, **kw):
        seen["cols"], seen["kw"] = cols, kw
        return real(*cols, **kw)

    import mas_train.trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "compute_advantages_with_stats", spy)  # the name the loop calls
    cfg = TrainConfig.from_dict(
        dict(
            env="parity",
            model=tiny_qwen3_path,
            model_sharing="shared",
            num_generations=2,
            tasks_per_step=1,
            max_steps=1,
            output_dir=str(tmp_path),
            run_name="run",
            sampling={"max_new_tokens": 4},
            advantage_scope="turn",
            agents={"verifier": {"reward_weights": {"team": 2.0, "role": 4.0}}},
        )
    )
    tr = assemble_trainer(
        cfg.resolve(["solver", "verifier"]),
        env_factory=lambda: wrap(RoleParity()),
        train_tasks=PARITY_TASKS,
    )
    try:
        captured = []
        orig = tr.collector.collect

        def collect(*a, **kw):
            batch = orig(*a, **kw)
            captured.append(batch)
            return batch

        tr.collector.collect = collect
        metrics, _ = tr.train_step()
        samples = captured[0].samples
        c = tr.penalty
        expected = [
            (2.0 * s.team_reward + 4.0 * 0.25 if s.agent == "verifier" else s.team_reward)
            - c * float(s.invalid)
            for s in samples
        ]
        assert any(s.agent == "verifier" for s in samples)
        assert [s.role_reward for s in samples if s.agent == "verifier"] == [0.25] * sum(
            s.agent == "verifier" for s in samples
        )
        np.testing.assert_allclose(seen["cols"][0], expected, rtol=0, atol=1e-15)
        assert seen["kw"]["scope"] == "turn" and seen["kw"]["turn_ids"] == [s.turn for s in samples]
        assert seen["kw"]["min_turn_samples"] == 2
        assert metrics["charts/role_reward/verifier"] == 0.25
    finally:
        tr.close()


def test_grpo_in_a_game_normalises_each_seats_own_return():
    """Two Kuhn hands of one deal: (a) check, bet, call, player_0 loses 2; (b) bet, fold, player_0 wins 1. Each
    seat's turns form their own trajectory, so GRPO's r_i are the seat returns -2, +2, +1, -1 (mu 0, sigma
    sqrt(2.5)). Averaged over both seats' turns r_a would be -2/3 and the winning player_1 would get A = -1."""
    from mas_train.samples import Trajectory
    from mas_train.scoring import advantage_columns

    def turn(traj, agent, t, r):
        return Sample("d", traj, agent, agent, t, [1], [2], [-0.1], False, r, True, 0, "stop", "kuhn-poker")

    samples = [
        turn("a", "player_0", 1, -2.0),
        turn("a", "player_1", 2, 2.0),
        turn("a", "player_0", 3, -2.0),
        turn("b", "player_0", 1, 1.0),
        turn("b", "player_1", 2, -1.0),
    ]
    rewards = {"a": {"player_0": -2.0, "player_1": 2.0}, "b": {"player_0": 1.0, "player_1": -1.0}}
    trajs = [Trajectory("d", u, "kuhn-poker", 0.0, True, 3, {}, agent_rewards=rewards[u]) for u in "ab"]
    cols = advantage_columns(samples, trajs, 0.0, {})
    assert cols[2] == ["a|player_0", "a|player_1", "a|player_0", "b|player_0", "b|player_1"]
    x = 1 / np.sqrt(2.5)
    assert compute_advantages(*cols, mode="grpo") == pytest.approx([-2 * x, 2 * x, -2 * x, x, -x], abs=1e-5)
    # a team env's trajectory (no agent_rewards) stays whole: eq. 2 as written
    team = [Trajectory("d", u, "kuhn-poker", 0.0, True, 3, {}) for u in "ab"]
    cols = advantage_columns(samples, team, 0.0, {})
    assert cols[2] == ["a", "a", "a", "b", "b"]
    assert compute_advantages(*cols, mode="grpo") == pytest.approx([-1, -1, -1, 1, 1], abs=1e-5)

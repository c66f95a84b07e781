"""RolloutCollector: lock-step batching, one backend call per model group per tick, ids kept as generated."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _train_fakes import ScriptEnv, ScriptGenerator, make_script_env  # noqa: E402

from mas_envs.core import wrap  # noqa: E402
from mas_train.backends.base import SamplingParams  # noqa: E402
from mas_train.rollout import RolloutCollector, render_prompt  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from mas_train.models import build_qwen_tokenizer

    return build_qwen_tokenizer()


TASKS = [
    {"id": "t0", "question": "What is 6*7?", "answer": "42", "data_source": "toy"},
    {"id": "t1", "question": "What is 3+4?", "answer": "7", "data_source": "toy2"},
]


def approve_all(text, sp):
    if "Verify." in text:
        return "<verify>approve</verify>"
    return "<answer>42</answer>" if sp.seed % 2 == 0 else "<answer>7</answer>"


def collector(tok, gens, groups, **kw):
    return RolloutCollector(
        make_script_env,
        generators=gens,
        tokenizers={g: tok for g in gens},
        agent_groups=groups,
        sampling={"solver": SamplingParams(max_new_tokens=8), "verifier": SamplingParams(max_new_tokens=8)},
        **kw,
    )


def test_one_call_per_group_per_tick_shared(tok):
    gen = ScriptGenerator(tok, approve_all)
    col = collector(tok, {"shared": gen}, {"solver": "shared", "verifier": "shared"})
    batch = col.collect(TASKS, 4, step=3)
    # tick 1: the 8 solver turns together, tick 2: the 8 verifier turns together
    assert gen.calls == [8, 8]
    assert batch.ticks == 2 and batch.generate_calls == {"shared": 2}
    assert len(batch.samples) == 16 and len(batch.trajectories) == 8
    assert [t.task_uid for t in batch.trajectories] == ["0:t0"] * 4 + ["1:t1"] * 4
    assert len({t.traj_uid for t in batch.trajectories}) == 8
    for t in batch.trajectories:
        assert t.turns_per_agent == {"solver": 1, "verifier": 1} and t.num_turns == 2
    # the outcome is broadcast to every turn of its trajectory and matches the solver's answer
    by_traj = {}
    for s in batch.samples:
        by_traj.setdefault(s.traj_uid, []).append(s)
    for traj in batch.trajectories:
        turns = by_traj[traj.traj_uid]
        solver = next(s for s in turns if s.agent == "solver")
        answer = "42" if traj.task_uid.endswith("t0") else "7"
        expected = answer in tok.decode(solver.completion_ids)
        assert traj.success == expected and traj.team_reward == float(expected)
        assert all(s.team_reward == float(expected) and s.success == expected for s in turns)
        assert [s.turn for s in turns] == [0, 1]
        assert all(s.data_source == ("toy" if answer == "42" else "toy2") for s in turns)


def test_one_call_per_group_per_tick_two_groups(tok):
    a, b = ScriptGenerator(tok, approve_all), ScriptGenerator(tok, approve_all)
    col = collector(tok, {"A": a, "B": b}, {"solver": "A", "verifier": "B"})
    batch = col.collect(TASKS, 3)
    assert a.calls == [6] and b.calls == [6]
    assert {s.model_group for s in batch.samples if s.agent == "solver"} == {"A"}
    assert {s.model_group for s in batch.samples if s.agent == "verifier"} == {"B"}


def test_ids_are_kept_as_generated_not_retokenised(tok):
    """The generator returns a non-canonical tokenisation (one token per character); re-encoding the decoded text
    would give other ids, so equality proves the collector keeps the backend's ids."""

    class CharGen(ScriptGenerator):
        def generate(self, prompt_ids, sampling):
            outs = super().generate(prompt_ids, sampling)
            for o in outs:
                text = self.tok.decode(o.completion_ids)
                o.completion_ids = [self.tok.convert_tokens_to_ids(c) for c in text]
                o.logprobs = [-float(i + 1) for i in range(len(o.completion_ids))]
            return outs

    gen = CharGen(
        tok, lambda text, sp: "<verify>approve</verify>" if "Verify." in text else "<answer>42</answer>"
    )
    col = collector(tok, {"g": gen}, {"solver": "g", "verifier": "g"})
    batch = col.collect(TASKS[:1], 1)
    solver = batch.samples[0]
    chars = [tok.convert_tokens_to_ids(c) for c in "<answer>42</answer>"]
    assert solver.completion_ids == chars
    assert solver.completion_ids != tok.encode("<answer>42</answer>", add_special_tokens=False)
    assert solver.sampling_logprobs == [-float(i + 1) for i in range(len(chars))]
    # prompt ids are the chat-template rendering of the env's messages
    env = make_script_env()
    env.reset(options={"task": TASKS[0]})
    assert solver.prompt_ids == render_prompt(tok, env.infos["solver"]["messages"])
    assert tok.decode(solver.prompt_ids).endswith("What is 6*7?<|im_end|>\n<|im_start|>assistant\n")


def test_stop_strings_and_seeds_per_request(tok):
    seen = []

    def reply(text, sp):
        seen.append(sp)
        return approve_all(text, sp)

    col = collector(tok, {"g": ScriptGenerator(tok, reply)}, {"solver": "g", "verifier": "g"}, seed=5)
    col.collect(TASKS, 2, step=1)
    solver_sps, verifier_sps = seen[:4], seen[4:]
    assert all(sp.stop == ("</answer>",) and sp.max_new_tokens == 8 for sp in solver_sps)
    assert all(sp.stop == ("</verify>",) for sp in verifier_sps)
    assert len({sp.seed for sp in seen}) == 8  # distinct per env and turn
    # same step and seed -> same request seeds (a resumed run samples the same)
    seen2 = []
    col2 = collector(
        tok,
        {"g": ScriptGenerator(tok, lambda t, sp: seen2.append(sp) or approve_all(t, sp))},
        {"solver": "g", "verifier": "g"},
        seed=5,
    )
    col2.collect(TASKS, 2, step=1)
    assert [sp.seed for sp in seen2] == [sp.seed for sp in seen]


def test_lockstep_with_uneven_episode_lengths(tok):
    """Verifiers reject on odd seeds: those envs need two more ticks, the others are done after two."""

    def reply(text, sp):
        if "Verify." in text:
            return "<verify>reject</verify>" if sp.seed % 2 else "<verify>approve</verify>"
        return "<answer>42</answer>"

    gen = ScriptGenerator(tok, reply)
    col = collector(tok, {"g": gen}, {"solver": "g", "verifier": "g"})
    batch = col.collect(TASKS, 4)
    n_reject = sum(1 for t in batch.trajectories if t.num_turns == 4)
    assert 0 < n_reject < 8  # both kinds occur with these seeds
    assert gen.calls == [8, 8, n_reject, n_reject]
    for t in batch.trajectories:
        turns = sorted((s.turn, s.agent) for s in batch.samples if s.traj_uid == t.traj_uid)
        expect = [(0, "solver"), (1, "verifier")] + (
            [(2, "solver"), (3, "verifier")] if t.num_turns == 4 else []
        )
        assert turns == expect


def test_invalid_flag_and_score(tok):
    gen = ScriptGenerator(tok, lambda t, sp: "<verify>approve</verify>" if "Verify." in t else "42 no tags")
    batch = collector(tok, {"g": gen}, {"solver": "g", "verifier": "g"}).collect(TASKS[:1], 2)
    solver = [s for s in batch.samples if s.agent == "solver"]
    verifier = [s for s in batch.samples if s.agent == "verifier"]
    assert all(s.invalid for s in solver) and not any(s.invalid for s in verifier)
    # R = 1 (the answer text contains 42), c = 0.1
    assert [s.score(0.1) for s in solver] == [pytest.approx(0.9)] * 2
    assert [s.score(0.1) for s in verifier] == [1.0, 1.0]


def test_agent_that_never_acts_has_no_samples(tok):
    gen = ScriptGenerator(tok, approve_all)
    tasks = [dict(TASKS[0], skip_verifier=True)]
    batch = collector(tok, {"g": gen}, {"solver": "g", "verifier": "g"}).collect(tasks, 3)
    assert gen.calls == [3]
    assert {s.agent for s in batch.samples} == {"solver"}
    assert all(t.turns_per_agent == {"solver": 1} for t in batch.trajectories)


def test_prompt_over_the_cap_is_skipped_and_counted(tok):
    gen = ScriptGenerator(tok, approve_all)
    col = collector(tok, {"g": gen}, {"solver": "g", "verifier": "g"}, max_prompt_length=5)
    batch = col.collect(TASKS[:1], 2)
    assert gen.calls == []  # nothing reached the model
    assert batch.samples == []
    # each env: the solver's empty action is invalid, then the verifier's too, and the episode ends
    assert batch.prompt_overflows == {"solver": 2, "verifier": 2}
    assert all(t.num_turns == 2 and t.team_reward == 0.0 for t in batch.trajectories)


def test_unknown_agent_group_is_rejected(tok):
    with pytest.raises(ValueError, match="no generator"):
        collector(tok, {"g": ScriptGenerator(tok, approve_all)}, {"solver": "g", "verifier": "missing"})


def test_runaway_env_raises(tok):
    gen = ScriptGenerator(
        tok, lambda t, sp: "<verify>reject</verify>" if "Verify." in t else "<answer>1</answer>"
    )
    col = RolloutCollector(
        lambda: make_script_env(max_loops=10_000),
        {"g": gen},
        {"g": tok},
        {"solver": "g", "verifier": "g"},
        {},
        max_ticks=6,
    )
    with pytest.raises(RuntimeError, match="max_ticks"):
        col.collect(TASKS[:1], 1)


def test_env_metrics_reach_trajectories_and_step_metrics(tok):
    # The env-metrics contract: Outcome.metrics -> infos["episode_metrics"] -> Trajectory.metrics -> env/<name>
    # means over the episodes that report a name (an episode may leave one out).
    from _train_fakes import ScriptEnv

    from mas_envs.core import Outcome
    from mas_envs.core import wrap as wrap_env
    from mas_train.metrics import rollout_metrics

    class MetricEnv(ScriptEnv):
        def episode_outcome(self):
            base = super().episode_outcome()
            m = {"answer_len": float(len(self.last_answer))}
            if base.success:
                m["solved_bonus"] = 1.0
            return Outcome(base.team_reward, base.success, metrics=m)

    col = RolloutCollector(
        lambda: wrap_env(MetricEnv()),
        generators={"shared": ScriptGenerator(tok, approve_all)},
        tokenizers={"shared": tok},
        agent_groups={"solver": "shared", "verifier": "shared"},
        sampling={"solver": SamplingParams(max_new_tokens=8), "verifier": SamplingParams(max_new_tokens=8)},
    )
    batch = col.collect(TASKS, 2, step=0)
    lens = [t.metrics["answer_len"] for t in batch.trajectories]
    assert len(lens) == 4 and all(x > 0 for x in lens)
    solved = [t for t in batch.trajectories if t.success]
    assert all(t.metrics.get("solved_bonus") == 1.0 for t in solved)
    assert all("solved_bonus" not in t.metrics for t in batch.trajectories if not t.success)
    m = rollout_metrics(batch, 0.1)
    assert m["env/answer_len"] == pytest.approx(sum(lens) / 4)
    assert m.get("env/solved_bonus") == (1.0 if solved else None)


def test_each_seat_of_a_zero_sum_game_is_scored_with_its_own_return(tok):
    """kuhn-poker declares per_agent_rewards: its team reward is the seats' mean (0), so a collector that scored
    every turn with it would train on nothing. Deal K to player_0, J to player_1; both always bet / call:
    player_0 bets, player_1 calls, K wins the pot of 4: +2 for player_0, -2 for player_1."""
    import mas_envs

    def always_aggressive(text, sp):
        return "<move>call</move>" if "call" in text.split("Legal moves")[-1] else "<move>bet</move>"

    gen = ScriptGenerator(tok, always_aggressive)
    col = RolloutCollector(
        lambda **kw: mas_envs.make("kuhn-poker", **kw),
        generators={"g": gen},
        tokenizers={"g": tok},
        agent_groups={"player_0": "g", "player_1": "g"},
        sampling={a: SamplingParams(max_new_tokens=8) for a in ("player_0", "player_1")},
    )
    batch = col.collect([{"id": "KJ", "question": "deal", "cards": ["K", "J"], "data_source": "kuhn"}], 2)
    assert {(s.agent, s.team_reward) for s in batch.samples} == {("player_0", 2.0), ("player_1", -2.0)}
    assert all(not s.invalid for s in batch.samples)
    assert [t.team_reward for t in batch.trajectories] == [0.0, 0.0]


def test_eval_seed_ids_by_hand():
    from mas_train.eval import eval_seed_ids

    # tasks 6, 7 sit in the block starting at 0, tasks 8, 9 in the block starting at 8 (EVAL_SEED_BLOCK = 8)
    assert eval_seed_ids(-1, 6, 4, 2) == [
        (-100_003, 12),
        (-100_003, 13),
        (-100_003, 14),
        (-100_003, 15),
        (-100_011, 0),
        (-100_011, 1),
        (-100_011, 2),
        (-100_011, 3),
    ]
    with pytest.raises(ValueError, match="k >= 1"):
        eval_seed_ids(-1, 0, 3, 0)


def test_seed_ids_of_another_length_are_refused(tok):
    col = collector(tok, {"g": ScriptGenerator(tok, approve_all)}, {"solver": "g", "verifier": "g"})
    with pytest.raises(ValueError, match="seed_ids has 3 entries for 4 episodes"):
        col.collect(TASKS, 2, seed_ids=[(0, 0), (0, 1), (0, 2)])


def test_evaluation_seeds_do_not_depend_on_tasks_per_batch(tok):
    """An episode's seeds are a function of its task's place in the set: batching 3, 8 or all 20 tasks at a
    time rolls out the same requests and scores the same; batch 8 keeps the old code's batch-8 seeds (seed step
    ``-100_003 - start``, index in the batch), so evaluations measured at 8 keep theirs."""
    from mas_train.eval import evaluate
    from mas_train.prompts import request_seed

    tasks = [dict(TASKS[i % 2], id=f"t{i}") for i in range(20)]

    def run(per_batch):
        seen = []

        def reply(text, sp):
            seen.append((text, sp.seed))
            return approve_all(text, sp)

        class Recorded(ScriptEnv):
            def reset(self, seed=None, options=None):
                seen.append((options["task"]["id"], seed))  # the env's reset seed, by task
                return super().reset(seed=seed, options=options)

        col = RolloutCollector(
            lambda: wrap(Recorded()),
            generators={"g": ScriptGenerator(tok, reply)},
            tokenizers={"g": tok},
            agent_groups={"solver": "g", "verifier": "g"},
            sampling={
                "solver": SamplingParams(max_new_tokens=8),
                "verifier": SamplingParams(max_new_tokens=8),
            },
            seed=5,
        )
        out = evaluate(col, tasks, k=3, tasks_per_batch=per_batch, exact=False)
        return sorted(seen), {key: v for key, v in out.items() if key != "eval/seconds"}

    seen8, out8 = run(8)
    assert run(3) == (seen8, out8)
    assert run(20) == (seen8, out8)
    assert 0.0 < out8["eval/avg@3"] < 1.0  # the seeds decide the answers, so a changed seed changes the score
    # task 10, episode 2, turn 0 (its solver turn) in the old batch-8 layout: step -100_003 - 8, index 2 * 3 + 2
    old = request_seed(5, -100_003 - 8, 8, 0)
    assert sum(s == old for _, s in seen8) == 1

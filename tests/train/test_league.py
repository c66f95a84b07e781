"""The league (mas_train.league): the opponent mix's probabilities by hand, seeded draws, scripted opponents in the
collector (their turns give no samples; the learner's returns against perfect minimax), config refusals, and a
real tiny-Qwen3 Kuhn run whose snapshots are frozen copies of the adapter, saved and put back by a resume."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from _train_fakes import ScriptGenerator
from transformers import AutoTokenizer

import mas_envs
from mas_train.backends.base import SamplingParams
from mas_train.config.common import ConfigError
from mas_train.config.sections import LeagueConfig
from mas_train.league import League
from mas_train.rollout import RolloutCollector

TTT = ("player_1", "player_2")


@pytest.fixture(scope="module")
def tok(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def _league(cfg, seats=TTT, game="tictactoe-v0", seed=0):
    return League(cfg, seats, game, seed, pool=None, agent_groups={}, trainable=[], lora_cfgs={})


def _collector(env, gen, tok, **kw):
    """A collector of ``env`` whose seats all sample from the fake ``gen`` (8 new tokens, temperature 1)."""
    seats = mas_envs.make(env).possible_agents
    return RolloutCollector(
        lambda: mas_envs.make(env),
        generators={"g": gen},
        tokenizers={"g": tok},
        agent_groups={a: "g" for a in seats},
        sampling={a: SamplingParams(max_new_tokens=8, temperature=1.0) for a in seats},
        **kw,
    )


def test_weights_are_the_configured_mix_and_snapshots_count_only_once_one_exists():
    league = _league(LeagueConfig(enabled=True, self_play=0.5, snapshots=0.3, scripted={"random": 0.2}))
    assert league.weights() == pytest.approx({"self": 0.5 / 0.7, "random": 0.2 / 0.7})
    league.snapshots = [4]
    assert league.weights() == pytest.approx({"self": 0.5, "snapshot": 0.3, "random": 0.2})
    two = _league(LeagueConfig(enabled=True, self_play=0, snapshots=0, scripted={"random": 1, "minimax": 3}))
    assert two.weights() == {"random": 0.25, "minimax": 0.75}


def test_draws_are_seeded_follow_the_weights_and_give_the_opponent_every_seat_but_the_learners():
    league = _league(
        LeagueConfig(enabled=True, self_play=0.5, snapshots=0, scripted={"random": 0.25, "minimax": 0.25})
    )
    first = league.draw(3, 0)
    again = league.draw(3, 0)
    kinds = Counter()
    learners = Counter()
    for t in range(4000):
        seats = first(t)
        assert {s: o.name for s, o in seats.items()} == {s: o.name for s, o in again(t).items()}
        if not seats:
            kinds["self"] += 1
            continue
        assert len(seats) == 1 and len({o.name for o in seats.values()}) == 1
        kinds[next(iter(seats.values())).name] += 1
        learners[next(s for s in TTT if s not in seats)] += 1
    assert kinds["self"] / 4000 == pytest.approx(0.5, abs=0.03)
    assert kinds["random"] / 4000 == pytest.approx(0.25, abs=0.03)
    assert kinds["minimax"] / 4000 == pytest.approx(0.25, abs=0.03)
    assert learners["player_1"] / sum(learners.values()) == pytest.approx(0.5, abs=0.04)
    # another step draws afresh
    other = league.draw(4, 0)
    assert [bool(other(t)) for t in range(50)] != [bool(first(t)) for t in range(50)]


def _first_legal(text, sp):
    moves = re.findall(r"Legal moves: ([0-9, ]+)", text)[-1]
    return f"<move>{moves.split(',')[0].strip()}</move>"


def test_scripted_minimax_plays_its_seat_without_samples_and_the_naive_learner_never_wins(tok):
    """The learner plays the first legal cell. As X it loses to perfect minimax in every game (X1 O5 X2 O3 X4,
    then O has a forced win); as O it never wins. Opponent turns are in the transcript as played by minimax and
    never in the samples."""
    gen = ScriptGenerator(tok, _first_legal)
    col = _collector("tictactoe", gen, tok)
    league = _league(LeagueConfig(enabled=True, self_play=0, snapshots=0, scripted={"minimax": 1.0}))
    tasks = [{"id": f"g{i}", "question": "play", "data_source": "tictactoe"} for i in range(6)]
    batch = col.collect(tasks, 2, step=1, opponents=league.draw(1, 0))
    learner_x = 0
    for traj, text in zip(batch.trajectories, batch.texts, strict=True):
        (foe_seat,) = traj.opponents
        assert traj.opponents == {foe_seat: "minimax"}
        me = next(s for s in TTT if s != foe_seat)
        mine = [s for s in batch.samples if s.traj_uid == traj.traj_uid]
        assert mine and all(s.agent == me for s in mine)
        assert len(mine) == traj.turns_per_agent[me]
        played = [e for e in text.events if e.speaker == foe_seat]
        assert played and all(e.played_by == "minimax" and not e.skipped for e in played)
        assert traj.agent_rewards[me] <= 0.0 and traj.agent_rewards[foe_seat] == -traj.agent_rewards[me]
        if me == "player_1":
            learner_x += 1
            assert traj.agent_rewards[me] == -1.0
            assert [e.text for e in text.events if e.speaker == me][:3] == [
                "<move>1</move>",
                "<move>2</move>",
                "<move>4</move>",
            ]
    assert 0 < learner_x < len(batch.trajectories)
    got = league.metrics(batch.trajectories)
    want = sum(t.agent_rewards[next(s for s in TTT if s not in t.opponents)] for t in batch.trajectories) / 12
    assert got == pytest.approx(
        {"league/episodes/minimax": 1.0, "league/return/minimax": want, "league/snapshots": 0}
    )


def test_league_config_refusals():
    with pytest.raises(ConfigError, match="league.self_play is set but league.enabled is false"):
        LeagueConfig(self_play=0.9)
    with pytest.raises(ConfigError, match="no opponent"):
        LeagueConfig(enabled=True, self_play=0, scripted={})
    with pytest.raises(ConfigError, match="finite weight"):
        LeagueConfig(enabled=True, scripted={"random": -1})
    with pytest.raises(ConfigError, match="snapshot_every"):
        LeagueConfig(enabled=True, snapshot_every=0)


def test_mas_train_refuses_a_league_on_a_team_env_and_an_opponent_of_another_game(tmp_path):
    from mas_train.config import TrainConfig
    from mas_train.startup import prepare

    base = dict(output_dir=str(tmp_path), eval_steps=0, max_steps=1)
    with pytest.raises(ConfigError, match="not a game"):
        prepare(TrainConfig.from_dict(dict(base, env="math-2agent", league={"enabled": True})))
    with pytest.raises(ConfigError, match="plays tictactoe only"):
        prepare(
            TrainConfig.from_dict(
                dict(base, env="kuhn-poker", league={"enabled": True, "scripted": {"minimax": 1}})
            )
        )


def _adapter(model, name):
    from mas_train import lora

    part = re.compile(rf"(\.lora_[A-Za-z_]+\.){re.escape(name)}\.")
    return {part.sub(r"\g<1>X.", n): p.detach().clone() for n, p in lora.adapter_state(model, name).items()}


def test_tiny_qwen3_kuhn_league_snapshots_are_frozen_copies_kept_and_resumed(tmp_path, tiny_qwen3_path):
    """A real kuhn-poker trainer (shared_lora, one adapter per seat), snapshot every step, 2 kept: a snapshot
    equals its group's adapter when taken, stays frozen (requires_grad False, unchanged by later updates), the
    oldest is deleted beyond max_snapshots, later task groups play it (league/episodes/snapshot), and a checkpoint
    resumed into a fresh trainer has the same snapshots, tensor for tensor, and draws the same opponents. (The
    tiny model's moves are illegal, so its advantages are 0 here; tests/train/test_trainer.py covers updates.)"""
    pytest.importorskip("trl")
    from mas_train import lora
    from mas_train.assemble import assemble_trainer
    from mas_train.config import TrainConfig
    from mas_train.league import League

    seats = ("player_0", "player_1")
    deals = [
        {"id": f"kuhn-poker/{a}{b}", "question": "deal", "cards": [a, b], "data_source": "kuhn-poker"}
        for a, b in (("K", "J"), ("Q", "K"), ("J", "Q"))
    ]
    cfg = TrainConfig.from_dict(
        dict(
            env="kuhn-poker",
            model=tiny_qwen3_path,
            num_generations=2,
            tasks_per_step=2,
            max_steps=3,
            output_dir=str(tmp_path),
            run_name="run",
            sampling={"max_new_tokens": 6},
            eval_steps=0,
            model_sharing="shared_lora",
            lora={"r": 4, "alpha": 8},
            learning_rate=1e-2,
            league={"enabled": True, "self_play": 0, "snapshots": 1.0, "scripted": {"random": 0.001},
                    "snapshot_every": 1, "max_snapshots": 2},
        )
    )  # fmt: skip

    def build():
        return assemble_trainer(
            cfg.resolve(list(seats)),
            env_factory=lambda: mas_envs.make("kuhn-poker"),
            train_tasks=deals,
            eval_tasks=None,
        )

    tr = build()
    try:
        model = tr.pool.worker("player_0").backend.model
        m1, _ = tr.train_step()
        assert tr.league.snapshots == [1] and m1["league/episodes/random"] == 1.0
        snap1 = {g: _adapter(model, League.adapter(1, g)) for g in seats}
        for g in seats:
            assert snap1[g].keys() == _adapter(model, g).keys()
            for n, t in _adapter(model, g).items():
                assert torch.equal(snap1[g][n], t)
            for n, p in model.named_parameters():
                if f".{League.adapter(1, g)}." in n:
                    assert not p.requires_grad
        m2, _ = tr.train_step()
        assert m2["league/episodes/snapshot"] == 1.0 and tr.league.snapshots == [1, 2]
        for g in seats:
            for n, t in _adapter(model, League.adapter(1, g)).items():
                assert torch.equal(snap1[g][n], t)
        # a snapshot is a copy, not a view of the learner's tensors, and no optimizer holds it (the tiny model's
        # moves are all illegal, so its advantages are 0 and an update would not show it)
        with torch.no_grad():
            for g in seats:
                for p in lora.adapter_state(model, g).values():
                    p.add_(1.0)
        for g in seats:
            assert all(torch.equal(snap1[g][n], t) for n, t in _adapter(model, League.adapter(1, g)).items())
            opt = tr.pool.worker(g).policy.trainer.optimizer
            held = {id(p) for group in opt.param_groups for p in group["params"]}
            assert not held & {id(p) for p in lora.adapter_state(model, League.adapter(1, g)).values()}
        tr.train_step()
        assert tr.league.snapshots == [2, 3]
        assert League.adapter(1, "player_0") not in model.peft_config
        kept = {(at, g): _adapter(model, League.adapter(at, g)) for at in (2, 3) for g in seats}
        ckpt = tr.save_checkpoint()
        draws = [{s: o.name for s, o in tr.league.draw(3, 0)(t).items()} for t in range(8)]
    finally:
        tr.close()
    again = build()
    try:
        again.load_checkpoint(ckpt)
        assert again.league.snapshots == [2, 3]
        model = again.pool.worker("player_0").backend.model
        for (at, g), want in kept.items():
            got = _adapter(model, League.adapter(at, g))
            assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
        assert [{s: o.name for s, o in again.league.draw(3, 0)(t).items()} for t in range(8)] == draws
    finally:
        again.close()


def test_a_game_evaluates_on_its_own_deals_and_keeps_training_on_them(tmp_path):
    """Kuhn poker's tasks are its 6 deals (starting positions): with no eval_data, evaluation plays them and
    training keeps all 6 (nothing is held out). (An env without the flag and with no eval set is still asked for
    one: tests/train/test_user_errors.py.)"""
    from mas_train.config import TrainConfig
    from mas_train.startup import prepare

    plan = prepare(
        TrainConfig.from_dict(
            dict(env="kuhn-poker", output_dir=str(tmp_path), eval_steps=5, eval_num_tasks=6)
        )
    )
    deals = sorted(str(t["id"]) for t in plan.train_tasks)
    assert deals == [f"kuhn-poker/{a}{b}" for a, b in ("JK", "JQ", "KJ", "KQ", "QJ", "QK")]
    assert plan.eval_tasks == plan.train_tasks and plan.warnings == []


def test_versus_minimax_the_naive_learner_never_wins_and_loses_every_game_as_x(tok):
    """eval/vs/<opponent>/...: the first-legal-cell learner in both seats against perfect minimax, 3 games per seat:
    it never wins, loses all 3 as X (so loss >= 0.5), and its mean return is exactly -loss (+1/0/-1 rewards)."""
    from mas_train.eval import evaluate, versus

    gen = ScriptGenerator(tok, _first_legal)
    col = _collector("tictactoe", gen, tok)
    tasks = [{"id": "start", "question": "play", "data_source": "tictactoe"}]
    got = versus(col, tasks, ["minimax"], k=3)
    assert set(got) == {f"eval/vs/minimax/{k}" for k in ("win", "draw", "loss", "return")}
    assert got["eval/vs/minimax/win"] == 0.0 and got["eval/vs/minimax/loss"] >= 0.5
    assert got["eval/vs/minimax/draw"] + got["eval/vs/minimax/loss"] == pytest.approx(1.0)
    assert got["eval/vs/minimax/return"] == pytest.approx(-got["eval/vs/minimax/loss"])
    again = versus(col, tasks, ["minimax"], k=3)  # seeded: the same games again
    assert again == got
    full = evaluate(col, tasks, k=2, opponents=["minimax"], exact=False)
    assert {k: v for k, v in full.items() if k.startswith("eval/vs/")} == versus(col, tasks, ["minimax"], k=2)


def test_versus_plays_the_same_games_under_any_evaluation_batching(tok):
    """The learner's cell is drawn by its request seed and the random opponent by its own per-task seed: batching
    the 11 tasks 3, 8 or 11 at a time plays the very same moves (same prompts and seeds) and the same results."""
    from mas_train.eval import versus

    def by_seed(text, sp):
        moves = re.findall(r"Legal moves: ([0-9, ]+)", text)[-1].split(",")
        return f"<move>{moves[sp.seed % len(moves)].strip()}</move>"

    tasks = [{"id": f"g{i}", "question": "play", "data_source": "tictactoe"} for i in range(11)]

    def run(per_batch):
        seen = []
        gen = ScriptGenerator(tok, lambda text, sp: seen.append((text, sp.seed)) or by_seed(text, sp))
        got = versus(
            _collector("tictactoe", gen, tok, seed=3), tasks, ["random"], k=2, tasks_per_batch=per_batch
        )
        return sorted(seen), got

    seen8, got8 = run(8)
    assert 0.0 < got8["eval/vs/random/win"] < 1.0  # the seeds decide the games
    assert run(3) == (seen8, got8)
    assert run(11) == (seen8, got8)


def test_eval_opponents_are_refused_on_a_team_env_and_checked_against_the_game(tmp_path):
    from mas_train.config import TrainConfig
    from mas_train.startup import prepare

    base = dict(output_dir=str(tmp_path), eval_steps=0, max_steps=1)
    with pytest.raises(ConfigError, match="eval_opponents: env 'math-2agent' is not a game"):
        prepare(TrainConfig.from_dict(dict(base, env="math-2agent", eval_opponents=["random"])))
    with pytest.raises(ConfigError, match="plays kuhn-poker only"):
        prepare(TrainConfig.from_dict(dict(base, env="tictactoe", eval_opponents=["equilibrium"])))


def test_a_snapshot_plays_a_frozen_groups_seat_with_that_groups_own_weights(tok):
    """A group that does not train has no snapshot adapter: its seat is played by the group itself."""
    from mas_train.opponents import OpponentTurn, SnapshotOpponent

    class Pool:
        def __init__(self, worker):
            self.w = worker

        def worker(self, group):
            return self.w

    frozen = ScriptGenerator(tok, lambda text, sp: "<move>call</move>")
    frozen.tokenizer, frozen.wants_messages = tok, False
    env = mas_envs.make("kuhn-poker")
    env.reset(seed=0, options={"task": {"question": "deal", "cards": ["Q", "K"]}})
    env.step("<move>bet</move>")
    opp = SnapshotOpponent({}, Pool(frozen), {"player_1": "frozen"})
    turn = OpponentTurn(env, "player_1", env.infos["player_1"]["messages"], SamplingParams(max_new_tokens=8))
    assert opp.play([turn]) == ["<move>call</move>"] and frozen.calls == [1]
    # with legal_moves_only the frozen seat chooses among its legal moves too, scored by the group itself (free
    # text "Kuhn poker is" would be illegal): 'fold' scores log 0.99, 'call' log 0.01, so T = 0 folds
    import math

    prose = ScriptGenerator(tok, lambda text, sp: "Kuhn poker is")
    prose.tokenizer, prose.wants_messages = tok, False
    prose.score = lambda prompts, comps: [
        [math.log(0.99 if "fold" in tok.decode(c) else 0.01)] + [0.0] * (len(c) - 1) for c in comps
    ]
    greedy = OpponentTurn(env, "player_1", env.infos["player_1"]["messages"], SamplingParams(temperature=0.0))
    only = SnapshotOpponent({}, Pool(prose), {"player_1": "frozen"}, legal_moves_only=True)
    assert only.play([greedy]) == ["<move>fold</move>"] and prose.calls == []


def test_the_plain_kuhn_run_is_self_play_with_a_league_on_all_six_deals():
    from mas_train.config.args import parse_args

    cfg = parse_args(["--env", "kuhn-poker"])
    assert cfg.league.enabled and cfg.league.snapshot_every == 5 and cfg.league.scripted == {"random": 0.2}
    assert (cfg.tasks_per_step, cfg.eval_num_tasks, cfg.num_generations, cfg.model_sharing) == (
        6,
        6,
        8,
        "shared_lora",
    )
    assert cfg.env_kwargs == {"move_hint": "choices"} and cfg.sampling.max_new_tokens == 8
    assert cfg.legal_moves_only and cfg.sampling.temperature == 1.0
    assert not parse_args(["--env", "kuhn-poker", "--model", "Qwen/Qwen3-4B"]).league.enabled


def test_choose_moves_draws_by_the_scored_probabilities_and_returns_the_scored_ids(tok):
    """Two legal moves whose texts score log 0.2 and log 0.8 (on their first token): at T = 1 the draw is exactly
    numpy's with p = (0.2, 0.8) from the request seed; at T = 0 the likelier; at T = 0.5 p ∝ (0.04, 0.64). The
    returned ids are the move tag and EOS, the logprobs the scored ones."""
    import math

    import numpy as np

    from mas_train.move_choice import choose_moves

    seen = []

    def score(prompts, comps):
        seen.append((prompts, comps))
        return [
            [math.log(0.2 if b"check" in tok.decode(c).encode() else 0.8)] + [0.0] * (len(c) - 1)
            for c in comps
        ]

    legal = [["check", "bet"]] * 3
    sps = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)]
    got = choose_moves(score, tok, [[1, 2, 3]] * 3, legal, sps, version=7)
    want = [["check", "bet"][int(np.random.default_rng(s).choice(2, p=[0.2, 0.8]))] for s in (1, 2, 3)]
    assert [m for m, _ in got] == want
    for m, out in got:
        ids = tok.encode(f"<move>{m}</move>", add_special_tokens=False) + [tok.eos_token_id]
        assert out.completion_ids == ids and out.weight_version == 7 and out.finish_reason == "stop"
        assert out.logprobs == pytest.approx(
            [math.log(0.2 if m == "check" else 0.8)] + [0.0] * (len(ids) - 1)
        )
    # one score call; the three prompts are one state, so its 2 candidates are scored once, not 6 times
    assert len(seen) == 1 and len(seen[0][1]) == 2
    seen.clear()
    mixed = choose_moves(
        score, tok, [[1, 2], [4], [1, 2]], [["check", "bet"], ["fold", "call"], ["check", "bet"]], sps
    )
    assert (
        seen[0][0] == [[1, 2], [1, 2], [4], [4]] and len(seen[0][1]) == 4
    )  # distinct pairs in first-seen order
    assert [o.logprobs for _, o in mixed][0::2] == [
        got[i][1].logprobs for i in (0, 2)
    ]  # copies get the same scores
    assert [
        m for m, _ in choose_moves(score, tok, [[1]], [["check", "bet"]], [SamplingParams(temperature=0.0)])
    ] == ["bet"]
    draws = [
        choose_moves(score, tok, [[1]], [["check", "bet"]], [SamplingParams(temperature=0.5, seed=s)])[0][0]
        for s in range(2000)
    ]
    assert draws.count("check") / 2000 == pytest.approx(0.04 / 0.68, abs=0.015)


def test_legal_moves_only_never_plays_an_illegal_move_even_from_a_model_that_writes_prose(tok):
    """The fake model generates prose (every free move illegal) but scores 'call'/'bet' likelier: with
    legal_moves_only every move is legal, each sample ends with EOS, and free sampling forfeits every game."""
    import math

    class ProseScorer(ScriptGenerator):
        can_score = True

        def score(self, prompt_ids, completion_ids):
            return [
                [math.log(0.9 if re.search(r"bet|call", self.tok.decode(c)) else 0.1)] + [0.0] * (len(c) - 1)
                for c in completion_ids
            ]

    gen = ProseScorer(tok, lambda text, sp: "Kuhn poker is a game of")  # free text: never a move
    tasks = [{"id": "KQ", "question": "deal", "cards": ["K", "Q"], "data_source": "kuhn"}]
    for only in (True, False):
        col = _collector("kuhn-poker", gen, tok, legal_moves_only=only)
        batch = col.collect(tasks, 4, step=0)
        if only:
            assert batch.samples and not any(s.invalid for s in batch.samples)
            assert all(s.completion_ids[-1] == tok.eos_token_id for s in batch.samples)
            assert all(t.metrics["forfeit"] == 0.0 for t in batch.trajectories)
        else:
            assert all(s.invalid for s in batch.samples) and all(
                t.metrics["forfeit"] == 1.0 for t in batch.trajectories
            )


def test_legal_moves_only_is_refused_off_games_and_at_another_temperature(tmp_path):
    from mas_train.config import TrainConfig
    from mas_train.startup import prepare

    base = dict(output_dir=str(tmp_path), eval_steps=0, max_steps=1, legal_moves_only=True)
    with pytest.raises(ConfigError, match="legal_moves_only: env 'math-2agent' is not a game"):
        prepare(TrainConfig.from_dict(dict(base, env="math-2agent")))
    with pytest.raises(ConfigError, match="set sampling.temperature 1"):
        prepare(TrainConfig.from_dict(dict(base, env="kuhn-poker", sampling={"temperature": 0.7})))


def test_tiny_qwen3_kuhn_with_legal_moves_only_learner_and_snapshot_play_only_legal_moves(
    tmp_path, tiny_qwen3_path, monkeypatch
):
    """The random-init tiny model never writes a move by itself; with legal_moves_only no turn is illegal, no game
    is forfeited, including the games against its snapshot (step 2), and the adapters get a gradient. The
    advantages see each seat's turns as a trajectory of their own (a game: GRPO's r_i is the seat's return)."""
    pytest.importorskip("trl")
    import mas_train.trainer as trainer_mod
    from mas_train.assemble import assemble_trainer
    from mas_train.config import TrainConfig

    seen = []
    real = trainer_mod.compute_advantages_with_stats

    def spy(*cols, **kw):
        seen.append(cols)
        return real(*cols, **kw)

    monkeypatch.setattr(trainer_mod, "compute_advantages_with_stats", spy)  # the name the loop calls

    seats = ("player_0", "player_1")
    deals = [{"id": f"kuhn-poker/{a}{b}", "question": "deal", "cards": [a, b], "data_source": "kuhn-poker"}
             for a, b in (("K", "J"), ("Q", "K"), ("J", "Q"))]  # fmt: skip
    cfg = TrainConfig.from_dict(
        dict(env="kuhn-poker", model=tiny_qwen3_path, num_generations=4, tasks_per_step=3, max_steps=2,
             output_dir=str(tmp_path), run_name="run", sampling={"max_new_tokens": 8, "temperature": 1.0},
             eval_steps=0, model_sharing="shared_lora", lora={"r": 4, "alpha": 8}, legal_moves_only=True,
             league={"enabled": True, "self_play": 0, "snapshots": 1.0, "scripted": {"random": 0.001},
                     "snapshot_every": 1})
    )  # fmt: skip
    tr = assemble_trainer(
        cfg.resolve(list(seats)),
        env_factory=lambda: mas_envs.make("kuhn-poker"),
        train_tasks=deals,
        eval_tasks=None,
    )
    try:
        m1, _ = tr.train_step()
        m2, _ = tr.train_step()
    finally:
        tr.close()
    for m in (m1, m2):
        assert m["charts/invalid_rate"] == 0.0 and m["env/forfeit"] == 0.0
    assert m2["league/episodes/snapshot"] == 1.0
    assert max(m1.get(f"losses/grad_norm/{s}", 0.0) for s in seats) > 0.0
    assert len(seen) == 2 and all(cols[2] for cols in seen)
    for _, _, traj_ids, agents in seen:
        assert all(t.endswith("|" + a) and t.count("|") == 1 for t, a in zip(traj_ids, agents, strict=True))


def test_against_an_opponent_the_learner_holds_a_seat_whose_group_trains():
    """With a frozen seat (its group does not train) the learner is the trainable seat in every task group: a
    frozen learner's turns would give the task group no sample to learn from. With every seat training the draw
    is the one of the plain league (the same learners, the same stream)."""
    cfg = LeagueConfig(enabled=True, self_play=0, snapshots=0, scripted={"random": 1.0})
    groups = {"player_1": "x", "player_2": "y"}
    frozen = League(
        cfg, TTT, "tictactoe-v0", 0, pool=None, agent_groups=groups, trainable=["x"], lora_cfgs={}
    )
    seats = frozen.draw(2, 0)
    assert all(set(seats(t)) == {"player_2"} for t in range(64))
    both = League(
        cfg, TTT, "tictactoe-v0", 0, pool=None, agent_groups=groups, trainable=["x", "y"], lora_cfgs={}
    )
    plain = _league(cfg)
    got = [sorted(both.draw(2, 0)(t)) for t in range(64)]
    assert got == [sorted(plain.draw(2, 0)(t)) for t in range(64)]
    assert {tuple(s) for s in got} == {("player_1",), ("player_2",)}


def test_an_opponent_turn_in_the_episode_record_scores_its_own_seats_return(tok):
    """A game's seats have their own returns (the team reward is their mean, 0 here): a turn minimax played is
    recorded with minimax's return (+1 when the naive learner loses as X), as a learner turn is with its own."""
    from mas_train.episodes import episode_records, episodes_markdown

    gen = ScriptGenerator(tok, _first_legal)
    col = _collector("tictactoe", gen, tok)
    league = _league(LeagueConfig(enabled=True, self_play=0, snapshots=0, scripted={"minimax": 1.0}))
    tasks = [{"id": f"g{i}", "question": "play", "data_source": "tictactoe"} for i in range(6)]
    batch = col.collect(tasks, 1, step=1, opponents=league.draw(1, 0))
    recs = episode_records(batch, range(len(batch.trajectories)), penalty=0.0, kind="train", step=1)
    for rec, traj in zip(recs, batch.trajectories, strict=True):
        assert traj.team_reward == 0.0
        for row in rec["transcript"]:
            if row["speaker"] != "env":
                assert row["score"] == traj.agent_rewards[row["speaker"]]
    # the learner as X (minimax plays player_2) loses every game: minimax's rows score +1, the learner's -1
    as_x = [rec for rec, t in zip(recs, batch.trajectories, strict=True) if "player_2" in t.opponents]
    assert as_x
    rows = [r for rec in as_x for r in rec["transcript"] if r["speaker"] != "env"]
    assert {r["score"] for r in rows if r["played_by"] == "minimax"} == {1.0}
    assert {r["score"] for r in rows if r["played_by"] is None} == {-1.0}
    # the record carries each seat's return and who played which seat; the markdown header says them
    assert [(r["returns"], r["opponents"]) for r in as_x] == [
        ({"player_1": -1.0, "player_2": 1.0}, {"player_2": "minimax"})
    ] * len(as_x)
    assert "tictactoe), success, player_1 -1, player_2 +1 (player_2: minimax)" in episodes_markdown(as_x[:1])


def test_a_snapshot_copies_the_adapter_of_a_group_named_like_a_module_path_part(tiny_qwen3_path):
    """A model group may be called ``0`` (its adapter's parameters are ``...layers.0...lora_A.0.weight``): the
    snapshot still copies the adapter tensor for tensor (only the adapter part of each name is renamed)."""
    from types import SimpleNamespace

    from mas_train import lora
    from mas_train.config.sections import LoraConfig
    from mas_train.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(tiny_qwen3_path, dtype="float32", device="cpu")
    cfg = LoraConfig(r=4, alpha=8)
    peft_model = lora.wrap(model, cfg, "0")
    with torch.no_grad():
        for p in lora.adapter_state(peft_model, "0").values():
            p.uniform_(-1, 1)
    worker = SimpleNamespace(backend=SimpleNamespace(model=peft_model), policy=SimpleNamespace(adapter="0"))
    pool = SimpleNamespace(worker=lambda g: worker)
    league = League(
        LeagueConfig(enabled=True, snapshot_every=1), TTT, "tictactoe-v0", 0, pool, {a: "0" for a in TTT}, ["0"],
        {"0": cfg},
    )  # fmt: skip
    assert league.after_step(1)
    snap = _adapter(peft_model, League.adapter(1, "0"))
    mine = _adapter(peft_model, "0")
    assert snap.keys() == mine.keys() and all(torch.equal(snap[n], mine[n]) for n in mine)


def test_the_documented_flags_a_scripted_mix_adds_to_the_default_and_eval_opponents_are_words():
    """docs/envs.md: ``--league.scripted`` adds its keys to the default ``{random: 0.2}`` (``random: 0`` drops
    it, weight 0 never draws); docs/training.md: ``--eval_opponents random minimax`` (a YAML list is not read)."""
    from mas_train.config.args import parse_args

    base = [
        "--env",
        "tictactoe",
        "--train_data",
        "games.jsonl",
        "--league.enabled",
        "true",
    ]  # no laptop layer
    assert parse_args([*base, "--league.scripted", "{minimax: 1}"]).league.scripted == {
        "random": 0.2,
        "minimax": 1,
    }
    cfg = parse_args([*base, "--league.scripted", "{minimax: 1, random: 0}"]).league
    assert _league(cfg).weights() == pytest.approx({"self": 0.5 / 1.5, "minimax": 1 / 1.5})
    assert parse_args(
        ["--env", "tictactoe", "--eval_opponents", "random", "minimax?epsilon=0"]
    ).eval_opponents == [
        "random",
        "minimax?epsilon=0",
    ]


def test_no_snapshot_is_taken_when_the_mix_never_draws_one():
    """league.snapshots 0 (e.g. tic-tac-toe against scripted opponents only): no adapter copy is made, kept in
    memory or written to checkpoints, and league/snapshots stays 0."""
    league = _league(LeagueConfig(enabled=True, snapshots=0, snapshot_every=2, scripted={"minimax": 1.0}))
    assert not league.after_step(2) and not league.after_step(4)
    assert league.snapshots == [] and league.metrics([])["league/snapshots"] == 0.0
    drawn = _league(LeagueConfig(enabled=True, snapshots=0.3, snapshot_every=2))
    assert not drawn.after_step(1) and drawn.after_step(2) and drawn.snapshots == [2]

"""Scripted opponents: random legal moves, epsilon-minimax tic-tac-toe, Kuhn policy tables."""

from __future__ import annotations

import numpy as np
import pytest

import mas_envs
from mas_envs.games import kuhn
from mas_envs.games.opponents import (
    KuhnTablePolicy,
    MinimaxTicTacToe,
    RandomPolicy,
    kuhn_equilibrium,
    minimax_value,
)


def _play(name, policies, seed):
    """One game with a policy per seat; returns each seat's return and the final infos."""
    env = mas_envs.make(name)
    env.reset(seed=seed)
    returns = dict.fromkeys(env.possible_agents, 0.0)
    final = {}
    for agent in env.agent_iter():
        obs, r, term, trunc, info = env.last()
        returns[agent] += r
        if term or trunc:
            final = info
            env.step(None)
            continue
        move = policies[agent](obs, info["legal_moves"])
        assert move in info["legal_moves"]
        env.step(move)
    return returns, final


def test_minimax_values():
    assert minimax_value(".........") == 0  # tic-tac-toe is a draw
    assert minimax_value("XX.OO....") == 1  # X to move completes the top row
    # O to move must block at 3; then X plays 5 and threatens both 8 (2-5-8) and 9 (1-5-9): lost for O
    assert minimax_value("XX.O.....") == -1


@pytest.mark.parametrize("minimax_seat", ["player_1", "player_2"])
def test_minimax_never_loses_to_random_in_50_seeded_games(minimax_seat):
    wins = 0
    for seed in range(50):
        bots = {
            minimax_seat: MinimaxTicTacToe(seed=seed),
            **{a: RandomPolicy(seed=1000 + seed) for a in ("player_1", "player_2") if a != minimax_seat},
        }
        returns, final = _play("tictactoe", bots, seed)
        assert returns[minimax_seat] >= 0.0, f"minimax lost game {seed}"
        assert final["episode_metrics"]["forfeit"] == 0.0
        wins += returns[minimax_seat] == 1.0
    assert (
        wins >= 35
    )  # random play loses most games (a real check that the bot plays to win, not only to draw)


def test_minimax_against_itself_always_draws():
    for seed in range(5):
        bots = {"player_1": MinimaxTicTacToe(seed=seed), "player_2": MinimaxTicTacToe(seed=seed + 1)}
        returns, _ = _play("tictactoe", bots, seed)
        assert returns == {"player_1": 0.0, "player_2": 0.0}


def test_epsilon_one_is_random_and_bad_epsilon_is_refused():
    bot = MinimaxTicTacToe(epsilon=1.0, seed=0)
    env = mas_envs.make("tictactoe")
    env.reset(seed=0)
    picks = {bot(env.observe("player_1"), env.infos["player_1"]["legal_moves"]) for _ in range(200)}
    assert picks == {str(n) for n in range(1, 10)}
    assert {MinimaxTicTacToe(seed=s)(env.observe("player_1"), ["1", "5"]) for s in range(20)} <= {"1", "5"}
    with pytest.raises(ValueError, match=r"epsilon must be in \[0, 1\]"):
        MinimaxTicTacToe(epsilon=1.5)
    with pytest.raises(ValueError, match="no legal moves"):
        RandomPolicy(0)("obs", [])


def test_random_policy_plays_connect_four_to_the_end():
    for seed in range(10):
        returns, final = _play(
            "connect-four", {a: RandomPolicy(seed + i) for i, a in enumerate(("player_0", "player_1"))}, seed
        )
        assert sum(returns.values()) == 0.0 and final["success"] is True


def test_kuhn_table_policy_follows_its_table():
    env = mas_envs.make("kuhn-poker")
    env.reset(options={"task": {"question": "q", "cards": ["Q", "K"]}})
    obs = env.observe("player_0")
    bot = KuhnTablePolicy({**kuhn.equilibrium_policy(0.0), "Q": 0.25}, seed=0)
    bets = np.mean([bot(obs, ["check", "bet"]) == "bet" for _ in range(4000)])
    assert bets == pytest.approx(0.25, abs=0.03)
    with pytest.raises(ValueError, match="do not match information set 'Q'"):
        bot(obs, ["fold", "call"])


def test_kuhn_equilibrium_bot_against_random_wins_its_exact_expected_value():
    # A table holds both seats' information sets, so mixing player_0's uniform half with player_1's equilibrium
    # half gives the exact value of this match-up; the equilibrium guarantees player_1 at least 1/18.
    mixed = {k: 0.5 if len(k) in (1, 3) else p for k, p in kuhn.equilibrium_policy(0.0).items()}
    exact = -kuhn.game_value(mixed)
    assert exact >= 1 / 18
    results = []
    for seed in range(2000):
        returns, _ = _play(
            "kuhn-poker",
            {"player_0": RandomPolicy(20_000 + seed), "player_1": kuhn_equilibrium(0.0, 10_000 + seed)},
            seed,
        )
        results.append(returns["player_1"])
    # a hand's result has sd < 2, so 2000 hands have a standard error < 0.045: 3 standard errors. The seeds of
    # the deal and of the two bots differ: equal seeds correlate their draws (the mean was 0.31 then).
    assert np.mean(results) == pytest.approx(exact, abs=0.135)

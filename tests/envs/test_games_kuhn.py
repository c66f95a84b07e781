"""Kuhn poker: the env's payoffs, the exact exploitability on hand-computed tables, and the log-prob -> table helper."""

from __future__ import annotations

import itertools
import math

import pytest

import mas_envs
from mas_envs.games import kuhn
from mas_envs.games.kuhn import INFO_SETS, exploitability

UNIFORM = dict.fromkeys(INFO_SETS, 0.5)
ALWAYS_AGGRESSIVE = dict.fromkeys(INFO_SETS, 1.0)
ALWAYS_PASSIVE = dict.fromkeys(INFO_SETS, 0.0)


def test_info_sets_are_the_twelve_keys_of_the_issue():
    assert sorted(INFO_SETS) == sorted(
        ["J", "Q", "K", "Jpb", "Qpb", "Kpb", "Jp", "Qp", "Kp", "Jb", "Qb", "Kb"]
    )


def test_uniform_policy():
    # By hand, BR0 vs a uniform player_1: K bets (1/2 * 2 + 1/2 * 1 = 1.5); Q bets (vs J 1.5, vs K -0.5: 0.5;
    # check-call gives 0, check-fold -0.5); J bets (-0.5; check-fold -1): BR0 = (1.5 + 0.5 - 0.5) / 3 = 1/2.
    br0, br1 = kuhn.best_response_values(UNIFORM)
    assert br0 == pytest.approx(0.5, abs=1e-15)
    assert br1 == pytest.approx(5 / 12, abs=1e-15)
    assert exploitability(UNIFORM) == pytest.approx(11 / 24, abs=1e-15)  # 0.458333..., OpenSpiel's value
    assert kuhn.game_value(UNIFORM) == pytest.approx(1 / 8, abs=1e-15)


def test_always_aggressive_and_always_passive():
    # Always bet/call: BR0 = (K 2 + Q 0 + J -1) / 3 = 1/3, and the same for player_1. OpenSpiel's
    # tabular exploitability gives 1/3 ("always raise") and 1.0 ("always pass", action 0) on kuhn_poker too.
    assert kuhn.best_response_values(ALWAYS_AGGRESSIVE) == pytest.approx((1 / 3, 1 / 3), abs=1e-15)
    assert exploitability(ALWAYS_AGGRESSIVE) == pytest.approx(1 / 3, abs=1e-15)
    assert exploitability(ALWAYS_PASSIVE) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("alpha", [0.0, 1 / 12, 1 / 6, 1 / 3])
def test_kuhns_equilibrium_family_is_unexploitable_with_value_minus_one_eighteenth(alpha):
    policy = kuhn.equilibrium_policy(alpha)
    assert exploitability(policy) == pytest.approx(0.0, abs=1e-12)
    assert kuhn.game_value(policy) == pytest.approx(-1 / 18, abs=1e-12)
    br0, br1 = kuhn.best_response_values(policy)
    assert br0 == pytest.approx(-1 / 18, abs=1e-12) and br1 == pytest.approx(1 / 18, abs=1e-12)


def test_leaving_the_equilibrium_is_exploitable():
    off = {**kuhn.equilibrium_policy(0.0), "Qb": 1.0}  # player_1 always calls with Q
    assert exploitability(off) > 0.01
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1/3\]"):
        kuhn.equilibrium_policy(0.5)


def _env_value(first, second):
    """player_0's expected chips by actually stepping the env through every deal and action sequence."""
    total = 0.0
    for c0, c1 in itertools.permutations(kuhn.CARDS, 2):
        for moves in itertools.product((0, 1), repeat=3):
            env = mas_envs.make("kuhn-poker")
            env.reset(options={"task": {"question": "q", "cards": [c0, c1]}})
            prob, i, ret = 1.0, 0, 0.0
            for agent in env.agent_iter():
                obs, r, term, trunc, info = env.last()
                if agent == "player_0":
                    ret += r
                if term or trunc:
                    env.step(None)
                    continue
                key = kuhn.info_set_of(obs)
                table = first if agent == "player_0" else second
                passive, aggressive = kuhn.legal_actions(key[1:])
                p = table[key] if moves[i] else 1 - table[key]
                prob *= p
                env.step(aggressive if moves[i] else passive)
                i += 1
            if i == 3 or moves[i:] == (0,) * (3 - i):  # count each terminal history once
                total += prob * ret / 6
    return total


def test_exploitability_agrees_with_best_responses_played_in_the_env():
    policy = {k: round(0.1 + 0.07 * n, 2) for n, k in enumerate(INFO_SETS)}
    pure = list(itertools.product((0.0, 1.0), repeat=6))
    keys0 = [k for k in INFO_SETS if len(k) in (1, 3)]
    keys1 = [k for k in INFO_SETS if len(k) == 2]
    br0 = max(_env_value(dict(zip(keys0, s, strict=True)), policy) for s in pure)
    br1 = max(-_env_value(policy, dict(zip(keys1, s, strict=True))) for s in pure)
    assert kuhn.best_response_values(policy) == pytest.approx((br0, br1), abs=1e-12)
    assert _env_value(policy, policy) == pytest.approx(kuhn.game_value(policy), abs=1e-12)


def test_exploitability_refuses_a_bad_table():
    with pytest.raises(ValueError, match=r"missing \['Kb'\]"):
        exploitability({k: 0.5 for k in INFO_SETS if k != "Kb"})
    with pytest.raises(ValueError, match=r"policy\['J'\] must be a probability"):
        exploitability({**UNIFORM, "J": 1.5})


def test_policy_from_logprobs_normalises_over_the_legal_moves():
    logprobs = {k: dict.fromkeys(kuhn.legal_actions(k[1:]), -3.0) for k in INFO_SETS}
    logprobs["K"] = {"check": math.log(0.1), "bet": math.log(0.3)}  # unnormalised: p(bet) = 0.3 / 0.4
    logprobs["Qb"] = {"fold": -math.inf, "call": -12.0}
    logprobs["Jpb"] = {"fold": -1.0, "call": -1000.0}
    table = kuhn.policy_from_logprobs(logprobs)
    assert table["K"] == pytest.approx(0.75, abs=1e-15)
    assert table["Qb"] == 1.0
    assert table["Jpb"] == pytest.approx(math.exp(-999.0), abs=1e-300)
    assert table["Q"] == 0.5
    assert exploitability({**table}) >= 0.0


def test_policy_from_logprobs_refuses_wrong_moves_and_nan():
    good = {k: dict.fromkeys(kuhn.legal_actions(k[1:]), -1.0) for k in INFO_SETS}
    with pytest.raises(ValueError, match=r"logprobs\['Kb'\] must give exactly 'fold' and 'call'"):
        kuhn.policy_from_logprobs({**good, "Kb": {"check": -1.0, "bet": -1.0}})
    with pytest.raises(ValueError, match="finite log-probabilities"):
        kuhn.policy_from_logprobs({**good, "K": {"check": float("nan"), "bet": -1.0}})
    with pytest.raises(ValueError, match="finite log-probabilities"):
        kuhn.policy_from_logprobs({**good, "K": {"check": -math.inf, "bet": -math.inf}})
    with pytest.raises(ValueError, match=r"missing \['J'\]"):
        kuhn.policy_from_logprobs({k: v for k, v in good.items() if k != "J"})


def test_info_set_prompts_show_the_card_and_history_but_not_the_opponents_card():
    messages = kuhn.info_set_messages()
    assert list(messages) == list(INFO_SETS)
    for key, msgs in messages.items():
        text = msgs[-1]["content"]
        assert kuhn.info_set_of(text) == key
        assert text.count("Your card:") == 1 and f"Your card: {key[0]}" in text
        legal = kuhn.legal_actions(key[1:])
        assert f"Legal moves: {legal[0]}, {legal[1]}" in text
    assert "Betting so far: you: check, opponent: bet" in messages["Qpb"][-1]["content"]
    assert "Pot: 3 chips (you have put in 1)" in messages["Qpb"][-1]["content"]
    assert kuhn.action_texts("Kb") == {"fold": "<move>fold</move>", "call": "<move>call</move>"}


def test_seeded_resets_deal_all_six_deals():
    env = mas_envs.make("kuhn-poker")
    seen = set()
    for seed in range(60):
        env.reset(seed=seed)
        seen.add(env.unwrapped.task_id)
    assert seen == {f"kuhn-poker/{a}{b}" for a, b in itertools.permutations("JQK", 2)}


def test_a_bad_deal_is_refused():
    env = mas_envs.make("kuhn-poker")
    with pytest.raises(ValueError, match='"cards": two different cards'):
        env.reset(options={"task": {"question": "q", "cards": ["K", "K"]}})


def test_payoffs_and_metrics_of_a_called_bet():
    env = mas_envs.make("kuhn-poker")
    env.reset(options={"task": {"question": "q", "cards": ["Q", "K"]}})
    env.step("<move>bet</move>")
    env.step("<move>call</move>")
    info = env.unwrapped.infos["player_0"]
    assert info["agent_rewards"] == {"player_0": -2.0, "player_1": 2.0}
    assert info["team_reward"] == 0.0 and info["success"] is True
    m = info["episode_metrics"]
    assert m["player_0/loss"] == 1.0 and m["player_1/win"] == 1.0 and m["game_length"] == 2.0
    assert m["player_0/illegal_rate"] == 0.0 and m["forfeit"] == 0.0


def test_move_hint_choices_lists_the_legal_moves_and_an_unknown_hint_is_refused():
    env = mas_envs.make("kuhn-poker", move_hint="choices")
    env.reset(seed=0, options={"task": {"question": "deal", "cards": ["Q", "K"]}})
    last = env.infos["player_0"]["messages"][-1]["content"].splitlines()[-1]
    assert last == "Reply with exactly one of: <move>check</move> or <move>bet</move>."
    env.step("<move>bet</move>")
    last = env.infos["player_1"]["messages"][-1]["content"].splitlines()[-1]
    assert last == "Reply with exactly one of: <move>fold</move> or <move>call</move>."
    default = mas_envs.make("kuhn-poker")
    default.reset(seed=0, options={"task": {"question": "deal", "cards": ["Q", "K"]}})
    assert default.infos["player_0"]["messages"][-1]["content"].endswith("for example <move>check</move>.")
    assert kuhn.info_set_messages(move_hint="choices")["Kb"][-1]["content"].endswith(
        "<move>fold</move> or <move>call</move>."
    )
    with pytest.raises(ValueError, match="move_hint must be one of"):
        mas_envs.make("kuhn-poker", move_hint="first")

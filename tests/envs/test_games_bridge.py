"""The PettingZoo bridge (tictactoe, connect-four) and the shared game rules: conformance under both illegal-move
rules, cell numbering against PettingZoo's own board, per-seat rewards through the env contract, metrics,
retry messages, pickling mid-game, fuzzing, and a light `import mas_envs`."""

from __future__ import annotations

import pickle
import subprocess
import sys
from functools import partial

import numpy as np
import pytest
from pettingzoo.test import api_test

import mas_envs
from mas_envs.core import Outcome, TextAECEnv, Transition
from mas_envs.testing import check_env

GAMES = ["tictactoe", "connect-four", "kuhn-poker"]


@pytest.mark.parametrize("name", GAMES)
@pytest.mark.parametrize("rule", ["terminate", "retry"])
def test_check_env_and_pettingzoo_api_test(name, rule):
    api_test(mas_envs.make(name, illegal_move=rule), num_cycles=200)
    report = check_env(partial(mas_envs.make, name, illegal_move=rule), fuzz_episodes=300)
    assert report.random_episodes == 300
    assert 0 < report.invalid_random_actions < report.random_actions  # fuzz reaches legal and illegal moves
    assert report.golden_episodes  # the scripted games replayed exactly


def _play(env, moves):
    for move in moves:
        env.step(move)
    return env.unwrapped


def test_tictactoe_cells_are_read_row_by_row_and_map_to_pettingzoos_actions():
    env = mas_envs.make("tictactoe")
    env.reset(seed=0)
    raw = _play(env, ["<move>2</move>", "<move>4</move>"])  # top middle (X), middle left (O)
    # PettingZoo numbers cells column by column: top middle is its action 3, middle left its action 1
    assert raw.game.board.squares[3] == 1 and raw.game.board.squares[1] == 2
    assert raw.cells() == ["", "X", "", "O", "", "", "", "", ""]
    text = env.observe("player_1")
    assert " 1 | X | 3\n---+---+---\n O | 5 | 6\n---+---+---\n 7 | 8 | 9" in text
    assert "Legal moves: 1, 3, 5, 6, 7, 8, 9" in text
    assert env.infos["player_1"]["legal_moves"] == ["1", "3", "5", "6", "7", "8", "9"]
    assert env.infos["player_2"]["legal_moves"] == []
    assert "Legal moves" not in env.observe("player_2")  # not its turn


def test_connect_four_board_and_full_column():
    env = mas_envs.make("connect-four", illegal_move="retry", max_retries=1)
    env.reset(seed=0)
    raw = _play(env, ["<move>3</move>"] * 6)  # column 3 fills up: X O X O X O from the bottom
    board = raw.board_text().splitlines()
    assert board[0] == "1 2 3 4 5 6 7"
    assert [row[4] for row in board[1:]] == ["O", "X", "O", "X", "O", "X"]
    assert env.infos["player_0"]["legal_moves"] == ["1", "2", "4", "5", "6", "7"]
    env.step("<move>3</move>")
    assert env.agent_selection == "player_0" and env.infos["player_0"]["invalid_action"] is True
    prompt = env.observe("player_0")
    assert (
        "\n\nYour last reply was not a legal move: column 3 is full. 1 more illegal move and you lose"
        in prompt
    )


def test_per_seat_rewards_reach_the_returns_and_infos():
    env = mas_envs.make("tictactoe")
    env.reset(seed=0)
    returns = dict.fromkeys(env.possible_agents, 0.0)
    moves = iter(["5", "1", "3", "7", "4", "6", "9", "2", "8"])  # a draw
    for agent in env.agent_iter():
        _, r, term, trunc, info = env.last()
        returns[agent] += r
        if term or trunc:
            final = info
        env.step(None if term or trunc else next(moves))
    assert returns == {"player_1": 0.0, "player_2": 0.0}
    assert final["agent_rewards"] == {"player_1": 0.0, "player_2": 0.0} and final["success"] is True
    m = final["episode_metrics"]
    assert m["game_length"] == 9.0 and m["player_1/draw"] == 1.0 and m["player_2/draw"] == 1.0
    assert type(env.unwrapped).per_agent_rewards is True


def test_retry_rule_counts_per_seat_and_then_forfeits_with_spiral_rewards():
    env = mas_envs.make("tictactoe", illegal_move="retry", max_retries=2, illegal_rewards=(-1.5, 0.5))
    env.reset(seed=0)
    env.step("<move>5</move>")
    env.step("I pass")  # O: illegal 1, no move
    assert "no move found (write it as <move>1</move>)" in env.observe("player_2")
    assert "2 more illegal moves and you lose" in env.observe("player_2")
    env.step("<move>5</move>")  # O: illegal 2, taken
    assert "cell 5 is already taken. 1 more illegal move and you lose" in env.observe("player_2")
    env.step("<move>1</move>")  # legal: the error message goes away
    assert "not a legal move" not in env.observe("player_2")
    env.step("<move>1</move>")  # X: illegal 1 of its own allowance
    assert env.agent_selection == "player_1" and not env.terminations["player_1"]
    env.step("<move>9</move>")
    env.step("<move>9</move>")  # O: illegal 3 > max_retries: forfeit
    info = env.unwrapped.infos["player_2"]
    assert info["agent_rewards"] == {"player_1": 0.5, "player_2": -1.5}
    assert info["team_reward"] == -0.5 and info["success"] is False
    m = info["episode_metrics"]
    assert m["forfeit"] == 1.0 and m["player_2/loss"] == 1.0 and m["player_1/win"] == 1.0
    assert m["player_2/illegal_rate"] == 3 / 4 and m["player_1/illegal_rate"] == 1 / 3
    assert m["game_length"] == 3.0


def test_max_turns_truncation_is_a_draw_with_zero_rewards():
    env = mas_envs.make("tictactoe", max_turns=2)
    env.reset(seed=0)
    _play(env, ["5", "1"])
    info = env.unwrapped.infos["player_1"]
    assert env.truncations["player_1"] and info["agent_rewards"] == {"player_1": 0.0, "player_2": 0.0}
    assert info["episode_metrics"]["player_1/draw"] == 1.0 and info["success"] is False


def test_bad_rule_arguments_are_refused():
    with pytest.raises(ValueError, match="illegal_move must be one of"):
        mas_envs.make("tictactoe", illegal_move="ignore")
    with pytest.raises(ValueError, match="illegal_rewards must be two finite numbers"):
        mas_envs.make("tictactoe", illegal_rewards=(-1.0,))
    with pytest.raises(ValueError, match="illegal_rewards must be two finite numbers"):
        mas_envs.make("tictactoe", illegal_rewards=(float("nan"), 0.0))
    with pytest.raises(ValueError, match="max_retries must be an int >= 0"):
        mas_envs.make("tictactoe", max_retries=-1)


@pytest.mark.parametrize("name", ["tictactoe", "connect-four"])
def test_pickle_mid_game_replays_the_inner_game(name):
    env = mas_envs.make(name)
    env.reset(seed=0)
    _play(env, ["<move>1</move>", "<move>2</move>", "<move>3</move>"])
    copy = pickle.loads(pickle.dumps(env))
    assert copy.unwrapped.game is not env.unwrapped.game
    assert copy.observe(copy.agent_selection) == env.observe(env.agent_selection)  # the same board
    more = ["<move>4</move>", "<move>5</move>", "<move>6</move>", "<move>7</move>"]
    if name == "connect-four":
        more = [f"<move>{c}</move>" for c in (4, 1, 4, 1, 5, 1)]  # X's fourth disc in column 1 wins
    for e in (env, copy):
        _play(e, more)
    assert env.unwrapped.state() == copy.unwrapped.state()
    first = env.possible_agents[0]
    assert copy.unwrapped.infos[first]["agent_rewards"] == env.unwrapped.infos[first]["agent_rewards"]
    assert env.unwrapped.infos[first]["agent_rewards"][first] == 1.0  # X won in both


@pytest.mark.parametrize("name", GAMES)
def test_fuzz_random_strings_never_crash(name):
    rng = np.random.default_rng(0)
    alphabet = list("0123456789<>/[]{}\\ abcmoveplaybetcallfoldcheck") + ["<move>", "</move>", "\x00", "😀"]
    env = mas_envs.make(name, illegal_move="retry", max_retries=5)
    for seed in range(150):
        env.reset(seed=seed)
        for _agent in env.agent_iter(500):
            _, _, term, trunc, _ = env.last()
            text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 30))))
            env.step(None if term or trunc else text)
        assert env.agents == []


def test_team_env_must_not_give_agent_rewards_and_game_env_must_give_all():
    class Team(TextAECEnv):
        metadata = {"name": "team-v0", "render_modes": ["ansi"], "is_parallelizable": False}
        possible_agents = ("a", "b")
        per_agent_rewards = False
        given: dict[str, float] = {"a": 1.0}

        def start_episode(self, task):
            return "a"

        def prompt_messages(self, agent):
            return [{"role": "user", "content": "go"}]

        def apply_action(self, agent, action):
            return Transition(False, None)

        def episode_outcome(self):
            return Outcome(1.0, True, agent_rewards=self.given)

    class Game(Team):
        per_agent_rewards = True

    task = {"question": "q"}
    env = Team(tasks=[task])
    env.reset()
    with pytest.raises(RuntimeError, match="does not declare per_agent_rewards"):
        env.step("x")
    env = Game(tasks=[task])
    env.reset()
    with pytest.raises(RuntimeError, match=r"it must give one for each of \['a', 'b'\]"):
        env.step("x")
    env = Game(tasks=[task])
    env.given = {"a": 1.0, "b": float("inf")}
    env.reset()
    with pytest.raises(RuntimeError, match="outcome reward inf"):
        env.step("x")


def test_team_envs_report_the_team_reward_as_every_agents_outcome_reward():
    env = mas_envs.make("math-2agent")
    env.reset(options={"task": {"question": "1+1?", "answer": "2"}})
    _play(env, ["\\boxed{2}", "<verify>approve</verify>"])
    assert env.unwrapped.infos["solver"]["agent_rewards"] == {"solver": 1.0, "verifier": 1.0}


def test_import_mas_envs_stays_light():
    code = (
        "import sys, mas_envs, mas_envs.games.kuhn, mas_envs.games.opponents, mas_envs.games.tictactoe;"
        "bad = [m for m in ('torch', 'pygame', 'pettingzoo.classic.tictactoe.tictactoe') if m in sys.modules];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bridge_refuses_a_game_without_an_action_mask():
    from mas_envs.games.bridge import PettingZooGameEnv

    class RockPaperScissors(PettingZooGameEnv):  # PettingZoo's rps observes a bare int, no action_mask
        metadata = {"name": "rps-v0", "render_modes": ["ansi"], "is_parallelizable": False}
        possible_agents = ("player_0", "player_1")
        move_labels = ("rock", "paper", "scissors")

        def make_game(self):
            from pettingzoo.classic.rps.rps import raw_env

            return raw_env()

    with pytest.raises(
        TypeError, match="needs a game with Discrete actions and dict observations holding an"
    ):
        RockPaperScissors().reset(seed=0)


def test_transcript_notes_follow_the_illegal_move_they_explain():
    env = mas_envs.make("tictactoe", illegal_move="retry", max_retries=1, render_mode="ansi")
    env.reset(seed=0)
    _play(env, ["5", "<move>5</move>", "x"])
    rows = [(e.turn, e.speaker, e.text, e.invalid) for e in env.unwrapped.transcript]
    assert rows == [
        (0, "player_1", "5", False),
        (1, "player_2", "<move>5</move>", True),
        (1, "env", "illegal move by player_2: cell 5 is already taken; it moves again", False),
        (2, "player_2", "x", True),
        (
            2,
            "env",
            "illegal move by player_2: no move found (write it as <move>1</move>); player_2 loses the game",
            False,
        ),
    ]
    assert env.render().endswith("=== terminated: team reward -0.5, success False ===")


def test_a_missing_pygame_is_one_error_line_naming_the_extra(monkeypatch):
    import builtins

    import mas_envs

    real_import = builtins.__import__

    def no_pygame(name, *args, **kwargs):
        if name == "pygame" or name.startswith("pygame."):
            raise ModuleNotFoundError("No module named 'pygame'", name="pygame")
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m.startswith("pettingzoo.classic")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_pygame)
    with pytest.raises(ImportError, match=r"need 'pygame': pip install 'mas-rl\[games\]'"):
        env = mas_envs.make("tictactoe")
        env.reset(seed=0)

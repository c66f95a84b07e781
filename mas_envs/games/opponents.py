"""Scripted opponents: plain policies ``policy(observation, legal_moves) -> move label``.

`observation` is the seat's observation string (``env.observe(agent)``) and `legal_moves` its legal move
labels (``env.infos[agent]["legal_moves"]``); the returned label is a valid action text as it is (the parser
accepts a bare label), or wrap it with `mas_envs.games.moves.format_move`. Each policy draws from its own
seeded ``numpy.random.Generator``, so a seeded opponent plays the same games again. Play one seat with it::

    env = mas_envs.make("tictactoe")
    bot = MinimaxTicTacToe(epsilon=0.1, seed=0)
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, _, term, trunc, info = env.last()
        move = None if term or trunc else (bot(obs, info["legal_moves"]) if agent == "player_2" else mine(obs))
        env.step(move)

* `RandomPolicy`: a uniformly random legal move (any game).
* `MinimaxTicTacToe`: exact minimax (the whole game tree is 5478 positions, memoised), with probability
  ``epsilon`` a random legal move instead (the "20–70 % random minimax" opponents of anakin87's "LLM RL
  Environments Lil Course", lowered as training goes on); ties among equally good moves are broken at random.
* `KuhnTablePolicy` / `kuhn_equilibrium`: a Kuhn poker policy table (`mas_envs.games.kuhn`), e.g. Kuhn's
  equilibrium.

`scripted_policy(spec, env, seed)` builds one by name for a game, as a training league names them
(``league.scripted`` of `mas_train`): ``random`` (any game), ``minimax`` (tic-tac-toe; ``minimax?epsilon=0.2``),
``equilibrium`` (Kuhn poker; ``equilibrium?alpha=0.3``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from urllib.parse import parse_qsl

import numpy as np

from mas_envs.games.kuhn import check_policy, equilibrium_policy, info_set_of, legal_actions
from mas_envs.games.tictactoe import board_from_text

__all__ = [
    "SCRIPTED",
    "KuhnTablePolicy",
    "MinimaxTicTacToe",
    "RandomPolicy",
    "kuhn_equilibrium",
    "minimax_value",
    "scripted_policy",
]

#: ``policy(observation, legal_moves) -> move label``
Policy = Callable[[str, Sequence[str]], str]


def _require_moves(legal_moves: Sequence[str]) -> None:
    if not legal_moves:
        raise ValueError(
            "no legal moves: call a policy only for the seat to move (infos[agent]['legal_moves'])"
        )


class RandomPolicy:
    """A uniformly random legal move.

    Args:
        seed: seed of the policy's own generator.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, observation: str, legal_moves: Sequence[str]) -> str:
        _require_moves(legal_moves)
        return str(legal_moves[int(self.rng.integers(len(legal_moves)))])


_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def _winner(board: str) -> str | None:
    for a, b, c in _LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return None


@cache
def minimax_value(board: str) -> int:
    """The game value for the player to move on `board` (9 chars in reading order, ``X``/``O``/``.``):
    +1 a forced win, 0 a draw, -1 a forced loss. X moves when the counts of X and O are equal."""
    if _winner(board) is not None:
        return -1  # the previous player completed a line
    if "." not in board:
        return 0
    me = "X" if board.count("X") == board.count("O") else "O"
    return max(-minimax_value(board[:i] + me + board[i + 1 :]) for i in range(9) if board[i] == ".")


class MinimaxTicTacToe:
    """Tic-tac-toe by exact minimax; with probability `epsilon` a random legal move instead.

    The board and the mark to move are read from the observation (the grid `mas_envs.games.tictactoe`
    renders; X moves when both marks are equally many).

    Args:
        epsilon: probability of a uniformly random legal move, in [0, 1] (0: perfect play, never loses).
        seed: seed of the policy's own generator (random moves and tie-breaking).

    Raises:
        ValueError: `epsilon` outside [0, 1].
    """

    def __init__(self, epsilon: float = 0.0, seed: int | None = None) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.rng = np.random.default_rng(seed)

    def __call__(self, observation: str, legal_moves: Sequence[str]) -> str:
        _require_moves(legal_moves)
        if self.epsilon and self.rng.random() < self.epsilon:
            return str(legal_moves[int(self.rng.integers(len(legal_moves)))])
        board = "".join(c or "." for c in board_from_text(observation))
        me = "X" if board.count("X") == board.count("O") else "O"
        scored = []
        for label in legal_moves:
            i = int(label) - 1
            scored.append((-minimax_value(board[:i] + me + board[i + 1 :]), str(label)))
        best = max(v for v, _ in scored)
        choices = [m for v, m in scored if v == best]
        return choices[int(self.rng.integers(len(choices)))]


class KuhnTablePolicy:
    """Kuhn poker by a policy table (information set -> probability of bet/call; `mas_envs.games.kuhn`).

    Args:
        table: the 12 information sets of `mas_envs.games.kuhn.INFO_SETS` -> probability of the aggressive move.
        seed: seed of the policy's own generator.
    """

    def __init__(self, table: Mapping[str, float], seed: int | None = None) -> None:
        self.table = check_policy(table)
        self.rng = np.random.default_rng(seed)

    def __call__(self, observation: str, legal_moves: Sequence[str]) -> str:
        _require_moves(legal_moves)
        key = info_set_of(observation)
        passive, aggressive = legal_actions(key[1:])
        if set(legal_moves) != {passive, aggressive}:
            raise ValueError(f"legal moves {list(legal_moves)} do not match information set {key!r}")
        return aggressive if self.rng.random() < self.table[key] else passive


def kuhn_equilibrium(alpha: float = 0.0, seed: int | None = None) -> KuhnTablePolicy:
    """Kuhn's equilibrium (`mas_envs.games.kuhn.equilibrium_policy`) as a policy."""
    return KuhnTablePolicy(equilibrium_policy(alpha), seed=seed)


#: scripted opponents by name: the game they play (its ``metadata["name"]`` prefix; ``None``: any game), their factory
SCRIPTED: dict[str, tuple[str | None, Callable[..., Policy]]] = {
    "random": (None, RandomPolicy),
    "minimax": ("tictactoe", MinimaxTicTacToe),
    "equilibrium": ("kuhn-poker", kuhn_equilibrium),
}


def scripted_policy(spec: str, game: str, seed: int | None = None) -> Policy:
    """A scripted opponent from its spec ``name`` or ``name?key=value&...`` (float values), for ``game`` (the
    env's ``metadata["name"]``, e.g. ``tictactoe-v0``), drawing from its own generator seeded with ``seed``.

    Raises:
        ValueError: an unknown name, one that does not play this game, or keywords its policy does not take
            (e.g. ``minimax?epsilon=2``).
    """
    name, _, query = spec.partition("?")
    if name not in SCRIPTED:
        raise ValueError(f"unknown scripted opponent {name!r}; choose from {sorted(SCRIPTED)}")
    plays, factory = SCRIPTED[name]
    if plays is not None and not game.startswith(plays):
        raise ValueError(f"scripted opponent {name!r} plays {plays} only, not {game}; use 'random' there")
    try:
        kwargs = {
            k: float(v) for k, v in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
        }
        return factory(seed=seed, **kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"scripted opponent {spec!r}: {err}") from None

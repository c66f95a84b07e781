"""# Tic-tac-toe (`mas/tictactoe-v0`): PettingZoo's `tictactoe_v3` played as text

| | |
|---|---|
| Creation | `mas_envs.make("tictactoe")` |
| Agents | `player_1` (X, moves first), `player_2` (O) — PettingZoo's names |
| Observation | the seat's prompt: the rules, the board (empty cells show their number), the legal moves and the reply format |
| Action | any `str`; a move is `<move>N</move>` with N the cell number 1–9, counted row by row from the top left (variants: `mas_envs.games.moves`) |
| Reward | the game's: +1 win, -1 loss, 0 draw per seat (zero-sum, `Outcome.agent_rewards`); an illegal move: `illegal_rewards` (default -1 offender, 0 other) under `illegal_move="terminate"` |
| Termination | three in a row, a full board, or an illegal move that ends the game |
| Stop strings | `</move>` |
| Metrics | `mas_envs.games.base`: win/draw/loss and illegal-move rate per seat, game length, forfeit |

The rules are PettingZoo's (`pettingzoo.classic.tictactoe_v3`, which this env steps): PettingZoo numbers the
cells column by column from 0 (``0 3 6 / 1 4 7 / 2 5 8``); the prompt shows the usual reading order 1–9, so
cell ``N`` is PettingZoo's action ``3 * ((N - 1) % 3) + (N - 1) // 3``.

Arguments: `illegal_move` (`"terminate"` or `"retry"`), `illegal_rewards` (default `(-1.0, 0.0)`),
`max_retries` (default 2), `invalid_action_penalty` (c, default 0), `max_turns`, `render_mode`.

Requires PettingZoo's classic games (``pip install mas-rl[games]``: pygame-ce, which PettingZoo's module imports).

## Version history
* v0: initial release.
"""

from __future__ import annotations

import re
from typing import Any

from mas_envs.core import GoldenEpisode, wrap
from mas_envs.games.bridge import PettingZooGameEnv

__all__ = ["TicTacToeEnv", "board_from_text", "env", "raw_env"]

MARKS = {"player_1": "X", "player_2": "O"}
# reading-order cell n (0-based) -> PettingZoo action (column-major)
_CELL_TO_ACTION = [3 * (n % 3) + n // 3 for n in range(9)]
_ACTION_TO_CELL = {a: n for n, a in enumerate(_CELL_TO_ACTION)}
_BOARD_LINE_RE = re.compile(r"^ (\S) \| (\S) \| (\S)$", re.MULTILINE)


def render_board(cells: list[str]) -> str:
    """The 3x3 grid of 9 cells in reading order (``"X"``, ``"O"`` or ``""`` for empty: shown as its number)."""
    shown = [c or str(i + 1) for i, c in enumerate(cells)]
    rows = [f" {shown[r * 3]} | {shown[r * 3 + 1]} | {shown[r * 3 + 2]}" for r in range(3)]
    return "\n---+---+---\n".join(rows)


def board_from_text(observation: str) -> list[str]:
    """The board (9 cells in reading order, ``"X"``, ``"O"`` or ``""``) from the last grid in an observation.

    Raises:
        ValueError: the text holds no complete board.
    """
    rows = _BOARD_LINE_RE.findall(observation)
    if len(rows) < 3:
        raise ValueError("no tic-tac-toe board found in the observation")
    cells = [c for row in rows[-3:] for c in row]
    return [c if c in ("X", "O") else "" for c in cells]


class TicTacToeEnv(PettingZooGameEnv):
    """Tic-tac-toe as text (module docstring); arguments as `mas_envs.games.base.TextGameEnv`."""

    metadata = {"name": "tictactoe-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("player_1", "player_2")
    stop_strings = {"player_1": ("</move>",), "player_2": ("</move>",)}
    move_labels = tuple(str(n) for n in range(1, 10))
    game_title = "tic-tac-toe"
    rules_text = (
        "Tic-tac-toe on a 3x3 board. Players take turns putting their mark in an empty cell; X moves first. "
        "Three of your marks in a row, column or diagonal wins; a full board without a line is a draw."
    )

    def make_game(self) -> Any:
        # PettingZoo's own module (the `classic/tictactoe-v3` entry point's); its versioned alias
        # `pettingzoo.classic.tictactoe_v3` warns that direct imports are deprecated
        from pettingzoo.classic.tictactoe.tictactoe import raw_env as game

        return game()

    def action_label(self, action: int) -> str:
        return str(_ACTION_TO_CELL[action] + 1)

    def cells(self) -> list[str]:
        """The board in reading order: ``"X"``, ``"O"`` or ``""``."""
        squares = self.game.board.squares  # column-major, 1 = player_1 (X), 2 = player_2 (O)
        return [{0: "", 1: "X", 2: "O"}[squares[_CELL_TO_ACTION[n]]] for n in range(9)]

    def describe(self, agent: str) -> tuple[str, str]:
        mark = MARKS[agent]
        other = "O" if mark == "X" else "X"
        system = f"You are playing tic-tac-toe as {mark}."
        return system, (
            f"You are {mark}; your opponent is {other}.\n\n"
            f"Board (empty cells show their number):\n{render_board(self.cells())}"
        )

    def move_error(self, agent: str, label: str) -> str:
        return (
            f"cell {label} is already taken"
            if self.cells()[int(label) - 1]
            else f"cell {label} is not legal now"
        )

    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        task = cls.default_game_tasks()[0]
        x, o = "player_1", "player_2"
        return [
            GoldenEpisode(
                "X takes the top row",
                task,
                ("<move>1</move>", "I play 4", "<move>2</move>", "position 5", "3"),
                (x, o, x, o, x),
                {x: 1.0, o: -1.0},
                0.0,
                True,
            ),
            GoldenEpisode(
                "O plays a taken cell (terminate)",
                task,
                ("<move>5</move>", "<move>5</move>"),
                (x, o),
                {x: 0.0, o: -1.0},
                -0.5,
                False,
                env_kwargs={"illegal_move": "terminate"},
            ),
            GoldenEpisode(
                "retry, then SPIRAL's rewards for the second illegal move",
                task,
                ("<move>5</move>", "no idea", "<move>5</move>"),
                (x, o, o),
                {x: 0.5, o: -1.5 - 2 * 0.25},
                -0.5,
                False,
                env_kwargs={
                    "illegal_move": "retry",
                    "max_retries": 1,
                    "illegal_rewards": (-1.5, 0.5),
                    "invalid_action_penalty": 0.25,
                },
            ),
        ]


def raw_env(**kwargs: Any) -> TicTacToeEnv:
    return TicTacToeEnv(**kwargs)


def env(**kwargs: Any) -> Any:
    """`TicTacToeEnv(**kwargs)` in PettingZoo's `OrderEnforcingWrapper`."""
    return wrap(TicTacToeEnv(**kwargs))

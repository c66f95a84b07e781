"""# Connect four (`mas/connect-four-v0`): PettingZoo's `connect_four_v3` played as text

| | |
|---|---|
| Creation | `mas_envs.make("connect-four")` |
| Agents | `player_0` (X, moves first), `player_1` (O) — PettingZoo's names |
| Observation | the seat's prompt: the rules, the 6x7 board (`.` empty, column numbers on top), the legal moves and the reply format |
| Action | any `str`; a move is `<move>N</move>` with N the column 1–7 from the left (variants: `mas_envs.games.moves`) |
| Reward | the game's: +1 win, -1 loss, 0 draw per seat (zero-sum, `Outcome.agent_rewards`); an illegal move: `illegal_rewards` (default -1 offender, 0 other) under `illegal_move="terminate"` |
| Termination | four in a line, a full board, or an illegal move that ends the game |
| Stop strings | `</move>` |
| Metrics | `mas_envs.games.base`: win/draw/loss and illegal-move rate per seat, game length, forfeit |

The rules are PettingZoo's (`pettingzoo.classic.connect_four_v3`, which this env steps; column N is its action
N - 1). Arguments as `mas_envs.games.tictactoe`. Requires ``mas-rl[games]`` (pygame-ce, imported by PettingZoo).

## Version history
* v0: initial release.
"""

from __future__ import annotations

from typing import Any

from mas_envs.core import GoldenEpisode, wrap
from mas_envs.games.bridge import PettingZooGameEnv

__all__ = ["ConnectFourEnv", "env", "raw_env"]

MARKS = {"player_0": "X", "player_1": "O"}


class ConnectFourEnv(PettingZooGameEnv):
    """Connect four as text (module docstring); arguments as `mas_envs.games.base.TextGameEnv`."""

    metadata = {"name": "connect-four-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("player_0", "player_1")
    stop_strings = {"player_0": ("</move>",), "player_1": ("</move>",)}
    move_labels = tuple(str(n) for n in range(1, 8))
    game_title = "connect four"
    rules_text = (
        "Connect four on a board of 6 rows and 7 columns. Players take turns dropping a disc into a column that "
        "is not full; it falls to the lowest empty row. X moves first. Four of your discs in a row, column or "
        "diagonal wins; a full board without a line is a draw."
    )

    def make_game(self) -> Any:
        # PettingZoo's own module (the `classic/connect_four-v3` entry point's); its versioned alias
        # `pettingzoo.classic.connect_four_v3` warns that direct imports are deprecated
        from pettingzoo.classic.connect_four.connect_four import raw_env as game

        return game()

    def board_text(self) -> str:
        """The board, top row first: ``X``, ``O`` or ``.`` per cell, column numbers above."""
        cells = self.game.board  # 42 cells, row-major from the top, 1 = player_0, 2 = player_1
        rows = [" ".join(".XO"[cells[r * 7 + c]] for c in range(7)) for r in range(6)]
        return "\n".join([" ".join(self.move_labels), *rows])

    def describe(self, agent: str) -> tuple[str, str]:
        mark = MARKS[agent]
        other = "O" if mark == "X" else "X"
        return f"You are playing connect four as {mark}.", (
            f"You are {mark}; your opponent is {other}.\n\nBoard (. is empty):\n{self.board_text()}"
        )

    def move_error(self, agent: str, label: str) -> str:
        return f"column {label} is full"

    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        task = cls.default_game_tasks()[0]
        x, o = "player_0", "player_1"
        return [
            GoldenEpisode(
                "X stacks four in column 1",
                task,
                ("<move>1</move>", "<move>2</move>") * 3 + ("column 1",),
                (x, o) * 3 + (x,),
                {x: 1.0, o: -1.0},
                0.0,
                True,
            ),
            GoldenEpisode(
                "X plays column 8 (no such column)",
                task,
                ("<move>8</move>",),
                (x,),
                {x: -1.0, o: 0.0},
                -0.5,
                False,
                env_kwargs={"illegal_move": "terminate"},
            ),
        ]


def raw_env(**kwargs: Any) -> ConnectFourEnv:
    return ConnectFourEnv(**kwargs)


def env(**kwargs: Any) -> Any:
    """`ConnectFourEnv(**kwargs)` in PettingZoo's `OrderEnforcingWrapper`."""
    return wrap(ConnectFourEnv(**kwargs))

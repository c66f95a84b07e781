"""The bridge from PettingZoo's turn-based games to text envs: `PettingZooGameEnv`.

Any PettingZoo AEC game whose action spaces are `Discrete` and whose observations are dicts with an
``"action_mask"`` (the classic games: tic-tac-toe, connect four, chess, go, ...) becomes a `TextGameEnv`:

* the inner game is PettingZoo's own **raw** env (``raw_env()``, without its ``TerminateIllegalWrapper``): the
  bridge never passes it an illegal action, it applies the illegal-move rule itself (`mas_envs.games.base`);
* the legal moves of the seat to move are the ones its ``action_mask`` allows, each shown by a text label
  (`action_label`, e.g. the cell number);
* the seats' rewards are what PettingZoo's standard loop would give each agent (the sum of its ``last()``
  rewards, read from the inner env's ``_cumulative_rewards``), so they are the game's own (zero-sum) rewards;
* pickling keeps the moves played and replays them into a fresh inner game (PettingZoo's classic envs pickle
  only their constructor arguments, ``EzPickle``), so the games must be deterministic given their moves.

A game supplies `make_game()` (imports the PettingZoo module lazily: `import mas_envs` never imports
PettingZoo's classic games, which need ``pygame``), `action_label`, and `describe` (how the position reads).
`mas_envs.games.tictactoe` and `mas_envs.games.connect_four` are the two examples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from mas_envs.games.base import TextGameEnv

__all__ = ["PettingZooGameEnv"]


class PettingZooGameEnv(TextGameEnv):
    """A PettingZoo AEC game with `Discrete` actions and an ``action_mask``, played as text (module docstring).

    Subclasses set ``possible_agents`` (the inner game's agents, in its order), ``move_labels`` (the label of
    action ``i`` is ``move_labels[i]`` unless `action_label` says otherwise) and implement `make_game` and
    `describe`.
    """

    def make_game(self) -> Any:
        """A fresh inner PettingZoo AEC env (its ``raw_env()``)."""
        raise NotImplementedError

    def action_label(self, action: int) -> str:
        """The text label of inner action `action`."""
        return self.move_labels[action]

    def _inner_game(self) -> Any:
        """`make_game()`, with one error line where PettingZoo's classic games cannot be imported.

        Raises:
            ImportError: PettingZoo's classic modules import pygame at the top, which only the `games` extra
                installs.
        """
        try:
            return self.make_game()
        except ModuleNotFoundError as e:
            raise ImportError(
                f"{type(self).__name__} plays PettingZoo's classic games, which need {e.name!r}: "
                "pip install 'mas-rl[games]'"
            ) from e

    # --- TextGameEnv hooks ---------------------------------------------------------------------------------
    def new_game(self, task: dict[str, Any]) -> str:
        self.game = self._inner_game()
        self.game.reset()
        if list(self.game.possible_agents) != list(self.possible_agents):
            raise RuntimeError(
                f"{type(self).__name__}: the inner game's agents {self.game.possible_agents} differ from "
                f"possible_agents {list(self.possible_agents)}"
            )
        space = self.game.action_space(self.possible_agents[0])
        obs = self.game.observe(self.game.agent_selection)
        if not isinstance(space, spaces.Discrete) or not isinstance(obs, dict) or "action_mask" not in obs:
            raise TypeError(
                f"{type(self).__name__}: the bridge needs a game with Discrete actions and dict observations "
                f"holding an 'action_mask'; got {space} and {type(obs).__name__}"
            )
        self.history: list[int] = []  # inner actions played, for pickling
        self._label_to_action = {self.action_label(i): i for i in range(int(space.n))}
        self._returns = dict.fromkeys(self.possible_agents, 0.0)
        return str(self.game.agent_selection)

    def legal_moves(self, agent: str) -> list[str]:
        game = self.game
        if (
            not game.agents
            or agent != game.agent_selection
            or game.terminations[agent]
            or game.truncations[agent]
        ):
            return []
        mask = np.asarray(game.observe(agent)["action_mask"])
        legal = {self.action_label(int(i)) for i in np.flatnonzero(mask)}
        return [m for m in self.move_labels if m in legal]

    def play(self, agent: str, label: str) -> str | None:
        action = self._label_to_action[label]
        self._step_inner(action)
        self.history.append(action)
        game = self.game
        # dead-step the inner game's finished agents (collecting their last rewards) to find who moves next
        while game.agents and (
            game.terminations[game.agent_selection] or game.truncations[game.agent_selection]
        ):
            done = game.agent_selection
            self._returns[done] += float(game._cumulative_rewards[done])
            game.step(None)
        return str(game.agent_selection) if game.agents else None

    def _step_inner(self, action: int) -> None:
        game = self.game
        mover = game.agent_selection
        self._returns[mover] += float(game._cumulative_rewards[mover])  # what last() would give it now
        game.step(action)

    def game_rewards(self) -> dict[str, float]:
        return dict(self._returns)

    # --- pickling: the inner game is rebuilt by replaying the moves ----------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("game", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "history" in state:
            moves, returns = list(self.history), dict(self._returns)
            self.game = self._inner_game()
            self.game.reset()
            for action in moves:
                self._step_inner(action)
                game = self.game
                while game.agents and (
                    game.terminations[game.agent_selection] or game.truncations[game.agent_selection]
                ):
                    game.step(None)
            self._returns = returns

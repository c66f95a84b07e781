"""Two-player games as text envs: PettingZoo's turn-based classic games through a bridge, and Kuhn poker.

* `mas_envs.games.base.TextGameEnv`: move format, illegal-move rule, per-seat rewards and metrics.
* `mas_envs.games.bridge.PettingZooGameEnv`: any PettingZoo AEC game with `Discrete` actions and an
  ``action_mask``; `tictactoe` (``mas/tictactoe-v0``) and `connect_four` (``mas/connect-four-v0``) use it.
* `mas_envs.games.kuhn`: ``mas/kuhn-poker-v0`` and its exact `exploitability`.
* `mas_envs.games.opponents`: scripted policies (random legal move, epsilon-minimax tic-tac-toe, the Kuhn
  equilibrium).

Importing this package imports none of the game modules (PettingZoo's classic games pull in pygame).
"""

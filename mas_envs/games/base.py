"""`TextGameEnv`: the part every two-player text game shares — move parsing, the illegal-move rule, per-seat
rewards and per-seat metrics. A game describes its rules through a few hooks (below); the PettingZoo bridge
(`mas_envs.games.bridge`) and Kuhn poker (`mas_envs.games.kuhn`) are its two kinds of game.

Turn, move and reward rules
---------------------------
* The agents are the game's seats (e.g. ``player_1``, ``player_2``). Each turn the seat to move gets a prompt
  with the rules, the position, its legal moves and the reply format ``<move>LABEL</move>``
  (`mas_envs.games.moves`, which also lists the variants the parser accepts).
* A reply that names no move, names an unknown move, or names a move that is not legal now is an **illegal
  move** (`infos[agent]["invalid_action"]` is True). What happens then is the ``illegal_move`` rule:

  - ``"terminate"`` (default, PettingZoo's ``TerminateIllegalWrapper``): the game ends at once; the offender
    gets ``illegal_rewards[0]`` and every other seat ``illegal_rewards[1]``. Default ``(-1.0, 0.0)``, as
    PettingZoo's classic games (``illegal_reward=-1``); SPIRAL (Liu et al. 2025, "SPIRAL: Self-Play on Zero-Sum
    Games Incentivizes Reasoning", its ``train_spiral.py``) uses ``(-1.5, 0.5)``.
  - ``"retry"`` (TextArena's error allowance): the same seat moves again, and its prompt now starts with what
    was wrong (``Your last reply was not a legal move: ...``); a seat's ``max_retries``-th + 1 illegal move in
    a game ends it as under ``"terminate"``.

* Every seat's outcome reward comes from the game (zero-sum: +1 win, -1 loss, 0 draw in tic-tac-toe and
  connect four; chips won in Kuhn poker) and reaches it through `Outcome.agent_rewards` (the env declares
  ``per_agent_rewards = True``): seats do *not* share a team reward. ``team_reward`` is the mean over seats (0
  in a zero-sum game played to its end), ``success`` says the game ended by its rules (no forfeit).
* The invalid-action penalty ``c`` of `TextAECEnv` (default here 0) is subtracted on top for every illegal
  reply, so with the defaults the returns are exactly PettingZoo's.

Episode metrics (``infos[agent]["episode_metrics"]``, logged as ``env/<name>``)
--------------------------------------------------------------------------------
``<seat>/win``, ``<seat>/draw``, ``<seat>/loss`` (1.0 or 0.0: the result by the game's rules, or, after a
forfeit, a loss for the offender and a win for the others), ``<seat>/illegal_rate`` (illegal replies / the
seat's turns; absent for a seat that never moved), ``game_length`` (legal moves played), ``forfeit`` (1.0
when an illegal move ended the game).

Writing a game
--------------
Subclass `TextGameEnv`, set ``possible_agents``, ``metadata``, ``move_labels`` (every label, in a fixed
order) and implement:

* `new_game(task) -> str`: start a game for the task row, return the first seat;
* `legal_moves(agent) -> list[str]`: the labels legal for ``agent`` now (in ``move_labels`` order);
* `play(agent, label) -> str | None`: play a legal move; return the next seat, or ``None`` when the game is over;
* `game_rewards() -> dict[str, float]`: every seat's reward of a finished game;
* `describe(agent) -> tuple[str, str]`: (system line, the position as text) for the prompt;
* `move_error(agent, label) -> str`: why a known but illegal label is illegal (e.g. ``cell 5 is taken``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, ClassVar

from mas_envs.core import Outcome, TextAECEnv, TranscriptEntry, Transition
from mas_envs.games.moves import MOVE_FUZZ, format_move, parse_move

__all__ = ["ILLEGAL_MOVE_RULES", "TextGameEnv"]

ILLEGAL_MOVE_RULES = ("terminate", "retry")
#: how the prompt's last line shows the reply format: ``example`` names the first legal move as an example;
#: ``choices`` lists every legal move in the tag format, none singled out
MOVE_HINTS = ("example", "choices")


class TextGameEnv(TextAECEnv):
    """Base class of the two-player text games (see the module docstring for the rules it enforces).

    Args:
        illegal_move: ``"terminate"`` or ``"retry"``.
        illegal_rewards: (offender, every other seat) rewards when an illegal move ends the game.
        max_retries: under ``"retry"``, illegal moves a seat may make in one game before the next one ends it
            (>= 0; ignored under ``"terminate"``).
        move_hint: ``"example"`` (default: ``Reply with your move as <move>MOVE</move>, for example
            <move>check</move>``, the first legal move) or ``"choices"`` (``Reply with exactly one of:
            <move>check</move> or <move>bet</move>``). A small model copies the example: SmolLM2-135M's Kuhn
            poker table is p(bet or call) <= 0.01 everywhere with ``example`` (exploitability 0.9914) and 0.07-0.26
            with ``choices`` (0.7911), so ``choices`` leaves a learner something to explore.
        **kwargs: `TextAECEnv` arguments (``tasks``, ``invalid_action_penalty``, ``max_turns``,
            ``render_mode``).

    Raises:
        ValueError: an unknown rule or move hint, ``illegal_rewards`` that are not two finite numbers, or a
            negative ``max_retries``.
    """

    per_agent_rewards = True
    eval_plays_train_tasks = True  # deals and start positions: evaluation plays them too, nothing is held out
    default_invalid_action_penalty = 0.0
    move_labels: ClassVar[tuple[str, ...]] = ()
    game_title: ClassVar[str] = "game"
    rules_text: ClassVar[str] = ""

    def __init__(
        self,
        *,
        illegal_move: str = "terminate",
        illegal_rewards: Sequence[float] = (-1.0, 0.0),
        max_retries: int = 2,
        move_hint: str = "example",
        **kwargs: Any,
    ) -> None:
        if illegal_move not in ILLEGAL_MOVE_RULES:
            raise ValueError(f"illegal_move must be one of {ILLEGAL_MOVE_RULES}, got {illegal_move!r}")
        if move_hint not in MOVE_HINTS:
            raise ValueError(f"move_hint must be one of {MOVE_HINTS}, got {move_hint!r}")
        self.move_hint: str = move_hint
        pair = tuple(illegal_rewards)
        if len(pair) != 2 or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in pair
        ):
            raise ValueError(
                f"illegal_rewards must be two finite numbers (offender, others), e.g. (-1.0, 0.0); got {illegal_rewards!r}"
            )
        if not isinstance(max_retries, numbers.Integral) or isinstance(max_retries, bool) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        kwargs.setdefault("tasks", self.default_game_tasks())
        super().__init__(**kwargs)
        self.illegal_move: str = illegal_move
        self.illegal_rewards: tuple[float, float] = (float(pair[0]), float(pair[1]))
        self.max_retries: int = int(max_retries)
        self._action_spaces = {  # the move tags and labels, so random text reaches legal moves too
            a: type(self._action_spaces[a])(
                fragments=MOVE_FUZZ + tuple(format_move(m) for m in self.move_labels) + self.move_labels
            )
            for a in self.possible_agents
        }

    # --- game hooks ----------------------------------------------------------------------------------------
    @classmethod
    def default_game_tasks(cls) -> list[dict[str, Any]]:
        """The env's own task rows when none are given (default: one row, the game's standard start)."""
        name = cls.metadata["name"].rsplit("-v", 1)[0]
        return [{"id": f"{name}/start", "question": f"Play {cls.game_title}.", "data_source": name}]

    def new_game(self, task: dict[str, Any]) -> str:
        raise NotImplementedError

    def legal_moves(self, agent: str) -> list[str]:
        """The move labels legal for `agent` now (empty when it is not that seat's turn or the game is over)."""
        raise NotImplementedError

    def play(self, agent: str, label: str) -> str | None:
        raise NotImplementedError

    def game_rewards(self) -> dict[str, float]:
        raise NotImplementedError

    def describe(self, agent: str) -> tuple[str, str]:
        raise NotImplementedError

    def move_error(self, agent: str, label: str) -> str:
        return f"{label} is not a legal move now"

    # --- TextAECEnv hooks ----------------------------------------------------------------------------------
    def start_episode(self, task: dict[str, Any]) -> str:
        self.moves_played = 0
        self.forfeit_by: str | None = None
        self.errors: dict[str, str] = {}  # seat -> what was wrong with its last reply (retry rule)
        self.illegal_count = dict.fromkeys(self.possible_agents, 0)
        self.turn_count = dict.fromkeys(self.possible_agents, 0)
        return self.new_game(task)

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        system, position = self.describe(agent)
        legal = self.legal_moves(agent)
        parts = []
        if agent in self.errors:
            left = self.max_retries - self.illegal_count[agent] + 1
            parts.append(
                f"Your last reply was not a legal move: {self.errors[agent]}. "
                f"{left} more illegal move{'s' if left != 1 else ''} and you lose the game."
            )
        parts.append(self.rules_text)
        parts.append(position)
        if legal:
            parts.append("Legal moves: " + ", ".join(legal))
            if self.move_hint == "choices":
                parts.append("Reply with exactly one of: " + " or ".join(format_move(m) for m in legal) + ".")
            else:
                parts.append(
                    f"Reply with your move as {format_move('MOVE')}, for example {format_move(legal[0])}."
                )
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    def apply_action(self, agent: str, action: str) -> Transition:
        self.turn_count[agent] += 1
        label = parse_move(action, self.move_labels)
        legal = self.legal_moves(agent)
        if label is not None and label in legal:
            self.errors.pop(agent, None)
            self.moves_played += 1
            return Transition(invalid=False, next_agent=self.play(agent, label))
        self.illegal_count[agent] += 1
        why = (
            "no move found (write it as " + format_move(legal[0] if legal else "MOVE") + ")"
            if label is None
            else self.move_error(agent, label)
        )
        if self.illegal_move == "retry" and self.illegal_count[agent] <= self.max_retries:
            self.errors[agent] = why
            self._notes.append(f"illegal move by {agent}: {why}; it moves again")
            return Transition(invalid=True, next_agent=agent)
        self.forfeit_by = agent
        self._notes.append(f"illegal move by {agent}: {why}; {agent} loses the game")
        return Transition(invalid=True, next_agent=None)

    def episode_outcome(self) -> Outcome:
        if self.forfeit_by is not None:
            bad, good = self.illegal_rewards
            rewards = {a: bad if a == self.forfeit_by else good for a in self.possible_agents}
            results = {a: "loss" if a == self.forfeit_by else "win" for a in self.possible_agents}
        elif self.truncated:  # the max_turns cap: no result
            rewards = dict.fromkeys(self.possible_agents, 0.0)
            results = dict.fromkeys(self.possible_agents, "draw")
        else:
            rewards = {a: float(r) for a, r in self.game_rewards().items()}
            results = {a: "win" if r > 0 else "loss" if r < 0 else "draw" for a, r in rewards.items()}
        metrics: dict[str, float] = {
            "game_length": float(self.moves_played),
            "forfeit": float(bool(self.forfeit_by)),
        }
        for a in self.possible_agents:
            for result in ("win", "draw", "loss"):
                metrics[f"{a}/{result}"] = 1.0 if results[a] == result else 0.0
            if self.turn_count[a]:
                metrics[f"{a}/illegal_rate"] = self.illegal_count[a] / self.turn_count[a]
        return Outcome(
            team_reward=sum(rewards.values()) / len(rewards),
            success=self.forfeit_by is None and not self.truncated,
            metrics=metrics,
            agent_rewards=rewards,
        )

    def step(self, action: str | None) -> None:
        """`TextAECEnv.step`, then the env's notes on an illegal move, so the transcript lists them after the
        move they are about (the base class records an action only after `apply_action` returns)."""
        self._notes: list[str] = []
        super().step(action)
        for text in self._notes:  # an env note shares the turn of the action it follows
            self.transcript.append(TranscriptEntry(self.turn - 1, "env", text))
        self._notes = []

    def _refresh_infos(self) -> None:
        super()._refresh_infos()
        for a in self.agents:
            self.infos[a]["legal_moves"] = self.legal_moves(a) if a == self.agent_selection else []

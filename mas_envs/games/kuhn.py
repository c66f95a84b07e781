"""# Kuhn poker (`mas/kuhn-poker-v0`), and the exact exploitability of a policy table

| | |
|---|---|
| Creation | `mas_envs.make("kuhn-poker")` |
| Agents | `player_0` (acts first), `player_1` |
| Observation | the seat's prompt: the rules, its card, the betting so far, the pot, the legal moves and the reply format |
| Action | any `str`; a move is `<move>check</move>`, `<move>bet</move>`, `<move>call</move>` or `<move>fold</move>` (variants: `mas_envs.games.moves`) |
| Reward | chips won: +1/-1 after check-check or a fold, +2/-2 after a called bet (zero-sum, `Outcome.agent_rewards`); an illegal move: `illegal_rewards` (default -1 offender, 0 other) under `illegal_move="terminate"` |
| Termination | a showdown or a fold (at most 3 moves), or an illegal move that ends the hand |
| Stop strings | `</move>` |
| Default tasks | the 6 deals (`player_0`'s card, `player_1`'s card), one row each: `reset(seed=...)` deals uniformly |
| Metrics | `mas_envs.games.base`: win/draw/loss and illegal-move rate per seat, game length, forfeit |

## Rules (Kuhn 1950)
A deck of three cards, J < Q < K. Each player antes 1 chip and is dealt one card. `player_0` checks or bets 1.
After a check, `player_1` checks (showdown: the higher card wins the pot of 2, i.e. +1) or bets 1; after a bet
the player facing it calls (showdown for a pot of 4, i.e. +2) or folds (the bettor wins the antes, +1).

## Information sets and the policy table
A seat's information set is its card and the betting so far, written ``"<card><history>"`` with ``p`` for a
check or fold and ``b`` for a bet or call: ``player_0`` decides at ``""`` and ``"pb"`` (checked, then faced a
bet), ``player_1`` at ``"p"`` and ``"b"``. The 12 keys are `INFO_SETS`. A **policy table** maps each key to
the probability of the *aggressive* action there: bet at ``""`` / ``"p"``, call at ``"b"`` / ``"pb"``.

`exploitability(policy)` is (BR₀ + BR₁) / 2 in chips per hand, where BR_i is the value seat i gets with a
best response against the table's other seat (OpenSpiel's ``exploitability``, i.e. NashConv / 2; Lanctot et
al. 2019, arXiv 1908.09453, §5 "Exploitability and NashConv"). It is 0 exactly at an equilibrium, and
0.458333… for the uniform table (the value OpenSpiel reports for Kuhn's uniform random policy). For an LLM,
`policy_from_logprobs` turns the log-probabilities of the legal move texts at each information set
(`info_set_messages`, `action_texts`) into the table: no sampling noise.

The equilibria (`equilibrium_policy`) are Kuhn's one-parameter family (Kuhn 1950, "A simplified two-person
poker", Contributions to the Theory of Games I, pp. 97-103; as tabulated in the Wikipedia article "Kuhn
poker" and Southey et al. 2005, "Bayes' Bluff", UAI): for α in [0, 1/3], ``player_0`` bets J with α, never
bets Q, bets K with 3α, calls with Q after check-bet with α + 1/3 (J folds, K calls); ``player_1`` bets J after
a check with 1/3, never bets Q, always bets K, calls a bet with Q 1/3 (J folds, K calls). ``player_0``'s
value is -1/18.

Arguments: `illegal_move`, `illegal_rewards`, `max_retries`, `move_hint`, `invalid_action_penalty`, `max_turns`,
`render_mode` (see `mas_envs.games.base`), `tasks` (deal rows: ``{"question": ..., "cards": ["K", "J"]}``).

## Version history
* v0: initial release.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Mapping
from typing import Any

from mas_envs.core import ExactEvaluation, GoldenEpisode, Scorer, wrap
from mas_envs.games.base import TextGameEnv
from mas_envs.games.moves import format_move

__all__ = [
    "CARDS",
    "EQUILIBRIUM_VALUE_0",
    "EQUILIBRIUM_VALUE_1",
    "INFO_SETS",
    "KuhnPokerEnv",
    "action_texts",
    "best_response_values",
    "check_policy",
    "env",
    "equilibrium_policy",
    "equilibrium_range",
    "exploitability",
    "format_policy_table",
    "game_value",
    "info_set_messages",
    "info_set_of",
    "legal_actions",
    "policy_from_logprobs",
    "policy_table",
    "raw_env",
]

CARDS = ("J", "Q", "K")
SEATS = ("player_0", "player_1")
FIRST_SEAT_HISTORIES = ("", "pb")
SECOND_SEAT_HISTORIES = ("p", "b")
INFO_SETS: tuple[str, ...] = tuple(
    c + h for h in FIRST_SEAT_HISTORIES + SECOND_SEAT_HISTORIES for c in CARDS
)  # J Q K Jpb Qpb Kpb Jp Qp Kp Jb Qb Kb
_RANK = {c: i for i, c in enumerate(CARDS)}
_LETTER = {"check": "p", "fold": "p", "bet": "b", "call": "b"}
_TERMINAL = ("pp", "bp", "bb", "pbp", "pbb")
#: each seat's value at an equilibrium, chips per hand (Kuhn 1950)
EQUILIBRIUM_VALUE_0 = -1.0 / 18.0
EQUILIBRIUM_VALUE_1 = 1.0 / 18.0


def legal_actions(history: str) -> tuple[str, str]:
    """(passive, aggressive) move labels at `history`: ``("check", "bet")`` or ``("fold", "call")``."""
    return ("fold", "call") if history.endswith("b") else ("check", "bet")


def _payoff0(history: str, c0: str, c1: str) -> float:
    """`player_0`'s chips won at a terminal history."""
    if history == "bp":
        return 1.0
    if history == "pbp":
        return -1.0
    stake = 1.0 if history == "pp" else 2.0
    return stake if _RANK[c0] > _RANK[c1] else -stake


class KuhnPokerEnv(TextGameEnv):
    """Kuhn poker as text (module docstring); arguments as `mas_envs.games.base.TextGameEnv`."""

    metadata = {"name": "kuhn-poker-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = SEATS
    stop_strings = {"player_0": ("</move>",), "player_1": ("</move>",)}
    move_labels = ("check", "bet", "call", "fold")
    game_title = "Kuhn poker"
    rules_text = (
        "Kuhn poker. The deck has three cards: J < Q < K. Each player antes 1 chip and gets one card; "
        "player_0 acts first. A player may check or bet 1 chip. After a check, the other player may check "
        "(showdown: the higher card wins 1 chip) or bet. A player facing a bet may call (showdown: the higher "
        "card wins 2 chips) or fold (the bettor wins 1 chip)."
    )

    @classmethod
    def default_game_tasks(cls) -> list[dict[str, Any]]:
        """The 6 deals, one row each (so `reset(seed=...)` deals uniformly)."""
        return [
            {
                "id": f"kuhn-poker/{a}{b}",
                "question": f"Kuhn poker: player_0 holds {a}, player_1 holds {b}.",
                "cards": [a, b],
                "data_source": "kuhn-poker",
            }
            for a, b in itertools.permutations(CARDS, 2)
        ]

    def new_game(self, task: dict[str, Any]) -> str:
        cards = task.get("cards")
        if (
            not isinstance(cards, (list, tuple))
            or len(cards) != 2
            or any(c not in CARDS for c in cards)
            or cards[0] == cards[1]
        ):
            raise ValueError(
                f'a Kuhn poker task needs "cards": two different cards of J, Q, K; got {cards!r}'
            )
        self.cards = {SEATS[0]: str(cards[0]), SEATS[1]: str(cards[1])}
        self.history = ""
        return SEATS[0]

    def _to_act(self) -> str | None:
        return None if self.history in _TERMINAL else SEATS[len(self.history) % 2]

    def legal_moves(self, agent: str) -> list[str]:
        return list(legal_actions(self.history)) if agent == self._to_act() else []

    def play(self, agent: str, label: str) -> str | None:
        self.history += _LETTER[label]
        return self._to_act()

    def game_rewards(self) -> dict[str, float]:
        v = _payoff0(self.history, self.cards[SEATS[0]], self.cards[SEATS[1]])
        return {SEATS[0]: v, SEATS[1]: -v}

    def info_set(self, agent: str) -> str:
        """`agent`'s information set key now (its card and the betting so far)."""
        return self.cards[agent] + self.history

    def describe(self, agent: str) -> tuple[str, str]:
        me = SEATS.index(agent)
        names = []
        for i, letter in enumerate(self.history):
            facing_bet = self.history[:i].endswith("b")
            word = {"p": "fold" if facing_bet else "check", "b": "call" if facing_bet else "bet"}[letter]
            names.append(f"{'you' if i % 2 == me else 'opponent'}: {word}")
        put_in = [1, 1]
        for i, letter in enumerate(self.history):
            put_in[i % 2] += letter == "b"
        role = "you act first" if me == 0 else "you act second"
        return f"You are playing Kuhn poker as {agent} ({role}).", (
            f"You are {agent} ({role}).\nYour card: {self.cards[agent]}\n"
            f"Betting so far: {', '.join(names) if names else 'none'}\n"
            f"Pot: {sum(put_in)} chips (you have put in {put_in[me]})."
        )

    def move_error(self, agent: str, label: str) -> str:
        return f"you cannot {label} now (legal: {', '.join(legal_actions(self.history))})"

    def exact_evaluation(self, score: Scorer) -> ExactEvaluation:
        """The exact exploitability of the agents' policy, read from their log-probabilities (module docstring).

        Each seat's 6 information sets are scored with that seat's own policy (`score(seat, ...)`): the
        prompt of `info_set_messages` (on a copy of this env, so with its arguments) and the two legal move
        texts of `action_texts`, 24 scorings in all; `policy_from_logprobs` gives the table.

        Returns:
            metrics ``exploitability`` ((BR₀ + BR₁) / 2, chips per hand), ``exploitability/<seat>`` (what a
            best response gains against that seat's half of the table over the game's value: BR₁ - 1/18
            against ``player_0``, BR₀ + 1/18 against ``player_1``; their mean is ``exploitability``, both 0 at
            an equilibrium) and ``game_value`` (``player_0``'s chips per hand when the table plays itself);
            the artifact ``kuhn_policy`` (`policy_table`) and its text.
        """
        messages = _messages_at_info_sets(copy.deepcopy(self))
        logprobs: dict[str, dict[str, float]] = {}
        for seat in SEATS:
            keys = [k for k in INFO_SETS if _seat_of(k) == seat]
            rows = [(k, move, text) for k in keys for move, text in action_texts(k).items()]
            got = score(seat, [messages[k] for k, _, _ in rows], [text for _, _, text in rows])
            if len(got) != len(rows):
                raise RuntimeError(f"the scorer returned {len(got)} log-probs for {len(rows)} replies")
            for (k, move, _), lp in zip(rows, got, strict=True):
                logprobs.setdefault(k, {})[move] = float(lp)
        policy = policy_from_logprobs(logprobs)
        br0, br1 = best_response_values(policy)
        table = policy_table(policy, logprobs)
        metrics = {
            "exploitability": (br0 + br1) / 2.0,
            f"exploitability/{SEATS[0]}": br1 - EQUILIBRIUM_VALUE_1,
            f"exploitability/{SEATS[1]}": br0 - EQUILIBRIUM_VALUE_0,
            "game_value": game_value(policy),
        }
        return ExactEvaluation(metrics, {"kuhn_policy": table}, format_policy_table(table))

    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        deals = {t["id"].rsplit("/", 1)[1]: t for t in cls.default_game_tasks()}
        a, b = SEATS
        return [
            GoldenEpisode("K bets, J calls", deals["KJ"], ("<move>bet</move>", "I call"), (a, b), {a: 2.0, b: -2.0}, 0.0, True),
            GoldenEpisode("J bets, Q folds", deals["JQ"], ("bet", "<move>fold</move>"), (a, b), {a: 1.0, b: -1.0}, 0.0, True),
            GoldenEpisode("check, check: Q beats J", deals["JQ"], ("check", "check"), (a, b), {a: -1.0, b: 1.0}, 0.0, True),
            GoldenEpisode(
                "check, bet, fold", deals["QK"], ("check", "bet", "fold"), (a, b, a), {a: -1.0, b: 1.0}, 0.0, True
            ),
            GoldenEpisode(
                "check, bet, call: K wins 2", deals["KQ"], ("check", "bet", "call"), (a, b, a), {a: 2.0, b: -2.0}, 0.0, True
            ),
            GoldenEpisode("player_1 calls when no bet was made", deals["QK"], ("check", "call"), (a, b), {a: 0.0, b: -1.0}, -0.5, False,
                          env_kwargs={"illegal_move": "terminate"}),
        ]  # fmt: skip


def raw_env(**kwargs: Any) -> KuhnPokerEnv:
    return KuhnPokerEnv(**kwargs)


def env(**kwargs: Any) -> Any:
    """`KuhnPokerEnv(**kwargs)` in PettingZoo's `OrderEnforcingWrapper`."""
    return wrap(KuhnPokerEnv(**kwargs))


# --- information sets of observations, prompts and completions -----------------------------------------------
_CARD_RE = re.compile(r"Your card: ([JQK])\b")
_BETTING_RE = re.compile(r"Betting so far: ([^\n]*)")


def info_set_of(observation: str) -> str:
    """The information-set key (e.g. ``"Qpb"``) of a `kuhn-poker` observation.

    Raises:
        ValueError: the text is not a Kuhn poker observation.
    """
    card, betting = _CARD_RE.findall(observation), _BETTING_RE.findall(observation)
    if not card or not betting:
        raise ValueError("not a kuhn-poker observation (no 'Your card:' / 'Betting so far:' line)")
    words = (
        [] if betting[-1].strip() == "none" else [w.split(":")[-1].strip() for w in betting[-1].split(",")]
    )
    return card[-1] + "".join(_LETTER[w] for w in words)


def info_set_messages(**env_kwargs: Any) -> dict[str, list[dict[str, str]]]:
    """The prompt (chat messages) the env shows at each of the 12 information sets, keyed as `INFO_SETS`.

    The prompt never shows the opponent's card, so one deal per key gives it. `env_kwargs` are passed to
    `KuhnPokerEnv` (``move_hint`` changes the prompt's last line).
    """
    return _messages_at_info_sets(KuhnPokerEnv(**env_kwargs))


def _messages_at_info_sets(game: KuhnPokerEnv) -> dict[str, list[dict[str, str]]]:
    """`info_set_messages` played out on `game` (whose episode state it overwrites)."""
    out: dict[str, list[dict[str, str]]] = {}
    for key in INFO_SETS:
        card, history = key[0], key[1:]
        seat = len(history) % 2
        other = next(c for c in CARDS if c != card)
        cards = [card, other] if seat == 0 else [other, card]
        game.reset(options={"task": {"question": "info set", "cards": cards, "id": f"kuhn-poker/{key}"}})
        for letter in history:
            passive, aggressive = legal_actions(game.history)
            game.step(format_move(aggressive if letter == "b" else passive))
        out[key] = game.prompt_messages(SEATS[seat])
    return out


def action_texts(key: str) -> dict[str, str]:
    """The completion text of each legal move at information set `key`: ``{"check": "<move>check</move>", ...}``."""
    return {a: format_move(a) for a in legal_actions(key[1:])}


# --- policy tables -----------------------------------------------------------------------------------------
def check_policy(policy: Mapping[str, float]) -> dict[str, float]:
    """`policy` as a plain dict of floats, checked: exactly the 12 keys of `INFO_SETS`, each a probability.

    Raises:
        ValueError: a key missing or unknown, or a value that is not a number in [0, 1].
    """
    missing = [k for k in INFO_SETS if k not in policy]
    extra = [k for k in policy if k not in INFO_SETS]
    if missing or extra:
        raise ValueError(
            f"a Kuhn policy maps exactly the 12 information sets {list(INFO_SETS)} to a probability; "
            f"missing {missing}, unknown {extra}"
        )
    out = {}
    for k in INFO_SETS:
        p = policy[k]
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"policy[{k!r}] must be a probability in [0, 1], got {p!r}")
        out[k] = float(p)
    return out


def equilibrium_policy(alpha: float = 0.0) -> dict[str, float]:
    """Kuhn's equilibrium with parameter `alpha` in [0, 1/3] (module docstring; value -1/18 for player_0).

    Raises:
        ValueError: `alpha` outside [0, 1/3].
    """
    if not 0.0 <= alpha <= 1.0 / 3.0:
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha!r}")
    return {
        "J": alpha, "Q": 0.0, "K": 3.0 * alpha,
        "Jpb": 0.0, "Qpb": alpha + 1.0 / 3.0, "Kpb": 1.0,
        "Jp": 1.0 / 3.0, "Qp": 0.0, "Kp": 1.0,
        "Jb": 0.0, "Qb": 1.0 / 3.0, "Kb": 1.0,
    }  # fmt: skip


def _value0(first: Mapping[str, float], second: Mapping[str, float], c0: str, c1: str) -> float:
    """player_0's expected chips for the deal (c0, c1) when it plays `first` and player_1 plays `second`."""
    bet, call_after_check = first[c0], first[c0 + "pb"]
    bet_after_check, call = second[c1 + "p"], second[c1 + "b"]
    after_bet = call * _payoff0("bb", c0, c1) + (1 - call) * _payoff0("bp", c0, c1)
    after_check_bet = call_after_check * _payoff0("pbb", c0, c1) + (1 - call_after_check) * _payoff0(
        "pbp", c0, c1
    )
    after_check = bet_after_check * after_check_bet + (1 - bet_after_check) * _payoff0("pp", c0, c1)
    return bet * after_bet + (1 - bet) * after_check


_DEALS = tuple(itertools.permutations(CARDS, 2))


def game_value(policy: Mapping[str, float]) -> float:
    """player_0's expected chips per hand when both seats play `policy` (-1/18 at an equilibrium)."""
    p = check_policy(policy)
    return sum(_value0(p, p, c0, c1) for c0, c1 in _DEALS) / len(_DEALS)


def best_response_values(policy: Mapping[str, float]) -> tuple[float, float]:
    """(BR₀, BR₁): each seat's expected chips per hand with a best response to the table's other seat.

    A seat's best response is chosen per card among its 4 pure strategies (one action at each of its two
    information sets for that card), which is exact: the information sets of different cards are disjoint.
    """
    p = check_policy(policy)
    pure = list(itertools.product((0.0, 1.0), repeat=2))
    br0 = br1 = 0.0
    for card in CARDS:
        others = [c for c in CARDS if c != card]
        best0 = max(sum(_value0({card: a, card + "pb": b}, p, card, o) for o in others) for a, b in pure)
        best1 = max(
            sum(-_value0(p, {card + "p": a, card + "b": b}, o, card) for o in others) for a, b in pure
        )
        br0 += best0 / len(_DEALS)
        br1 += best1 / len(_DEALS)
    return br0, br1


def _seat_of(key: str) -> str:
    """The seat that decides at information set `key` (``player_0`` at ``""``/``"pb"``, else ``player_1``)."""
    return SEATS[(len(key) - 1) % 2]


def equilibrium_range(key: str) -> tuple[float, float]:
    """(lowest, highest) probability of the aggressive action at `key` over Kuhn's equilibria
    (`equilibrium_policy` for α in [0, 1/3]; each entry is linear in α, so the ends give the range)."""
    a, b = equilibrium_policy(0.0)[key], equilibrium_policy(1.0 / 3.0)[key]
    return min(a, b), max(a, b)


def policy_table(
    policy: Mapping[str, float], logprobs: Mapping[str, Mapping[str, float]] | None = None
) -> dict[str, Any]:
    """A policy table as JSON-able rows, one per information set in `INFO_SETS` order, beside the equilibria.

    Returns:
        ``{"exploitability": float, "br": {seat: BR value}, "game_value": float, "rows": [...]}``; each row
        has ``info_set``, ``seat``, ``card``, ``history``, ``aggressive`` (the action whose probability ``p`` is:
        ``bet`` or ``call``), ``p``, ``equilibrium`` (``[low, high]``: `equilibrium_range`) and, when
        `logprobs` is given, ``logprobs`` (``{move: total log-prob}``, ``None`` for ``-inf``).
    """
    p = check_policy(policy)
    br0, br1 = best_response_values(p)
    rows = []
    for key in INFO_SETS:
        row: dict[str, Any] = {
            "info_set": key,
            "seat": _seat_of(key),
            "card": key[0],
            "history": key[1:],
            "aggressive": legal_actions(key[1:])[1],
            "p": p[key],
            "equilibrium": list(equilibrium_range(key)),
        }
        if logprobs is not None:
            row["logprobs"] = {m: (None if v == -math.inf else float(v)) for m, v in logprobs[key].items()}
        rows.append(row)
    return {
        "exploitability": (br0 + br1) / 2.0,
        "br": {SEATS[0]: br0, SEATS[1]: br1},
        "game_value": game_value(p),
        "rows": rows,
    }


def format_policy_table(table: Mapping[str, Any]) -> str:
    """`policy_table`'s rows as a text table (one line per information set) with the exploitability."""
    lines = [f"{'info set':<9}{'seat':<10}{'p(aggr.)':>16}   equilibrium"]
    for r in table["rows"]:
        lo, hi = r["equilibrium"]
        eq = f"{lo:.3f}" if lo == hi else f"{lo:.3f}-{hi:.3f}"
        action = f"{r['aggressive']} {r['p']:.3f}"
        lines.append(f"{r['info_set'] or '-':<9}{r['seat']:<10}{action:>16}   {eq}")
    lines.append(f"exploitability {table['exploitability']:.4f} chips/hand (0 at an equilibrium)")
    return "\n".join(lines)


def exploitability(policy: Mapping[str, float]) -> float:
    """(BR₀ + BR₁) / 2 in chips per hand (module docstring): 0 at an equilibrium, 0.458333… for the uniform
    table, 1/3 for "always bet or call".

    Args:
        policy: the 12 information-set keys of `INFO_SETS` -> probability of the aggressive action there.

    Raises:
        ValueError: a key missing or unknown, or a value outside [0, 1].
    """
    br0, br1 = best_response_values(policy)
    return (br0 + br1) / 2.0


def policy_from_logprobs(logprobs: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The policy table from the model's log-probabilities of the legal move texts, normalised over them.

    Args:
        logprobs: ``{info_set: {move: log-prob}}`` for the 12 keys of `INFO_SETS`, each with exactly its two
            legal moves (``check``/``bet`` at ``""`` and ``"p"`` histories, ``fold``/``call`` at ``"b"`` and
            ``"pb"``). A log-prob is the model's total log-probability (natural log, the sum over the
            completion's tokens) of ``action_texts(key)[move]`` as the reply to ``info_set_messages()[key]``;
            ``-inf`` is allowed for one of the two moves.

    Returns:
        ``{info_set: p(aggressive)}`` with p(aggressive) = exp(l_aggr) / (exp(l_aggr) + exp(l_pass)).

    Raises:
        ValueError: a key missing or unknown, moves other than the two legal ones, a NaN or +inf, or both
            log-probs -inf.
    """
    missing = [k for k in INFO_SETS if k not in logprobs]
    extra = [k for k in logprobs if k not in INFO_SETS]
    if missing or extra:
        raise ValueError(
            f"logprobs must have exactly the 12 information sets; missing {missing}, unknown {extra}"
        )
    out: dict[str, float] = {}
    for key in INFO_SETS:
        passive, aggressive = legal_actions(key[1:])
        row = logprobs[key]
        if set(row) != {passive, aggressive}:
            raise ValueError(
                f"logprobs[{key!r}] must give exactly {passive!r} and {aggressive!r}, got {sorted(row)}"
            )
        lp, la = float(row[passive]), float(row[aggressive])
        if math.isnan(lp) or math.isnan(la) or lp == math.inf or la == math.inf or lp == la == -math.inf:
            raise ValueError(
                f"logprobs[{key!r}] must be finite log-probabilities (one may be -inf), got {dict(row)}"
            )
        if la == -math.inf:
            out[key] = 0.0
        elif lp == -math.inf:
            out[key] = 1.0
        else:  # logistic of the difference: stable for any finite pair
            d = lp - la
            out[key] = 1.0 / (1.0 + math.exp(d)) if d < 700 else 0.0
    return out

"""The move format of every game env and its tolerant parser.

The format the prompts ask for is one tag, ``<move>LABEL</move>``, where ``LABEL`` is one of the game's move
labels (``"5"`` for a tic-tac-toe cell, ``"3"`` for a connect-four column, ``"bet"`` in Kuhn poker). Small
models rarely follow a format exactly, so `parse_move` also accepts the reasonable variants, tried in this order
(the first rule that finds something decides; the *last* occurrence counts within a rule, as a model that
changes its mind writes its final choice last):

1. ``<move>...</move>`` tags (case and spaces ignored; an unclosed ``<move>5`` at the very end counts too,
   because generation stops at ``</move>`` and some backends drop the stop string). The tag's content is
   resolved as in `resolve_label`. A tag whose content names no label is *no move*: the later rules are not
   tried, so ``<move>hmm</move> I play 5`` is not a move.
2. ``\\boxed{...}`` (SPIRAL's format) and ``[...]`` (TextArena's), resolved the same way.
3. A phrase: a keyword (``play``, ``move``, ``position``, ``cell``, ``square``, ``column``, ``col``, ``choose``,
   ``pick``, ``select``, ``action``, ``I``, ``I'll``, ``I will``), optionally ``is``/``:``/``#``/``=``/
   ``at``/``in``/``on`` and a noun (``cell``, ``column``, ``position``, ``square``), then a label:
   ``I play 4``, ``position 4``, ``Move: 4``, ``I'll call``.
4. The whole reply, stripped of spaces, quotes, a trailing full stop and markdown ``*`` / backticks, is a label:
   ``4``, ``"bet".``

A label is matched as a whole word, case-insensitively (``45`` is not ``4``). Anything else is *no move*, which
the game envs treat as an illegal move, never as an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["MOVE_FUZZ", "format_move", "parse_move", "resolve_label"]

# Fragments `UnicodeText.sample` splices into random text, so fuzzing reaches every branch of the parser.
MOVE_FUZZ: tuple[str, ...] = (
    "<move>",
    "</move>",
    "\\boxed{",
    "}",
    "[",
    "]",
    "I play ",
    "position ",
    "Move: ",
)

_TAG_RE = re.compile(r"<\s*move\s*>(.*?)<\s*/\s*move\s*>", re.IGNORECASE | re.DOTALL)
_OPEN_TAG_AT_END_RE = re.compile(r"<\s*move\s*>([^<]{0,40})$", re.IGNORECASE)
_BOXED_RE = re.compile(r"\\boxed\{([^{}]{0,80})\}")
_BRACKET_RE = re.compile(r"\[([^\[\]]{0,80})\]")
_NOUNS = r"(?:cell|column|col|position|square|number|move)"
_KEYWORDS = r"(?:play|move|position|cell|square|column|col|choose|pick|select|action|i\s+will|i'll|i)"
_STRIP = " \t\r\n\"'`*.!,;:()"


def format_move(label: str) -> str:
    """The canonical action text for a move label: ``<move>label</move>``."""
    return f"<move>{label}</move>"


@lru_cache(maxsize=64)
def _label_re(labels: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(lab) for lab in sorted(labels, key=len, reverse=True))
    return re.compile(rf"(?<![\w-])({alternatives})(?![\w-])", re.IGNORECASE)


@lru_cache(maxsize=64)
def _phrase_re(labels: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(lab) for lab in sorted(labels, key=len, reverse=True))
    return re.compile(
        rf"\b{_KEYWORDS}\b\s*(?:is|:|#|=|at|in|on)?\s*(?:(?:the\s+)?{_NOUNS}\s*(?:#|:|=)?\s*)?"
        rf"\**({alternatives})(?![\w-])",
        re.IGNORECASE,
    )


def _canonical(found: str, labels: tuple[str, ...]) -> str:
    low = found.lower()
    return next(lab for lab in labels if lab.lower() == low)


def resolve_label(content: str, labels: Sequence[str]) -> str | None:
    """The label named by a tag's (or box's) content, or `None`.

    The content is the label itself (spaces, quotes, ``*`` and a final full stop ignored), a phrase as in rule
    3 of the module docstring (``cell 5``, ``column 3``), or a text in which exactly one distinct label occurs
    as a whole word (``5 (the centre)``).
    """
    labs = tuple(labels)
    text = content.strip(_STRIP)
    exact = [lab for lab in labs if lab.lower() == text.lower()]
    if exact:
        return exact[0]
    noun = re.fullmatch(rf"(?:the\s+)?{_NOUNS}\s*(?:#|:|=)?\s*(\S+)", text, re.IGNORECASE)
    if noun:
        inner = noun.group(1).strip(_STRIP)
        hit = [lab for lab in labs if lab.lower() == inner.lower()]
        if hit:
            return hit[0]
    found = {_canonical(m.group(1), labs) for m in _label_re(labs).finditer(text)}
    return found.pop() if len(found) == 1 else None


def parse_move(text: str, labels: Sequence[str]) -> str | None:
    """The move label `text` names, by the rules of the module docstring, or `None` when it names none.

    Args:
        text: the agent's raw reply (any string; never raises).
        labels: every move label of the game (legal now or not: legality is the env's check, so that it can
            say "cell 5 is taken" rather than "no move found").

    Returns:
        One of `labels` (with the spelling given there), or `None`.
    """
    if not isinstance(text, str) or not labels:
        return None
    labs = tuple(labels)
    tags = _TAG_RE.findall(text)
    if not tags:
        tail = _OPEN_TAG_AT_END_RE.search(text.rstrip())
        tags = [tail.group(1)] if tail else []
    if tags:
        return resolve_label(tags[-1], labs)
    for pattern in (_BOXED_RE, _BRACKET_RE):
        boxes = pattern.findall(text)
        if boxes:
            hit = resolve_label(boxes[-1], labs)
            if hit is not None:
                return hit
    phrases = list(_phrase_re(labs).finditer(text))
    if phrases:
        return _canonical(phrases[-1].group(1), labs)
    whole = text.strip(_STRIP)
    return next((lab for lab in labs if lab.lower() == whole.lower()), None)

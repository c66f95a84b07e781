r"""Math answer grading: is the last `\boxed{}` of a response equivalent to the gold answer?

`grade_math(response, gold)` takes the text after the last `</think>` (the whole text when there is none),
extracts its last `\boxed{...}` (or `\fbox{...}`) with brace matching, and compares it with the gold answer:
first as normalised strings, then with `math-verify` (SymPy-based equivalence: `\frac12 == 0.5`,
`50\% == 50`, `5\text{ cm} == 5`, tuples, intervals, ...). Its float rounding and evaluation precision are
scaled to the smallest magnitude in the comparison (`_worker._precision`), so `10^{-30}` and `2\cdot10^{-30}`
differ, and `20!` and `20!+1` differ, while `0.5 == \frac12` and `0.333333 == \frac13` (6 places) hold.

Digits in any script (`٤٢`, `４２`) are read as ASCII digits first (`ascii_digits`). Values too small for a
tolerance the deadline affords (below about 10^-2000) are compared exactly (SymPy rationals) or not at all.

It never raises and returns within `GRADE_TIMEOUT_S` (4 s) on any input, also when many threads grade at
once: waiting for a free worker process counts against the deadline (only the start-up of a new worker,
about 1 s, once, does not). SymPy can hang on inputs like
`9^{9^{9^9}}`: the big-integer arithmetic runs in C while holding the GIL, so neither `signal.alarm` (what
math-verify uses, and only in the main thread) nor a worker thread can stop it. The SymPy comparison
therefore runs in a separate worker process (`python -m mas_envs.rewards._worker`, started on first use,
shared by all threads, killed and restarted when it misses the deadline); a comparison that times out
counts as not equivalent.
"""

from __future__ import annotations

import numbers
import re
import time
import unicodedata
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np

__all__ = [
    "GRADE_TIMEOUT_S",
    "ascii_digits",
    "extract_boxed",
    "grade_math",
    "normalize_answer",
    "strip_think",
]

GRADE_TIMEOUT_S = 4.0
# Longer boxed contents are compared as strings only: nobody's final answer is this long, and SymPy
# parsing time grows fast with length.
MAX_SYMPY_CHARS = 400
# SymPy always gets at least this long (a real answer compares in ~0.05 s), however long extraction took.
_MIN_SYMPY_S = 0.5

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_BRACE_RE = re.compile(r"[{}]")
_TOKEN_RE = re.compile(r"[^\s$]+")


def strip_think(text: str) -> str:
    """The text after the last `</think>`, or all of `text` when there is none."""
    i = text.rfind("</think>")
    return text if i < 0 else text[i + len("</think>") :]


def extract_boxed(text: str) -> str | None:
    r"""Contents of the last `\boxed{...}` / `\fbox{...}` in `text` (braces matched), else `None`.

    `\boxed 5` (no braces, one token) is accepted too, as in Hendrycks' MATH solutions. An unclosed
    `\boxed{` does not count (an earlier, balanced box does). Linear time in `len(text)`, so degenerate
    output (a model repeating `\boxed{` for a megabyte) costs milliseconds, not minutes.
    """
    boxes = list(_BOX_RE.finditer(text))
    if not boxes:
        return None
    # One pass pairs every `{` with its `}`: the same pairing as counting depth from each box's `{`, but
    # without rescanning the rest of the text for every unclosed box.
    closing: dict[int, int] = {}
    stack: list[int] = []
    for b in _BRACE_RE.finditer(text, boxes[0].end()):
        if b.group() == "{":
            stack.append(b.start())
        elif stack:
            closing[stack.pop()] = b.start()
    for m in reversed(boxes):
        j = m.end()
        if j < len(text) and text[j] == "{":
            k = closing.get(j)
            if k is not None:
                return text[j + 1 : k]
            continue  # unbalanced: try an earlier box
        if m.group(0).endswith((" ", "\t")):
            token = _TOKEN_RE.match(text, j)
            if token:
                return token.group(0)
    return None


_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{\s*([^{}]*?)\s*\}")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def normalize_answer(s: str) -> str:
    r"""A light string normal form: no spaces, `$`, `\!`, `\left`/`\right`, `^\circ`, thousands commas, trailing `.`.

    Used for the fast string comparison before SymPy; equivalence proper is math-verify's job.
    """
    s = s.strip().strip(".").strip()
    s = _TEXT_RE.sub(r"\1", s)
    for old in (
        "\\left",
        "\\right",
        "\\!",
        "\\,",
        "\\;",
        "\\ ",
        "\\$",
        "$",
        "^\\circ",
        "^{\\circ}",
        "dfrac",
        "tfrac",
    ):
        s = s.replace(old, "frac" if old in ("dfrac", "tfrac") else "")
    s = "".join(s.split())
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    return s


def _number_string(x: numbers.Real | Decimal) -> str | None:
    # Positional notation: repr(1e20) is "1e+20", which LaTeX parsing reads as 1*e + 20. `str` (not
    # `float(x)`) keeps a float32's short form: str(np.float32(0.1)) is "0.1", float() makes it 0.10000000149.
    try:
        d = x if isinstance(x, Decimal) else Decimal(str(x))
    except ArithmeticError:
        return None
    if not d.is_finite():
        return None
    # positional only while it stays short: format(Decimal("1e999999999"), "f") is a gigabyte
    return format(d, "f") if -40 <= d.adjusted() <= MAX_SYMPY_CHARS else str(d)


def gold_strings(gold: Any) -> list[str]:
    if gold is None or isinstance(gold, (bool, np.bool_)):
        return []
    if isinstance(gold, str):
        boxed = extract_boxed(gold) if "\\boxed" in gold or "\\fbox" in gold else None
        return [boxed if boxed is not None else gold]
    if isinstance(gold, (bytes, bytearray)):
        return gold_strings(bytes(gold).decode("utf-8", "replace"))
    if isinstance(gold, numbers.Integral):
        return [str(int(gold))]
    if isinstance(gold, numbers.Rational):
        return [f"{gold.numerator}/{gold.denominator}"]
    if isinstance(gold, (numbers.Real, Decimal)):
        s = _number_string(gold)
        return [s] if s is not None else []
    if isinstance(gold, np.ndarray):  # e.g. golden_answers of a parquet file read through pandas
        return gold_strings(gold.tolist())
    if isinstance(gold, Sequence):
        return [s for g in gold for s in gold_strings(g)]
    return []


def ascii_digits(s: str) -> str:
    """Every Unicode decimal digit as its ASCII digit, full-width ASCII forms as ASCII.

    ``٤٢`` (Arabic-Indic), ``۴۲`` (Persian), ``४२`` (Devanagari) and ``４２`` (full-width) become ``42``; full-width
    ``＋``, ``／``, ``．`` become ``+``, ``/``, ``.``. Superscripts and other compatibility forms are kept (NFKC would
    make ``x²`` into ``x2``).
    """
    if s.isascii():
        return s
    out = []
    for c in s:
        if "\uff01" <= c <= "\uff5e":  # the full-width block mirrors ASCII 0x21-0x7e
            out.append(chr(ord(c) - 0xFEE0))
        elif c.isdecimal():
            out.append(str(unicodedata.decimal(c)))
        else:
            out.append(c)
    return "".join(out)


def grade_math(response: Any, gold: Any) -> bool:
    r"""Whether the last `\boxed{}` answer of `response` (after the last `</think>`) equals `gold`.

    Args:
        response: the model's text. Anything that is not a `str` grades `False`.
        gold: the gold answer: a `str` (LaTeX or plain; a `\boxed{}` inside it is extracted; `bytes` are
            decoded as UTF-8), a number (`int`, `float`, NumPy scalar, `Fraction`, `Decimal`), or a list /
            tuple / NumPy array of acceptable answers (any match counts). `None`, `bool` and NaN never match.

    Returns:
        `True` when equivalent. Never raises; returns within about `GRADE_TIMEOUT_S` seconds.
    """
    t0 = time.monotonic()
    try:
        if not isinstance(response, str):
            return False
        pred = extract_boxed(strip_think(response))
        golds = [ascii_digits(g) for g in gold_strings(gold) if g.strip()]
        if pred is None or not pred.strip() or not golds:
            return False
        pred = ascii_digits(pred)
        npred = normalize_answer(pred)
        if any(npred == normalize_answer(g) for g in golds):
            return True
        if len(pred) > MAX_SYMPY_CHARS:
            return False
        from mas_envs.rewards import _worker

        # the deadline covers the whole call: scanning a 4 MB response takes up to ~2 s of it
        left = max(_MIN_SYMPY_S, GRADE_TIMEOUT_S - (time.monotonic() - t0))
        return _worker.equivalent(pred, [g[:MAX_SYMPY_CHARS] for g in golds], left)
    except Exception:  # noqa: BLE001  (grading is total by contract: a bug here must not kill a rollout)
        return False

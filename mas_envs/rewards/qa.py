"""Open-domain QA rewards: exact match and token F1 after SQuAD answer normalisation.

``exact_match`` is the search tasks' team reward R (Search-R1's ``qa_em``; Dr. MAS §5.2); ``f1_score`` is
reported in ``infos`` only. Both compare one prediction against a list of golden answers and take the best.

Normalisation (SQuAD v1.1 ``normalize_answer``): lower-case, drop ASCII punctuation, drop the articles
"a", "an", "the" as whole words, collapse runs of whitespace.
"""

from __future__ import annotations

import math
import numbers
import re
import string
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

__all__ = ["answer_strings", "exact_match", "f1_score", "normalize_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: ``"The  Eiffel-Tower!"`` → ``"eiffeltower"``; ``"a cat"`` → ``"cat"``."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _scalar_text(value: Any) -> str | None:
    """One answer value as text: a string as is, bytes decoded, a number as a model would write it.

    Integral numbers (``5``, ``5.0``, ``np.int64(5)``) give ``"5"``, other finite reals their shortest
    ``repr`` (``2.5`` → ``"2.5"``); ``None``, booleans, NaN/inf and any other type give ``None`` (no answer):
    ``True`` is not a QA answer, and ``str()`` of a list would normalise to its words and match by accident.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if value is None or isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, (numbers.Real, Decimal)):
        try:
            x = float(value)
        except (ValueError, OverflowError):  # Decimal("sNaN") refuses conversion
            return None
        if not math.isfinite(x):
            return None
        return str(int(x)) if x.is_integer() else repr(x)
    return None


def answer_strings(answers: Any) -> list[str]:
    """The usable gold answers in ``answers`` as a list of non-blank strings; never raises.

    Args:
        answers: one answer (``str``, ``bytes``, ``int``, ``float``, numpy scalar) or a list / tuple / numpy
            array of them (a parquet ``golden_answers`` column read through pandas is an ``ndarray``).

    Returns:
        Each element as text (see ``_scalar_text``: ``5.0`` → ``"5"``), in order; ``None``, blank strings,
        booleans and NaN are dropped, so ``[]`` means "no usable gold answer".
    """
    single = _scalar_text(answers)
    if single is not None or answers is None or isinstance(answers, (bool, numbers.Number, Decimal)):
        items: Iterable[Any] = [single]
    elif hasattr(answers, "tolist") and not isinstance(answers, (list, tuple)):
        items = answers.tolist()  # numpy array (any dtype) → Python scalars
        items = items if isinstance(items, list) else [items]
    elif isinstance(answers, (list, tuple, set, frozenset)):
        items = answers
    else:
        return []
    texts = (_scalar_text(a) for a in items)
    return [t for t in texts if t is not None and t.strip()]


def _prediction_text(prediction: Any) -> str:
    text = _scalar_text(prediction)
    return "" if text is None else text


def exact_match(prediction: Any, golden_answers: Any) -> float:
    """1.0 if the normalised prediction equals any normalised golden answer, else 0.0. Never raises.

    Args:
        prediction: the model's answer text; a number is stringified (``5`` → ``"5"``); ``None``, an empty
            string or any other type (a list, an object) scores 0.0.
        golden_answers: one gold answer or a list / tuple / numpy array of accepted answers, as accepted by
            :func:`answer_strings` (numbers stringified, ``None`` and blanks dropped).

    Returns:
        ``EM = max_g 1[norm(prediction) == norm(g)]`` as a float; 0.0 when there is no usable golden answer
        (the QA loaders and the search envs reject such tasks up front).
    """
    golds = answer_strings(golden_answers)
    prediction = _prediction_text(prediction)
    if not prediction.strip():
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def f1_score(prediction: Any, golden_answers: Any) -> float:
    """Best token-level F1 between the prediction and any golden answer (SQuAD v1.1 definition).

    For normalised token multisets P (prediction) and G (gold): ``c = |P ∩ G|``, precision ``c/|P|``,
    recall ``c/|G|``, ``F1 = 2·precision·recall / (precision + recall)``, and 0 when ``c = 0``.

    Inputs are read as in :func:`exact_match`; never raises.

    Returns:
        ``max_g F1(prediction, g)`` in [0, 1]; 0.0 for a ``None``, empty or non-text prediction or no usable
        golden answer.
    """
    golds = answer_strings(golden_answers)
    prediction = _prediction_text(prediction)
    if not prediction.strip():
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        gold_tokens = normalize_answer(gold).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision = common / len(pred_tokens)
        recall = common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best

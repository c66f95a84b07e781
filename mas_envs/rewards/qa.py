"""Open-domain QA rewards: exact match and token F1 after SQuAD answer normalisation.

``exact_match`` is the search tasks' team reward R (Search-R1's ``qa_em``; Dr. MAS §5.2); ``f1_score`` is
reported in ``infos`` only. Both compare one prediction against a list of golden answers and take the best.

Normalisation (SQuAD v1.1 ``normalize_answer``): lower-case, drop ASCII punctuation, drop the articles
"a", "an", "the" as whole words, collapse runs of whitespace.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

__all__ = ["exact_match", "f1_score", "normalize_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: ``"The  Eiffel-Tower!"`` → ``"eiffeltower"``; ``"a cat"`` → ``"cat"``."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(golden_answers: str | Iterable[str]) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else [str(g) for g in golden_answers]


def exact_match(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised golden answer, else 0.0.

    Args:
        prediction: the model's answer text (``None`` or an empty string scores 0.0).
        golden_answers: one gold answer or a list of accepted answers.

    Returns:
        ``EM = max_g 1[norm(prediction) == norm(g)]`` as a float; 0.0 for an empty ``golden_answers`` (like every
        reward function here it never raises; the QA loaders reject rows without a gold answer).
    """
    golds = _golds(golden_answers)
    if prediction is None or not prediction.strip():
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def f1_score(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    """Best token-level F1 between the prediction and any golden answer (SQuAD v1.1 definition).

    For normalised token multisets P (prediction) and G (gold): ``c = |P ∩ G|``, precision ``c/|P|``,
    recall ``c/|G|``, ``F1 = 2·precision·recall / (precision + recall)``, and 0 when ``c = 0``.

    Returns:
        ``max_g F1(prediction, g)`` in [0, 1]; 0.0 for a ``None`` or empty prediction or no golden answers.
    """
    golds = _golds(golden_answers)
    if prediction is None or not prediction.strip():
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

"""Grouping primitives of the advantage rule and its diagnostics: samples coded into cells (task group, agent,
turn position) and the per-cell mean and std (:mod:`mas_train.advantages`, :mod:`mas_train.lemma_stats`).
Pure numpy."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

__all__ = ["combine_keys", "factorize", "factorize_named", "finite_scores", "mean_std_by_key"]

# A std below this (relative to the magnitude of the mean) is rounding noise of equal values, i.e. zero.
_ZERO_STD_RTOL = 1e-12


def finite_scores(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """``scores`` as a 1-D float64 array.

    Raises:
        ValueError: not 1-D, or a NaN/inf score (it would reach every advantage of its task group).
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D (one per sample), got shape {s.shape}")
    bad = np.flatnonzero(~np.isfinite(s))
    if bad.size:
        raise ValueError(
            f"scores contain {bad.size} NaN/inf value(s), first at indices {bad[:5].tolist()}: "
            f"{s[bad[:5]].tolist()}; check the reward function and the invalid-action penalty"
        )
    return s


def mean_std_by_key(
    values: np.ndarray, keys: np.ndarray, *, stats: str = "paper"
) -> tuple[np.ndarray, np.ndarray]:
    """Per-key mean and std of ``values`` (``(N,)`` float) grouped by ``keys`` (``(N,)`` int codes 0..K-1).

    ``stats="paper"``: the mean and the population std (ddof = 0). ``stats="reference"``: the mean and the
    unbiased std (ddof = 1), and a key with one value gets mean 0 and std 1 (the reference code's rule, module
    docstring). A std that is rounding noise of equal values is returned as exactly 0.

    Returns:
        ``(mean, std)``, each ``(K,)`` float64, indexed by key code (keys without values get 0, 0).
    """
    k = int(keys.max()) + 1
    count = np.bincount(keys, minlength=k)
    safe = np.maximum(count, 1)  # keys without values get 0/1; they are never indexed
    mean = np.bincount(keys, weights=values, minlength=k) / safe
    # two-pass variance: exact 0 for identical values far more often than E[x^2] - E[x]^2
    sq = np.bincount(keys, weights=(values - mean[keys]) ** 2, minlength=k)
    ddof = 1 if stats == "reference" else 0
    std = np.sqrt(sq / np.maximum(count - ddof, 1))
    std[std <= _ZERO_STD_RTOL * np.maximum(1.0, np.abs(mean))] = 0.0
    if stats == "reference":
        single = count == 1
        mean[single], std[single] = 0.0, 1.0
    return mean, std


def factorize(ids: Sequence[Hashable] | np.ndarray, name: str, n: int) -> np.ndarray:
    return factorize_named(ids, name, n)[0]


def factorize_named(ids: Sequence[Hashable] | np.ndarray, name: str, n: int) -> tuple[np.ndarray, list[str]]:
    """Integer codes 0..K-1 in order of first appearance, and the K ids as strings."""
    ids_list = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    if len(ids_list) != n:
        raise ValueError(f"{name} has {len(ids_list)} entries but scores has {n}; give one per sample")
    index: dict[Hashable, int] = {}
    try:
        codes = np.fromiter((index.setdefault(x, len(index)) for x in ids_list), dtype=np.int64, count=n)
    except TypeError as err:  # unhashable ids, e.g. lists
        raise ValueError(f"{name} must hold hashable ids (str or int), got {err}") from None
    return codes, [str(x) for x in index]


def combine_keys(outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Codes of the pairs (outer, inner), dense 0..K-1."""
    if outer.size == 0:
        return outer
    pair = outer * (int(inner.max()) + 1) + inner
    return np.unique(pair, return_inverse=True)[1].reshape(-1).astype(np.int64)

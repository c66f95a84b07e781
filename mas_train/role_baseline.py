"""RAE's state across steps (SPIRAL's role-conditioned baseline; the rule itself is ``advantage_mode: rae`` in
:mod:`mas_train.advantages`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["RAE_DEFAULT_DECAY", "RoleBaseline"]

#: SPIRAL's ``role_baseline_ema_gamma`` (train_spiral.py line 79)
RAE_DEFAULT_DECAY = 0.95


class RoleBaseline:
    """RAE's state across steps: per agent (seat) an exponential moving average of its trajectory scores.

    One object lives for a whole run (the trainer keeps it and saves it in its checkpoints); each call of
    :func:`compute_advantages_with_stats` with ``mode="rae"`` reads and updates it (module docstring).

    Args:
        decay: d in ``b <- d * b + (1 - d) * r``, in (0, 1) (SPIRAL: 0.95).

    Attributes:
        values: agent id -> baseline b_k (an agent not yet seen has b_k = 0, as SPIRAL's ``EMA`` starts at 0).
        counts: agent id -> number of updates (trajectories of that agent scored so far).

    Raises:
        ValueError: decay not in (0, 1).
    """

    def __init__(self, decay: float = RAE_DEFAULT_DECAY) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < float(decay) < 1.0:
            raise ValueError(
                f"the RAE baseline decay must be a number in (0, 1) (SPIRAL: 0.95), got {decay!r}"
            )
        self.decay = float(decay)
        self.values: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def get(self, agent: str) -> float:
        """b_k of ``agent`` (0 before its first update)."""
        return self.values.get(agent, 0.0)

    def update(self, agent: str, r: float) -> float:
        """``b_k <- d * b_k + (1 - d) * r``; returns the new b_k."""
        b = self.decay * self.get(agent) + (1.0 - self.decay) * float(r)
        self.values[agent] = b
        self.counts[agent] = self.counts.get(agent, 0) + 1
        return b

    def state_dict(self) -> dict[str, object]:
        """Plain data (floats, ints, strings) for a checkpoint."""
        return {"decay": self.decay, "values": dict(self.values), "counts": dict(self.counts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the decay stays this object's own).

        Raises:
            ValueError: the saved decay differs from this one (the resumed run would not continue the same
                moving average).
        """
        decay = float(state["decay"])
        if decay != self.decay:
            raise ValueError(
                f"the checkpoint's RAE baseline has decay {decay} but this run has {self.decay}; resume with "
                f"advantage_rae_decay {decay}"
            )
        self.values = {str(k): float(v) for k, v in state["values"].items()}
        self.counts = {str(k): int(v) for k, v in state["counts"].items()}

    def __repr__(self) -> str:
        return f"RoleBaseline(decay={self.decay}, values={self.values}, counts={self.counts})"

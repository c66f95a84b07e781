"""The contract every :class:`~mas_train.hosting.policy.GroupPolicy` passes, whatever its hosting mode (like
:mod:`mas_train.backends.testing` for backends): shipped so a new hosting mode is held to the same rules.

:func:`check_policy` drives a policy through what the worker does with it: activate, update (or its refusal),
the weight sync, save, load into a fresh policy, and one more update from both, which must agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from mas_train.hosting.policy import GroupPolicy, GroupState
from mas_train.samples import Sample

__all__ = ["check_policy", "policy_state"]


def policy_state(policy: GroupPolicy, *, updates: int = 0) -> GroupState:
    """The ``state.json`` the worker writes for ``policy`` (before the policy's own entries)."""
    return {
        "updates": updates,
        "group": policy.group,
        "model": policy.model_path,
        "trainable": bool(policy.trains),
        "lora": policy.adapter is not None,
    }


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> bool:
    return a.keys() == b.keys() and all(
        torch.allclose(a[k].float(), b[k].float(), atol=atol, rtol=0) for k in a
    )


def check_policy(
    new_policy: Callable[[], GroupPolicy],
    samples: Sequence[Sample],
    advantages: Sequence[float],
    folder: Path,
    *,
    atol: float = 1e-6,
) -> None:
    """Check the :class:`~mas_train.hosting.policy.GroupPolicy` contract on policies made by ``new_policy``.

    Args:
        new_policy: makes a fresh policy of the mode under test (its own model copy; it is closed here).
        samples, advantages: one update's worth of the group's samples (non-zero advantages).
        folder: an empty folder for the checkpoint round trip.
        atol: tolerance for "the same weights" after the round trip and the next update.

    Raises:
        AssertionError: naming the broken rule.
    """
    folder.mkdir(parents=True, exist_ok=True)
    p = new_policy()
    fresh = None
    try:
        assert isinstance(p, GroupPolicy), f"{type(p).__name__} does not implement GroupPolicy"
        p.activate(training=False)
        if not p.trains:
            assert p.num_parameters == 0, "a policy that does not train counts no trainable parameters"
            try:
                p.update(samples, advantages, agent_grad_norms=False)
            except RuntimeError:
                pass
            else:
                raise AssertionError(f"{type(p).__name__}.update did not refuse: the policy does not train")
            assert p.parameters_for_sync() is None, "a policy that does not train has nothing to sync"
            state: GroupState = {**policy_state(p), **p.save(folder)}
            assert p.load(folder, state, optimizer=True) is None, "loading a frozen save must load nothing"
            return
        assert p.num_parameters > 0
        before = {k: v.detach().clone() for k, v in (p.parameters_for_sync() or {}).items()}
        assert before, "a training policy syncs some tensors"
        p.activate(training=True)
        out = p.update(samples, advantages, agent_grad_norms=False)
        assert math.isfinite(out["loss"]) and out["grad_norm"] > 0, f"update metrics {out}"
        after = {k: v.detach().clone() for k, v in (p.parameters_for_sync() or {}).items()}
        assert not _same(before, after, 0.0), "an update with non-zero advantages changed no synced tensor"
        state = {**policy_state(p, updates=1), **p.save(folder)}
        fresh = new_policy()
        loaded = fresh.load(folder, state, optimizer=True)
        assert loaded is not None and _same(
            {k: v.detach().clone() for k, v in loaded.items()}, after, atol
        ), "load did not restore the saved weights"
        # the optimizer state came back too: one more update from both gives the same weights
        for q in (p, fresh):
            q.activate(training=True)
            q.update(samples, advantages, agent_grad_norms=False)
        nxt = {k: v.detach().clone() for k, v in (p.parameters_for_sync() or {}).items()}
        assert _same(nxt, fresh.parameters_for_sync() or {}, atol), (
            "the resumed update differs (optimizer state)"
        )
    finally:
        p.close()
        if fresh is not None:
            fresh.close()

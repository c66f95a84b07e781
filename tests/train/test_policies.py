"""The five hosting modes of a model group pass one policy contract suite (mas_train.hosting.testing), and the
worker composes whichever one make_policy picks without switching on a mode."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")

from mas_train.config import TrainConfig  # noqa: E402
from mas_train.hosting.policy import (  # noqa: E402
    FrozenLoraPolicy,
    FrozenPolicy,
    FullPolicy,
    LoraPolicy,
    RemotePolicy,
)
from mas_train.hosting.sharded import ShardedPolicy  # noqa: E402
from mas_train.hosting.testing import check_policy  # noqa: E402
from mas_train.hosting.worker import make_policy  # noqa: E402
from mas_train.models import load_tokenizer  # noqa: E402
from mas_train.rollout import Sample  # noqa: E402

ADV = [1.0, -1.0, 0.5, -0.5, 1.2, -0.7]


def _samples(group: str) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(len(ADV)):
        p = torch.randint(0, 5000, (6 + i % 3,), generator=g).tolist()
        c = torch.randint(0, 5000, (2 + i % 4,), generator=g).tolist()
        out.append(
            Sample(
                f"t{i % 2}",
                f"r{i}",
                "solver",
                group,
                0,
                p,
                c,
                [-9.0] * len(c),
                False,
                1.0,
                True,
                0,
                "stop",
                "x",
            )
        )
    return out


def _resolved(tmp_path, model, **extra):
    cfg = TrainConfig.from_dict(
        dict(
            env="parity",
            model=model,
            max_steps=4,
            output_dir=str(tmp_path),
            run_name="run",
            learning_rate=1e-2,
            sampling={"max_new_tokens": 4},
            **extra,
        )
    )
    return cfg.resolve(["solver", "verifier"])


MODES = {
    "full": (FullPolicy, {}, None),
    "lora": (LoraPolicy, {"lora": {"r": 4, "alpha": 8}}, None),
    "frozen": (FrozenPolicy, {}, False),
    "frozen_lora": (
        FrozenLoraPolicy,
        {"lora": {"r": 4, "alpha": 8}},
        False,
    ),  # an adapter that only generates
    "sharded": (ShardedPolicy, {"num_ranks": 2}, None),
}


@pytest.mark.parametrize(
    "mode", [pytest.param(m, marks=pytest.mark.slow) if m == "sharded" else m for m in [*MODES, "remote"]]
)
def test_every_hosting_mode_passes_the_policy_contract(mode, tmp_path, tiny_qwen3_path):
    if mode == "remote":  # an endpoint generates: only the tokenizer is local

        def new():
            return RemotePolicy("shared", tiny_qwen3_path, load_tokenizer(tiny_qwen3_path))

        check_policy(new, _samples("shared"), ADV, tmp_path / "ckpt")
        return
    cls, extra, train = MODES[mode]
    resolved = _resolved(tmp_path, tiny_qwen3_path, **extra)

    def new():
        policy = make_policy(resolved, "shared", train=train)
        assert type(policy) is cls  # make_policy is the one place that picks the mode
        return policy

    check_policy(new, _samples("shared"), ADV, tmp_path / "ckpt")


def test_the_contract_catches_a_policy_that_forgets_its_optimizer_state(tmp_path, tiny_qwen3_path):
    """A policy whose load restores the weights but not AdamW's moments fails the suite (the suite can fail)."""
    resolved = _resolved(tmp_path, tiny_qwen3_path)

    class Forgetful(FullPolicy):
        def load(self, folder, state, *, optimizer):
            return super().load(folder, state, optimizer=False)

    def new():
        p = make_policy(resolved, "shared")
        return Forgetful(p.group, p.model_path, p.trainer, p.tokenizer)

    with pytest.raises(AssertionError, match="optimizer state"):
        check_policy(new, _samples("shared"), ADV, tmp_path / "ckpt")

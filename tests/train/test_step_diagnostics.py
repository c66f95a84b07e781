"""One real training step (tiny model, parity env) logs the per-agent diagnostics of issue 39 (and issue 41's
diversity) and passes ``advantage_stats`` to the advantage rule."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")

from _train_fakes import PARITY_TASKS, make_parity_env  # noqa: E402

import mas_train.trainer as trainer_mod  # noqa: E402
from mas_train.assemble import assemble_trainer  # noqa: E402
from mas_train.lemma_stats import lemma_metrics, success_logp  # noqa: E402
from mas_train.metrics import diversity_metrics  # noqa: E402


def test_a_step_logs_noise_share_and_lld_and_uses_advantage_stats(tmp_path, tiny_qwen3_path, monkeypatch):
    from mas_train.config import TrainConfig

    seen = {}
    real = trainer_mod.compute_advantages_with_stats

    def spy(*cols, **kw):
        seen.update(kw, cols=cols)
        return real(*cols, **kw)

    monkeypatch.setattr(trainer_mod, "compute_advantages_with_stats", spy)
    cfg = TrainConfig.from_dict(
        dict(
            env="parity",
            model=tiny_qwen3_path,
            num_generations=2,
            tasks_per_step=2,
            max_steps=1,
            output_dir=str(tmp_path),
            run_name="run",
            sampling={"max_new_tokens": 4},
            advantage_stats="reference",
        )
    )
    tr = assemble_trainer(
        cfg.resolve(["solver", "verifier"]), env_factory=make_parity_env, train_tasks=PARITY_TASKS
    )
    captured = {}
    collect = tr.collector.collect

    def keep(*a, **kw):
        captured["batch"] = collect(*a, **kw)
        return captured["batch"]

    monkeypatch.setattr(tr.collector, "collect", keep)
    try:
        metrics, _ = tr.train_step()
    finally:
        tr.close()
    assert seen["stats"] == "reference"
    samples = captured["batch"].samples
    agents = sorted({s.agent for s in samples})
    # the logged values are the pure functions' on the step's own columns
    want_lemma = lemma_metrics(*seen["cols"])
    want_lld = success_logp(
        [s.agent for s in samples], [s.success for s in samples], [s.sampling_logprobs for s in samples]
    )
    for a in agents:
        for key, want in (
            (f"lemma/noise_share/{a}", want_lemma[f"lemma/noise_share/{a}"]),
            (f"lld/success_logp/{a}", want_lld[a]),
        ):
            got = metrics[key]
            assert (math.isnan(got) and math.isnan(want)) or got == want, key
        assert f"charts/advantage/zero_std_frac/{a}" in metrics
    # the step logs the diversity of its own samples (the solver opens every episode, G = 2: always kept)
    diversity = {k: v for k, v in metrics.items() if k.startswith("diversity/")}
    assert diversity == diversity_metrics(samples) and "diversity/distinct/solver" in diversity

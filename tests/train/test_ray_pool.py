"""RayPool on a local 2-CPU Ray cluster (no local_mode; RAY_AUTH_MODE=disabled so no token file is written)."""

from __future__ import annotations

import os
import time

import pytest

ray = pytest.importorskip("ray")

from mas_train.config import ConfigError, TrainConfig  # noqa: E402
from mas_train.hosting.ray_pool import RayPool, bundle_layout, parameter_fingerprint, placement_bundles  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024**2,
        log_to_driver=False,
        runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}},
    )
    yield
    ray.shutdown()


def _resolved(pool="local", **groups):
    """math-2agent (solver, verifier) with one model group per agent and the given group settings."""
    cfg = TrainConfig.from_dict(
        {
            "pool": pool,
            "env": "math-2agent",
            "model": "tiny-qwen3",
            "model_sharing": "per_agent",
            "model_groups": groups,
            "max_steps": 2,
            "num_generations": 2,
            "tasks_per_step": 1,
            "report_to": ["none"],
        }
    )
    return cfg.resolve(["solver", "verifier"])


def test_bundles_come_from_the_groups():
    resolved = _resolved(solver={"num_cpus": 1, "num_gpus": 0.5}, verifier={"num_cpus": 0.5})
    assert placement_bundles(resolved) == [{"CPU": 1.0, "GPU": 0.5}, {"CPU": 0.5}]
    with pytest.raises(ValueError, match="model_groups.verifier: num_cpus and num_gpus are both 0"):
        placement_bundles(_resolved(verifier={"num_cpus": 0}))


def test_a_sharded_group_gets_its_worker_bundle_then_one_bundle_per_rank():
    # CPU: solver's 2 ranks each get the group's num_cpus; an unsharded group keeps its one bundle
    r = _resolved("ray", solver={"num_ranks": 2, "num_cpus": 1}, verifier={"num_cpus": 0.5})
    assert placement_bundles(r) == [{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 0.5}]
    assert bundle_layout(r) == {
        "solver": {"worker": 0, "ranks": [1, 2]},
        "verifier": {"worker": 3, "ranks": []},
    }
    # GPU: num_gpus is the group's total, one GPU per rank and the rest (here 0.5) for the worker
    r = _resolved(
        "ray",
        solver={"num_cpus": 2, "num_gpus": 1},
        verifier={"num_ranks": 3, "num_cpus": 2, "num_gpus": 3.5},
    )
    assert placement_bundles(r) == [
        {"CPU": 2.0, "GPU": 1.0},
        {"CPU": 2.0, "GPU": 0.5},
        {"CPU": 2.0, "GPU": 1.0},
        {"CPU": 2.0, "GPU": 1.0},
        {"CPU": 2.0, "GPU": 1.0},
    ]
    assert bundle_layout(r) == {
        "solver": {"worker": 0, "ranks": []},
        "verifier": {"worker": 1, "ranks": [2, 3, 4]},
    }
    # unsharded groups: one bundle each, as before
    assert bundle_layout(_resolved(solver={"num_gpus": 1})) == {
        "solver": {"worker": 0, "ranks": []},
        "verifier": {"worker": 1, "ranks": []},
    }
    # a GPU group whose ranks would leave its worker no GPU is refused before anything starts
    with pytest.raises(
        ConfigError, match=r"its ranks need one GPU each and its worker \(generation\) the rest"
    ):
        _resolved("ray", solver={"num_ranks": 2, "num_gpus": 2})


def test_unsatisfiable_placement_group_fails_in_time_naming_the_missing_resources(ray_cluster):
    resolved = _resolved(solver={"num_cpus": 1, "num_gpus": 1}, verifier={"num_cpus": 1, "num_gpus": 0.5})
    pool = RayPool(resolved, ready_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"not placed within 2s: the cluster lacks \{'GPU': 1\.5\}"):
        pool.start()
    assert time.monotonic() - started < 15
    assert pool.placement_group is None  # released on failure
    assert ray.available_resources().get("CPU") == 2.0  # nothing left reserved

    too_many_cpus = RayPool(_resolved(solver={"num_cpus": 2}, verifier={"num_cpus": 1}), ready_timeout_s=1)
    with pytest.raises(TimeoutError, match=r"lacks \{'CPU': 1\.0\}"):
        too_many_cpus.start()

    # a sharded group shows its worker's bundle, then its ranks'
    sharded = RayPool(_resolved("ray", solver={"num_ranks": 2, "num_gpus": 3}), ready_timeout_s=1)
    one, gpu = r"\{'CPU': 1\.0\}", r"\{'CPU': 1\.0, 'GPU': 1\.0\}"
    with pytest.raises(TimeoutError, match=rf"'solver': \[{gpu}, {gpu}, {gpu}\], 'verifier': {one}.*lacks "):
        sharded.start()
    assert ray.available_resources().get("CPU") == 2.0


def test_parameter_fingerprint_is_exact_and_summed():
    import torch

    lin = torch.nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, -2.0]]))
        lin.bias.fill_(0.5)
    fp = parameter_fingerprint(lin)
    assert (fp["sum"], fp["abs_sum"], fp["numel"]) == (-0.5, 3.5, 3)
    with torch.no_grad():
        lin.bias.fill_(0.5000001)
    assert parameter_fingerprint(lin)["sha256"] != fp["sha256"]


@pytest.fixture(scope="module")
def branching_models(tmp_path_factory, tiny_qwen3_path):
    from tests.train._branching_models import SOLVER_TEXT, VERIFIER_TEXT, build_branching_model

    root = tmp_path_factory.mktemp("branching")
    return {
        "solver": build_branching_model(tiny_qwen3_path, root / "solver", SOLVER_TEXT),
        "verifier": build_branching_model(tiny_qwen3_path, root / "verifier", VERIFIER_TEXT),
    }


def test_workers_run_in_actors_and_are_cleaned_up(ray_cluster, tiny_qwen3_path, tmp_path):
    from mas_train.backends.base import SamplingParams
    from mas_train.hosting.pools import make_pool

    resolved = _resolved(solver={"num_cpus": 1}, verifier={"num_cpus": 0.5})
    resolved.config.pool = "ray"
    pool = make_pool(resolved)
    assert isinstance(pool, RayPool) and pool.strategy == "PACK"
    with pool:
        solver = pool.worker("solver")
        assert solver.pid != os.getpid() and solver.agents == ("solver",)
        assert pool.tokenizer("solver").decode([9707]) == "Hello"
        out = solver.generate([[9707, 1879]], SamplingParams(max_new_tokens=3, seed=0))[0]
        assert len(out.completion_ids) == len(out.logprobs) == 3 and out.weight_version == 0
        assert solver.sync_weights() == 1 and solver.weight_version == 1
        # the chat-endpoint path and a remote backend's counters reach the driver too (hf: token ids, no counters)
        assert solver.wants_messages is False and solver.usage == {}
        solver.save(str(tmp_path / "ckpt"))  # the path is made absolute in the driver
        assert (tmp_path / "ckpt" / "model" / "config.json").is_file()
        # the two bundles (1 + 0.5 CPUs) are reserved while the pool lives
        assert ray.available_resources().get("CPU", 0.0) == pytest.approx(0.5)
        actors = [pool.worker(g).actor for g in pool.groups]
        with pytest.raises(KeyError, match="no worker for model group 'judge'"):
            pool.worker("judge")
        slow = solver.actor.call.remote("generate", [[9707]] * 4, SamplingParams(max_new_tokens=64, seed=1))
        with pytest.raises(TimeoutError, match=r"solver.generate did not finish within 0s"):
            pool._get(slow, "solver.generate", timeout=0.01)
        ray.kill(pool.worker("verifier").actor, no_restart=True)
        with pytest.raises(RuntimeError, match="the Ray actor of verifier died during verifier.generate"):
            pool.worker("verifier").generate([[1]], SamplingParams(max_new_tokens=1))
    for actor in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.info.remote(), timeout=30)
    assert pool.placement_group is None
    deadline = time.monotonic() + 20
    while ray.available_resources().get("CPU", 0.0) < 2.0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 2.0
    pool.shutdown()  # idempotent


@pytest.mark.slow
def test_ray_pool_trains_bit_identically_to_the_local_pool(ray_cluster, branching_models):
    """2 math-2agent steps with the same seed: per-group parameter fingerprints equal across pools.

    Generation draws from per-request seeds and each worker seeds TRL the same way in its own process, so the
    Ray run is expected to be bit-identical to the in-process one (measured: identical sha256 of every
    parameter of both groups); both runs use one intra-op thread so float reductions happen in one order.
    """
    import torch

    from mas_train.assemble import assemble_trainer

    def run(pool_kind):
        cfg = TrainConfig.from_dict(
            {
                "env": "math-2agent",
                "model_sharing": "per_agent",
                "model_groups": {
                    "solver": {"model": branching_models["solver"], "num_cpus": 1},
                    "verifier": {"model": branching_models["verifier"], "num_cpus": 1},
                },
                "max_steps": 2,
                "num_generations": 4,
                "tasks_per_step": 2,
                "learning_rate": 1e-3,
                "sampling": {"temperature": 1.0, "max_new_tokens": 8},  # p_follow holds at T = 1 only
                "report_to": ["none"],
                "pool": pool_kind,
                "seed": 0,
            }
        )
        resolved = cfg.resolve(["solver", "verifier"])
        trainer = assemble_trainer(resolved)
        try:
            if pool_kind == "local":
                before = {g: parameter_fingerprint(trainer.pool.worker(g).model) for g in trainer.groups}
            for _ in range(2):
                trainer.train_step()
            if pool_kind == "local":
                after = {g: parameter_fingerprint(trainer.pool.worker(g).model) for g in trainer.groups}
                unchanged = [g for g in after if after[g]["sha256"] == before[g]["sha256"]]
                assert not unchanged, (
                    f"model groups {unchanged} did not train: the comparison would be vacuous"
                )
            else:
                after = {g: trainer.pool.worker(g).fingerprint() for g in trainer.groups}
        finally:
            trainer.close()
        return after

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = run("local")
    finally:
        torch.set_num_threads(threads)
    remote = run("ray")
    assert remote == local


@pytest.mark.slow
def test_ctrl_c_removes_the_actors(tmp_path, tiny_qwen3_path):
    """A driver interrupted with SIGINT exits and leaves no worker process behind."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text(
        "import os, time\n"
        "from mas_train.config import TrainConfig\n"
        "from mas_train.hosting.ray_pool import RayPool\n"
        "groups = {'verifier': {'num_cpus': 0.5}, 'solver': {'num_cpus': 0.5}}\n"
        "cfg = TrainConfig.from_dict({'env': 'math-2agent', 'model': os.environ['MODEL_PATH'],\n"
        "    'model_sharing': 'per_agent', 'report_to': ['none'], 'model_groups': groups})\n"
        "init = {'num_cpus': 2, 'object_store_memory': 200 * 1024**2}\n"
        "pool = RayPool(cfg.resolve(['solver', 'verifier']), init_kwargs=init).start()\n"
        "print('PIDS', *[pool.worker(g).pid for g in pool.groups], flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "MODEL_PATH": tiny_qwen3_path}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, cwd=os.getcwd()
    )
    try:
        pids = []
        for line in proc.stdout:
            if line.startswith("PIDS"):
                pids = [int(p) for p in line.split()[1:]]
                break
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 30
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and "Z" not in _proc_state(p)]
        time.sleep(0.5)
    assert alive == []


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0]
    except OSError:
        return "Z"

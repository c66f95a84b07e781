"""Sharded model groups (num_ranks > 1, PyTorch FSDP2 over gloo on CPU): the same update as one rank, checkpoints
that load unsharded and resume sharded, and a killed rank that fails the run by name."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

pytest.importorskip("trl")

from _train_fakes import PARITY_TASKS, make_parity_env  # noqa: E402

from mas_train.assemble import assemble_trainer  # noqa: E402
from mas_train.config import ConfigError, TrainConfig  # noqa: E402
from mas_train.hosting.sharded import ShardedPolicy  # noqa: E402
from mas_train.hosting.sharded_rank import RankFailure, optimizer_state_by_index, rank_share  # noqa: E402

AGENTS = ["solver", "verifier"]
# fp32 on CPU: the 2-rank gradient is the 1-rank one summed in another order (reduce-scatter), and each rank
# runs the micro-batches without the shared-prefix forward; after 2 AdamW steps at lr 1e-3 the weights agree
# to ~1e-6 (measured max-abs-diff: see docs/scaling.md), Adam's normalisation amplifying rounding in near-zero
# gradients, hence this tolerance.
ATOL = 2e-5


def _cfg(tmp_path, model, run_name, **kw):
    return TrainConfig.from_dict(
        dict(
            env="parity",
            model=model,
            num_generations=2,
            tasks_per_step=2,
            max_steps=4,
            output_dir=str(tmp_path),
            run_name=run_name,
            learning_rate=1e-3,
            micro_batch_size=2,
            log_agent_grad_norms=False,
            sampling={"max_new_tokens": 4},
            **kw,
        )
    )


def _trainer(cfg):
    return assemble_trainer(cfg.resolve(AGENTS), env_factory=make_parity_env, train_tasks=PARITY_TASKS)


def _params(t):
    return {
        g: {k: v.detach().clone() for k, v in t.pool.worker(g).model.state_dict().items()} for g in t.groups
    }


def _max_diff(a, b):
    return max((a[g][k] - b[g][k]).abs().max().item() for g in a for k in a[g])


# ------------------------------------------------------------------------------------------- fast, no processes


def test_rank_share_splits_the_plan_and_pads_with_zero_weight():
    plan = ["m0", "m1", "m2"]
    assert rank_share(plan, rank=0, world=2) == (["m0", "m2"], [1.0, 1.0])
    assert rank_share(plan, rank=1, world=2) == (["m1", "m1"], [1.0, 0.0])
    # fewer micro-batches than ranks: rank 3 owns none and re-runs m0 at weight 0
    assert rank_share(plan, rank=3, world=4) == (["m0"], [0.0])
    with pytest.raises(ValueError, match="0 <= rank < world"):
        rank_share(plan, rank=2, world=2)


def test_rank_failure_pickles_with_its_group_and_rank():
    import pickle

    err = pickle.loads(pickle.dumps(RankFailure("model group 'g': rank 1 of 2 died", group="g", rank=1)))
    assert (type(err), str(err), err.group, err.rank) == (
        RankFailure,
        "model group 'g': rank 1 of 2 died",
        "g",
        1,
    )


def test_optimizer_state_is_saved_in_torch_optim_format():
    named = {
        "state": {"b": {"step": 1}, "a": {"step": 2}},
        "param_groups": [{"lr": 0.1, "params": ["a"]}, {"lr": 0.2, "params": ["b"]}],
    }
    plain = optimizer_state_by_index(named, ["a", "b"])
    assert plain == {
        "state": {1: {"step": 1}, 0: {"step": 2}},
        "param_groups": [{"lr": 0.1, "params": [0]}, {"lr": 0.2, "params": [1]}],
    }


def _resolve(**kw):
    return TrainConfig.from_dict({"model": "tiny-qwen3", **kw}).resolve(AGENTS)


def test_num_ranks_config_top_level_per_group_and_refusals():
    r = _resolve(num_ranks=2, model_sharing="per_agent")
    assert [(g.num_ranks, g.sharding) for g in r.model_groups.values()] == [(2, "fsdp2"), (2, "fsdp2")]
    r = _resolve(num_ranks=2, model_sharing="per_agent", model_groups={"verifier": {"num_ranks": 1}})
    assert (r.model_groups["solver"].num_ranks, r.model_groups["verifier"].num_ranks) == (2, 1)
    assert _resolve().model_groups["shared"].num_ranks == 1
    with pytest.raises(ConfigError, match="num_ranks must be >= 1"):
        TrainConfig.from_dict({"num_ranks": 0})
    with pytest.raises(ConfigError, match="sharding"):
        TrainConfig.from_dict({"sharding": "zero3"})
    with pytest.raises(ConfigError, match="sharding a LoRA group .* is not implemented"):
        _resolve(num_ranks=2, model_sharing="shared_lora")
    with pytest.raises(ConfigError, match="sharding a LoRA group"):
        _resolve(num_ranks=2, lora={"r": 4})
    with pytest.raises(ConfigError, match="per-agent gradient norms are not measured for a sharded group"):
        _resolve(num_ranks=2, log_agent_grad_norms=True)
    with pytest.raises(ConfigError, match=r"grpo.beta > 0"):
        _resolve(num_ranks=2, grpo={"beta": 0.1})
    assert _resolve(num_ranks=2, pool="ray").model_groups["shared"].num_ranks == 2
    with pytest.raises(
        ConfigError, match=r"reserves num_gpus = 1.0, its ranks need one GPU each and its worker"
    ):
        _resolve(num_ranks=2, pool="ray", model_groups={"shared": {"num_gpus": 1}})
    with pytest.raises(ConfigError, match="Ray assigns the group's GPUs"):
        _resolve(num_ranks=2, pool="ray", model_groups={"shared": {"rank_gpu_ids": [0, 1]}})
    with pytest.raises(ConfigError, match="rank_gpu_ids lists 1 GPUs for num_ranks = 2"):
        _resolve(num_ranks=2, model_groups={"shared": {"rank_gpu_ids": [3]}})
    # a frozen group keeps 1 under the top-level default; asking it for more is refused
    assert _resolve(num_ranks=2, trainable=False).model_groups["shared"].num_ranks == 1
    with pytest.raises(ConfigError, match="frozen"):
        _resolve(trainable=False, model_groups={"shared": {"num_ranks": 2}})


def test_sharded_example_configs_give_each_rank_its_own_gpu():
    from pathlib import Path

    import mas_envs

    folder = Path(__file__).resolve().parents[2] / "examples" / "configs"
    layouts = {}
    for name in ("qwen3_8b_sharded", "hetero_7b_3b_sharded"):
        cfg = TrainConfig.from_yaml(folder / f"{name}.yaml")
        groups = cfg.resolve(list(mas_envs.make(cfg.env).possible_agents)).model_groups.values()
        gpus = [gpu for g in groups for gpu in g.rank_gpu_ids]
        assert len(gpus) == len(set(gpus)) <= 8, name  # no GPU trains two ranks
        for g in groups:  # each group's engine sits on its own ranks' GPUs, TP over all of them
            assert list(g.rank_gpu_ids) == g.backend_options.gpu_ids, (name, g.name)
            assert g.backend_options.tp_size == g.num_ranks
        layouts[name] = {g.name: (g.model, g.num_ranks) for g in groups}
    assert layouts == {
        "qwen3_8b_sharded": {"solver": ("Qwen/Qwen3-8B", 4), "verifier": ("Qwen/Qwen3-8B", 4)},
        "hetero_7b_3b_sharded": {
            "verifier": ("Qwen/Qwen2.5-7B-Instruct", 4),
            "search_answer": ("Qwen/Qwen2.5-3B-Instruct", 2),
        },
    }


# ---------------------------------------------------------------------------------------- multi-process, slow


def _run(tmp_path, model, name, steps=2, seen=None, **kw):
    t = _trainer(_cfg(tmp_path, model, name, **kw))
    if t.resolved.config.pool == "ray":
        try:
            for _ in range(steps):
                m, _extra = t.train_step()
            for g in t.groups:  # each group's update ran on 2 rank actors, each holding about half
                h = t.pool.worker(g)
                sizes = h._call("rank_sizes")
                assert len(sizes) == 2 and sizes[0]["params"] < 0.51 * h.num_parameters
                if seen is not None:  # where the ranks ran, for the caller to check
                    seen[g] = {"worker_pid": h.pid, "ranks": h._call("rank_info"), "layout": t.pool.layout[g]}
            from safetensors.torch import load_file

            folder = t.save_checkpoint()
            return {g: load_file(folder / "groups" / g / "model" / "model.safetensors") for g in t.groups}, m
        finally:
            t.close()
    try:
        for _ in range(steps):
            m, _extra = t.train_step()
        for g in t.groups:
            w = t.pool.worker(g)
            if isinstance(
                w.policy, ShardedPolicy
            ):  # each rank holds about half of the weights and of AdamW's two moments
                sizes = w.rank_sizes()  # (FSDP2 pads a tensor whose first dim is odd: not exactly half)
                assert sum(s["params"] for s in sizes) == w.num_parameters, sizes
                for s in sizes:
                    assert abs(s["params"] - w.num_parameters / 2) < 0.001 * w.num_parameters, sizes
                    assert s["optimizer"] == 2 * s["params"], sizes
                # the weight sync moves the full fp32 weights to the worker once
                sync_bytes = sum(
                    v.numel() * v.element_size() for v in w.policy.ranks.full_state_dict().values()
                )
                print(f"{g}: sync bytes per step {sync_bytes:,}")
                assert sync_bytes == 4 * w.num_parameters
        return _params(t), m
    finally:
        t.close()


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["shared", "per_agent"])
def test_two_gloo_ranks_train_like_one(tmp_path, tiny_qwen3_path, sharing):
    one, m1 = _run(tmp_path, tiny_qwen3_path, f"one-{sharing}", model_sharing=sharing)
    two, m2 = _run(tmp_path, tiny_qwen3_path, f"two-{sharing}", model_sharing=sharing, num_ranks=2)
    diff = _max_diff(one, two)
    print(f"{sharing}: max |w_1rank - w_2rank| after 2 steps = {diff:.3g}")
    assert diff < ATOL
    for g in one:
        assert m2[f"losses/loss/{g}"] == pytest.approx(m1[f"losses/loss/{g}"], rel=1e-4, abs=1e-6)
    # the weights did move (the test would pass trivially otherwise)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path).state_dict()
    moved = max((one[g][k] - base[k]).abs().max().item() for g in one for k in one[g])
    assert moved > 100 * ATOL


@pytest.mark.slow
def test_sharded_checkpoint_loads_unsharded_and_resumes_with_other_rank_counts(tmp_path, tiny_qwen3_path):
    from transformers import AutoModelForCausalLM

    a = _trainer(_cfg(tmp_path, tiny_qwen3_path, "a", num_ranks=2))
    try:
        a.train_step()
        ckpt = a.save_checkpoint()
        a.train_step()
        ref = _params(a)["shared"]
    finally:
        a.close()
    # a plain Hugging Face folder, no FSDP needed to read it
    plain = AutoModelForCausalLM.from_pretrained(ckpt / "groups" / "shared" / "model").state_dict()
    assert set(plain) <= set(ref) and len(plain) > 10
    # resume unsharded (1 rank) and sharded (2 ranks): the same second step as the uninterrupted run
    for n in (1, 2):
        b = _trainer(_cfg(tmp_path, tiny_qwen3_path, f"b{n}", num_ranks=n))
        try:
            b.load_checkpoint(ckpt)
            assert b.step == 1
            b.train_step()
            got = _params(b)["shared"]
        finally:
            b.close()
        diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
        print(f"resume with {n} rank(s): max diff {diff:.3g}")
        assert diff < ATOL, n


@pytest.mark.slow
def test_unsharded_checkpoint_resumes_on_two_ranks(tmp_path, tiny_qwen3_path):
    a = _trainer(_cfg(tmp_path, tiny_qwen3_path, "u1"))
    try:
        a.train_step()
        ckpt = a.save_checkpoint()
        a.train_step()
        ref = _params(a)["shared"]
    finally:
        a.close()
    b = _trainer(_cfg(tmp_path, tiny_qwen3_path, "u2", num_ranks=2))
    try:
        b.load_checkpoint(ckpt)
        b.train_step()
        got = _params(b)["shared"]
    finally:
        b.close()
    diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
    print(f"1-rank checkpoint resumed on 2 ranks: max diff {diff:.3g}")
    assert diff < ATOL


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_killing_a_rank_fails_naming_group_and_rank_and_leaves_no_process(tmp_path, tiny_qwen3_path):
    t = _trainer(_cfg(tmp_path, tiny_qwen3_path, "kill", num_ranks=2, model_sharing="per_agent"))
    try:
        ranks = t.pool.worker("verifier").policy.ranks
        t.train_step()  # the ranks are up and have trained once
        pids = [p for g in t.groups for p in t.pool.worker(g).policy.ranks.pids]
        os.kill(ranks.pids[1], signal.SIGKILL)
        with pytest.raises(RankFailure, match=r"model group 'verifier': rank 1 of 2 died") as err:
            t.train_step()
        assert (err.value.group, err.value.rank) == ("verifier", 1)
    finally:
        t.close()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)]
    assert torch.distributed.is_initialized() is False  # the driver never joined a process group


def _ray_init(ray, num_cpus):
    """A local Ray cluster of ``num_cpus`` logical CPUs (each rank actor and each worker reserves 1)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=300 * 1024**2,
        log_to_driver=False,
        runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}},
    )


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["shared", "per_agent"])
def test_two_rank_actors_in_their_own_bundles_train_like_one_local_rank(tmp_path, tiny_qwen3_path, sharing):
    """pool: ray: each sharded group's worker actor starts its 2 ranks as 2 Ray actors, each in its own bundle
    of the placement group; after 2 steps the weights equal 1 local rank's."""
    ray = pytest.importorskip("ray")
    one, m1 = _run(tmp_path, tiny_qwen3_path, f"ray-one-{sharing}", model_sharing=sharing)
    _ray_init(ray, num_cpus=3 * len(one))  # per group: the worker's bundle and 2 rank bundles, 1 CPU each
    seen: dict = {}
    started = time.monotonic()
    try:
        two, m2 = _run(
            tmp_path,
            tiny_qwen3_path,
            f"ray-two-{sharing}",
            num_ranks=2,
            pool="ray",
            model_sharing=sharing,
            seen=seen,
        )
    finally:
        ray.shutdown()
    print(f"ray {sharing}: 2 steps + checkpoint with rank actors in {time.monotonic() - started:.1f} s")
    common = {g: {k: v for k, v in one[g].items() if k in two[g]} for g in one}
    diff = _max_diff(common, two)
    print(f"ray {sharing}: max |w_1rank local - w_2rank actors| after 2 steps = {diff:.3g}")
    assert diff < ATOL and all(len(common[g]) > 10 for g in one)
    for g in one:
        assert m2[f"losses/loss/{g}"] == pytest.approx(m1[f"losses/loss/{g}"], rel=1e-4, abs=1e-6)
    # the ranks are actors of their own, each in the bundle bundle_layout gave it, none a child of the worker
    assert set(seen) == set(one)
    expected = {"shared": [1, 2]} if sharing == "shared" else {"solver": [1, 2], "verifier": [4, 5]}
    assert {g: v["layout"]["ranks"] for g, v in seen.items()} == expected
    for g, v in seen.items():
        ranks = v["ranks"]
        print(g, [(r["rank"], r["pid"], r["bundle"], r["actor_id"][:8]) for r in ranks])
        assert [r["rank"] for r in ranks] == [0, 1]
        assert [r["bundle"] for r in ranks] == expected[g]
        assert len({r["actor_id"] for r in ranks}) == 2 and all(r["actor_id"] for r in ranks)
        assert len({r["pid"] for r in ranks}) == 2
        assert all(r["pid"] != v["worker_pid"] and r["ppid"] != v["worker_pid"] for r in ranks)


@pytest.mark.slow
def test_killing_a_rank_actor_fails_naming_group_and_rank_and_leaves_no_rank_actor(tmp_path, tiny_qwen3_path):
    ray = pytest.importorskip("ray")
    _ray_init(ray, num_cpus=6)
    try:
        t = _trainer(
            _cfg(tmp_path, tiny_qwen3_path, "ray-kill", num_ranks=2, model_sharing="per_agent", pool="ray")
        )
        try:
            t.train_step()  # the rank actors are up and have trained once
            info = {g: t.pool.worker(g)._call("rank_info") for g in t.groups}
            pids = [r["pid"] for g in t.groups for r in info[g]]
            names = [r["name"] for g in t.groups for r in info[g]]
            ray.kill(ray.get_actor(info["verifier"][1]["name"]), no_restart=True)
            started = time.monotonic()
            with pytest.raises(RankFailure, match=r"model group 'verifier': rank 1 of 2 died") as err:
                t.train_step()
            print(f"RankFailure after {time.monotonic() - started:.1f} s: {str(err.value).splitlines()[-1]}")
            assert (err.value.group, err.value.rank) == ("verifier", 1)
            # the verifier's worker killed its other rank at once, before any close
            verifier = [r["pid"] for r in info["verifier"]]
            deadline = time.monotonic() + 20
            while any(_alive(p) for p in verifier) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not [p for p in verifier if _alive(p)]
        finally:
            t.close()
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if _alive(p)]
        for name in names:  # gone from Ray too, not only as processes
            with pytest.raises(ValueError):
                ray.get_actor(name)
    finally:
        ray.shutdown()

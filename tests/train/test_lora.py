"""LoRA adapters (issue 13): one adapter per agent on one base, PEFT-format checkpoints, exact resume, frozen agents."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("trl")

from _train_fakes import PARITY_TASKS, make_parity_env  # noqa: E402

from mas_train.assemble import assemble_trainer  # noqa: E402
from mas_train.config import ConfigError, TrainConfig  # noqa: E402
from mas_train.hosting.policy import FrozenPolicy  # noqa: E402
from mas_train.lora import is_adapter_param  # noqa: E402
from mas_train.rollout import Sample  # noqa: E402

AGENTS = ["solver", "verifier"]
# one adapter per agent, each with its own rank and learning rate
SHARED = dict(
    model_sharing="shared_lora",
    model_groups={
        "solver": {"lora": {"r": 4, "alpha": 8}, "learning_rate": 1e-2},
        "verifier": {"lora": {"r": 2, "alpha": 4}, "learning_rate": 5e-3},
    },
)


def _cfg(tmp_path, model, run_name="run", **extra):
    return TrainConfig.from_dict(
        dict(
            env="parity",
            model=model,
            num_generations=2,
            tasks_per_step=2,
            max_steps=4,
            output_dir=str(tmp_path),
            run_name=run_name,
            learning_rate=1e-2,
            sampling={"max_new_tokens": 4},
            **extra,
        )
    )


def _trainer(tmp_path, model, run_name="run", **extra):
    resolved = _cfg(tmp_path, model, run_name, **extra).resolve(AGENTS)
    return assemble_trainer(resolved, env_factory=make_parity_env, train_tasks=PARITY_TASKS)


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _split(params, adapters):
    """{adapter: {name: tensor}} plus "base" for every parameter that belongs to no adapter."""
    out = {a: {} for a in [*adapters, "base"]}
    for n, p in params.items():
        owner = next((a for a in adapters if is_adapter_param(n, a)), "base")
        out[owner][n] = p
    return out


def _changed(before, after):
    return [n for n in before if not torch.equal(before[n], after[n])]


def _logps(model, ids):
    """Per-token logprobs (B, T-1) of ``ids`` under ``model``: log_softmax(logits)[next token]."""
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


FIXED = torch.tensor(
    [[151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645], [9707, 11, 1879, 0, 3555] * 2 + [13]]
)


def test_shared_lora_one_base_two_adapters_each_trains_only_its_own(tmp_path, tiny_qwen3_path):
    tr = _trainer(tmp_path, tiny_qwen3_path, **SHARED)
    try:
        sol, ver = tr.pool.worker("solver"), tr.pool.worker("verifier")
        peft_model = sol.policy.shared_base
        assert ver.policy.shared_base is peft_model  # one base model in memory
        assert list(peft_model.peft_config) == AGENTS
        # each optimizer holds exactly its own adapter's parameters
        for w, r, lr in ((sol, 4, 1e-2), (ver, 2, 5e-3)):
            assert peft_model.peft_config[w.group].r == r
            assert {grp["lr"] for grp in w.policy.trainer.optimizer.param_groups} <= {lr, 0.0}
            held = {id(p) for grp in w.policy.trainer.optimizer.param_groups for p in grp["params"]}
            own = {id(p) for n, p in peft_model.named_parameters() if is_adapter_param(n, w.group)}
            assert held == own and len(own) == 2 * 4 * 2  # lora_A and lora_B on 4 modules x 2 layers
            assert w.num_parameters == sum(
                p.numel() for n, p in peft_model.named_parameters() if is_adapter_param(n, w.group)
            )

        before = _split(_snapshot(peft_model), AGENTS)
        metrics, _ = tr.train_step()
        after = _split(_snapshot(peft_model), AGENTS)
        assert _changed(before["base"], after["base"]) == []  # base bit-identical
        for a in AGENTS:
            # LoRA starts at B = 0, so the first step moves every B (dL/dA = 0 while B = 0)
            lora_b = [n for n in before[a] if ".lora_B." in n]
            assert sorted(_changed(before[a], after[a])) == sorted(lora_b) and len(lora_b) == 8, a
            assert metrics[f"losses/grad_norm/{a}"] > 0
            assert tr.pool.worker(a).weight_version == 1  # synced (share_model on CPU: a version bump)

        # training the solver's adapter alone leaves the verifier's adapter and the base untouched
        ids = FIXED[0].tolist()
        samples = [
            Sample(
                "t",
                f"r{i}",
                "solver",
                "solver",
                0,
                ids[:6],
                ids[6 : 8 + i],
                [-3.0] * (2 + i),
                False,
                1.0,
                True,
                1,
                "stop",
                "x",
            )
            for i in range(2)
        ]
        mid = _split(_snapshot(peft_model), AGENTS)
        sol.update(samples, [1.0, -1.0])
        end = _split(_snapshot(peft_model), AGENTS)
        assert _changed(mid["base"], end["base"]) == [] and _changed(mid["verifier"], end["verifier"]) == []
        assert len(_changed(mid["solver"], end["solver"])) == len(mid["solver"])  # now A moves too

        # generation uses the calling group's adapter
        sol.policy.activate(training=False)
        lp_sol = _logps(peft_model, FIXED)
        ver.policy.activate(training=False)
        lp_ver = _logps(peft_model, FIXED)
        assert not torch.allclose(lp_sol, lp_ver)
    finally:
        tr.close()


def test_adapters_save_in_peft_format_and_reload_to_the_same_logprobs(tmp_path, tiny_qwen3_path):
    from peft import PeftModel

    from mas_train.models import load_model_and_tokenizer

    tr = _trainer(tmp_path, tiny_qwen3_path, **SHARED)
    try:
        tr.train_step()
        ckpt = tr.save_checkpoint()
        expected = {}
        for a in AGENTS:
            tr.pool.worker(a).policy.activate(training=False)
            expected[a] = _logps(tr.pool.worker(a).policy.shared_base, FIXED)
    finally:
        tr.close()
    for a in AGENTS:
        folder = ckpt / "groups" / a
        assert (folder / "adapter" / "adapter_config.json").is_file()
        assert (folder / "adapter" / "adapter_model.safetensors").is_file()
        assert not (folder / "model").exists() and (folder / "optimizer.pt").is_file()
        state = json.loads((folder / "state.json").read_text())
        assert state["lora"] is True and state["agents"] == [a] and state["global_step"] == 1
        assert (
            json.loads((folder / "adapter" / "adapter_config.json").read_text())["r"]
            == {"solver": 4, "verifier": 2}[a]
        )
        base, _ = load_model_and_tokenizer(tiny_qwen3_path, dtype="float32", device="cpu")
        loaded = PeftModel.from_pretrained(base, str(folder / "adapter")).eval()
        torch.testing.assert_close(_logps(loaded, FIXED), expected[a], rtol=0, atol=1e-5)
        with loaded.disable_adapter():  # the adapter matters: the base alone is measurably different
            assert (_logps(loaded, FIXED) - expected[a]).abs().max() > 1e-4

    # the mas-eval path: generation-only workers (train=False) load the adapters and reproduce the policy
    from mas_train.hosting.policy import FrozenLoraPolicy
    from mas_train.hosting.pools import LocalPool

    pool = LocalPool(_cfg(tmp_path, tiny_qwen3_path, "eval", **SHARED).resolve(AGENTS), train=False).start()
    try:
        for a in AGENTS:
            w = pool.worker(a)
            assert (
                isinstance(w.policy, FrozenLoraPolicy)  # an adapter that only generates
                and not w.trains
                and w.num_parameters == 0
                and w.policy.shared_base is pool.worker("solver").policy.shared_base
            )
            w.load_weights(str(ckpt / "groups" / a))
        for a in AGENTS:
            pool.worker(a).policy.activate(training=False)
            torch.testing.assert_close(
                _logps(pool.worker(a).policy.shared_base, FIXED), expected[a], rtol=0, atol=1e-5
            )
    finally:
        pool.shutdown()

    # mas-export: one merged plain HF model per agent, same logprobs, no PEFT needed to load it
    from transformers import AutoModelForCausalLM

    from mas_train.tools.export import main as export_main

    assert export_main([str(ckpt.parent.parent), "--out", str(tmp_path / "export")]) == 0
    for a in AGENTS:
        assert not (tmp_path / "export" / a / "adapter_config.json").exists()
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "export" / a).eval()
        torch.testing.assert_close(_logps(merged, FIXED), expected[a], rtol=0, atol=1e-5)
    assert export_main([str(ckpt), "--out", str(tmp_path / "export")]) == 2  # never overwrites


def test_shared_lora_resume_continues_exactly(tmp_path, tiny_qwen3_path):
    kw = dict(**SHARED)
    a = _trainer(tmp_path, tiny_qwen3_path, "a", **kw)
    try:
        a.train_step()
        ckpt = a.save_checkpoint()
        m2, extra2 = a.train_step()
        params_a = _snapshot(a.pool.worker("solver").policy.shared_base)
    finally:
        a.close()
    b = _trainer(tmp_path, tiny_qwen3_path, "b", **kw)
    try:
        b.load_checkpoint(ckpt)
        assert b.step == 1 and b.pool.worker("verifier").policy.trainer.state.global_step == 1
        m2b, extra2b = b.train_step()
        params_b = _snapshot(b.pool.worker("solver").policy.shared_base)
    finally:
        b.close()
    assert extra2b["tasks"] == extra2["tasks"]
    for k in ("charts/reward", "charts/tokens/solver", "losses/loss/solver", "losses/loss/verifier"):
        assert m2b[k] == pytest.approx(m2[k], rel=1e-5, abs=1e-7), k
    assert params_a.keys() == params_b.keys()
    for k, v in params_a.items():
        torch.testing.assert_close(params_b[k], v, rtol=1e-5, atol=1e-6)


def test_lora_group_with_a_private_backend_copy_syncs_only_the_adapter(tmp_path, tiny_qwen3_path):
    tr = _trainer(
        tmp_path,
        tiny_qwen3_path,
        model_groups={"shared": {"lora": {"r": 2, "alpha": 4, "dropout": 0.1}}},
        backend_options={"share_model": False},
    )
    try:
        w = tr.pool.worker("shared")
        assert w.policy.adapter == "shared" and w.backend.model is not w.policy.shared_base
        gen_before = _snapshot(w.backend.model)
        tr.train_step()
        # LoRA dropout survives TRL's disable_dropout (a setting we cannot honour would be refused, not zeroed)
        drops = [
            m.lora_dropout["shared"].p for m in w.policy.shared_base.modules() if hasattr(m, "lora_dropout")
        ]
        assert drops and set(drops) == {0.1}
        gen_after = _snapshot(w.backend.model)
        changed = _changed(gen_before, gen_after)
        assert changed and all(is_adapter_param(n, "shared") for n in changed)  # only the adapter was pushed
        for n, p in w.policy.shared_base.named_parameters():
            assert torch.equal(gen_after[n], p.detach()), n
        assert w.weight_version == 1
    finally:
        tr.close()


def test_shared_lora_with_the_ray_pool_is_refused_at_resolution(tmp_path, tiny_qwen3_path):
    cfg = _cfg(tmp_path, tiny_qwen3_path, model_sharing="shared_lora", pool="ray")
    with pytest.raises(ConfigError, match="shared_lora keeps one base model in one process.*pool: local"):
        cfg.resolve(AGENTS)


def test_a_frozen_verifier_acts_and_is_logged_but_only_the_solver_trains(tmp_path, tiny_qwen3_path):
    tr = _trainer(
        tmp_path, tiny_qwen3_path, model_sharing="per_agent", agents={"verifier": {"trainable": False}}
    )
    try:
        sol, ver = tr.pool.worker("solver"), tr.pool.worker("verifier")
        assert (
            isinstance(ver.policy, FrozenPolicy) and not ver.trains and ver.num_parameters == 0
        )  # no optimizer
        before = {g: _snapshot(tr.pool.worker(g).model) for g in AGENTS}
        metrics, _ = tr.train_step()
        assert len(_changed(before["solver"], _snapshot(sol.model))) == len(before["solver"])
        assert _changed(before["verifier"], _snapshot(ver.model)) == []
        assert ver.weight_version == 0 and sol.weight_version == 1
        assert metrics["charts/turns/verifier"] > 0 and 0 <= metrics["charts/invalid_rate/verifier"] <= 1
        assert "losses/loss/verifier" not in metrics and "losses/grad_norm/verifier" not in metrics
        ckpt = tr.save_checkpoint()
        assert sorted(p.name for p in (ckpt / "groups" / "verifier").iterdir()) == ["state.json"]
        expected = {g: _logps(tr.pool.worker(g).model, FIXED) for g in AGENTS}
    finally:
        tr.close()
    # mas-export: the trained solver's folder, and the frozen verifier's base model
    from transformers import AutoModelForCausalLM

    from mas_train.tools.export import export_checkpoint

    written = export_checkpoint(ckpt, tmp_path / "export")
    assert list(written) == AGENTS
    for a in AGENTS:
        model = AutoModelForCausalLM.from_pretrained(written[a]).eval()
        torch.testing.assert_close(_logps(model, FIXED), expected[a], rtol=0, atol=1e-5)


def test_lora_kl_reference_is_the_base_with_the_adapter_disabled(tmp_path, tiny_qwen3_path):
    tr = _trainer(tmp_path, tiny_qwen3_path, model_groups={"shared": {"lora": {"r": 2}}}, grpo={"beta": 0.1})
    try:
        w = tr.pool.worker("shared")
        assert (
            w.policy.trainer.ref_model is None and w.policy.trainer.ref_is_base
        )  # no second copy of the weights
        m1, _ = tr.train_step()
        m2, _ = tr.train_step()
        # step 1: the adapter is still B = 0, so policy = reference and KL = 0; after it moved, KL > 0
        assert m1["losses/kl/shared"] == pytest.approx(0.0, abs=1e-7)
        assert m2["losses/kl/shared"] > 0
    finally:
        tr.close()


def test_initial_adapters_depend_on_the_run_seed_and_group_not_on_the_global_rng(tmp_path, tiny_qwen3_path):
    def adapters(name, seed, consume):
        torch.rand(consume)  # whatever ran before in the process must not change the initial adapters
        tr = _trainer(tmp_path, tiny_qwen3_path, run_name=name, seed=seed, **SHARED)
        params = _split(_snapshot(tr.pool.worker("solver").policy.shared_base), ["solver", "verifier"])
        return params["solver"], params["verifier"]

    s1, v1 = adapters("a", 0, 3)
    s2, v2 = adapters("b", 0, 17)
    s3, _ = adapters("c", 1, 3)
    assert s1 and all(torch.equal(s1[n], s2[n]) for n in s1) and all(torch.equal(v1[n], v2[n]) for n in v1)
    a_solver = [n for n in s1 if "lora_A" in n]
    assert a_solver and not all(torch.equal(s1[n], s3[n]) for n in a_solver)  # another seed, another init
    # the two groups' A matrices differ (same shapes where the ranks agree would otherwise be equal draws)
    first_a_v = next(v for n, v in v1.items() if "lora_A" in n)
    assert not torch.equal(s1[a_solver[0]][: first_a_v.shape[0]], first_a_v)


# one of the two rows (every step draws both) opens with the verifier, so the first tick holds both agents' turns
MIXED_TASKS = [PARITY_TASKS[0], dict(PARITY_TASKS[1], first_agent="verifier")]


def _run_two_steps(tmp_path, model, *, mix_adapters):
    resolved = _cfg(tmp_path, model, f"mix{int(mix_adapters)}", **SHARED).resolve(AGENTS)
    tr = assemble_trainer(resolved, env_factory=make_parity_env, train_tasks=MIXED_TASKS)
    tr.collector.mix_adapters = mix_adapters
    batches, steps = [], []
    collect = tr.collector.collect
    tr.collector.collect = lambda *a, **kw: batches.append(collect(*a, **kw)) or batches[-1]
    try:
        for _ in range(2):
            steps.append(tr.train_step()[0])
        params = _snapshot(tr.pool.worker("solver").policy.shared_base)
    finally:
        tr.close()
    return batches, steps, params


def test_shared_lora_one_generate_per_tick_for_both_adapters_changes_nothing(tmp_path, tiny_qwen3_path):
    mixed, mixed_metrics, mixed_params = _run_two_steps(tmp_path, tiny_qwen3_path, mix_adapters=True)
    alone, alone_metrics, alone_params = _run_two_steps(tmp_path, tiny_qwen3_path, mix_adapters=False)
    for m, a in zip(mixed, alone, strict=True):
        assert m.ticks == a.ticks
        # every tick is one call: both agents' turns of a tick share it (the first tick holds both)
        assert sum(m.generate_calls.values()) == m.ticks < sum(a.generate_calls.values())
        assert m.generate_calls.get("solver+verifier", 0) >= 1 and set(a.generate_calls) <= set(AGENTS)
        assert len(m.samples) == len(a.samples)
        for sm, sa in zip(m.samples, a.samples, strict=True):
            assert (sm.agent, sm.model_group, sm.traj_uid, sm.turn) == (
                sa.agent,
                sa.model_group,
                sa.traj_uid,
                sa.turn,
            )
            assert sm.prompt_ids == sa.prompt_ids and sm.completion_ids == sa.completion_ids
            assert sm.weight_version == sa.weight_version and sm.finish_reason == sa.finish_reason
            assert torch.allclose(
                torch.tensor(sm.sampling_logprobs), torch.tensor(sa.sampling_logprobs), atol=1e-5
            )
    # step 2 samples with the adapters step 1 trained (B != 0, different per agent): still the same rows
    assert {s.weight_version for s in mixed[1].samples} == {1}
    for mm, am in zip(mixed_metrics, alone_metrics, strict=True):
        for key in ("losses/loss/solver", "losses/loss/verifier", "losses/grad_norm/solver", "charts/reward"):
            assert mm[key] == pytest.approx(am[key], rel=1e-4, abs=1e-6), key
    for name, p in mixed_params.items():
        assert torch.allclose(p, alone_params[name], atol=1e-6), name

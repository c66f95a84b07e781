"""GroupGRPOTrainer / ModelGroupWorker / MultiGroupTrainer on the tiny Qwen3 model: it really trains."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

pytest.importorskip("trl")

from _train_fakes import PARITY_TASKS, make_parity_env  # noqa: E402

from mas_train.assemble import assemble_trainer  # noqa: E402
from mas_train.grpo.update import GroupGRPOTrainer, grpo_args  # noqa: E402
from mas_train.hosting.worker import StaleSampleError  # noqa: E402
from mas_train.rollout import Sample  # noqa: E402
from mas_train.samples import merge_duplicates  # noqa: E402
from mas_train.tasks import TaskSampler  # noqa: E402


def _samples(n_solver=4, n_verifier=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_solver + n_verifier):
        agent = "solver" if i < n_solver else "verifier"
        p = torch.randint(0, 5000, (6 + i % 3,), generator=g).tolist()
        c = torch.randint(0, 5000, (2 + i % 4,), generator=g).tolist()
        out.append(
            Sample(
                f"t{i % 2}", f"r{i}", agent, "g", 0, p, c, [-12.0] * len(c), False, 1.0, True, 0, "stop", "x"
            )
        )
    return out


ADV = [1.0, -1.0, 0.5, -0.5, 1.2, -0.7, 0.3]


def _trainer(tiny_model_and_tokenizer, tmp_path, **kw):
    model, tok = tiny_model_and_tokenizer
    micro = kw.pop("micro_batch_size", 8)
    args = grpo_args(str(tmp_path / "trl"), max_steps=10, learning_rate=1e-2, **kw)
    return GroupGRPOTrainer(copy.deepcopy(model), tok, args, micro_batch_size=micro)


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _capture_grads(tr):
    """Record the gradients the optimizer steps with (Adam would amplify rounding noise in near-zero entries)."""
    grads = []
    step = tr.optimizer.step

    def wrapped(*a, **k):
        grads.append(
            {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}
        )
        return step(*a, **k)

    tr.optimizer.step = wrapped
    return grads


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_update_changes_every_parameter_and_agent_norms_do_not_change_the_update(
    tiny_model_and_tokenizer, tmp_path
):
    samples = _samples()
    # IS off: the fake sampling logprobs are far from the model's, which would mask every sequence
    plain = _trainer(tiny_model_and_tokenizer, tmp_path, vllm_importance_sampling_correction=False)
    measured = _trainer(tiny_model_and_tokenizer, tmp_path, vllm_importance_sampling_correction=False)
    g_plain, g_meas = _capture_grads(plain), _capture_grads(measured)
    before = _params(plain.model)
    m_plain = plain.update(samples, ADV)
    m_meas = measured.update(samples, ADV, agent_grad_norms=True)
    after_plain = _params(plain.model)
    assert [k for k in before if torch.equal(before[k], after_plain[k])] == []  # every parameter moved
    # measuring per-agent norms leaves the gradient of the real update unchanged (up to summation order)
    assert g_plain[0].keys() == g_meas[0].keys() and len(g_plain[0]) == len(before)
    for k in g_plain[0]:
        torch.testing.assert_close(g_meas[0][k], g_plain[0][k], rtol=1e-5, atol=1e-7)
    # the total gradient is the sum of the agents' gradients: triangle inequality, and both are non-zero
    gs, gv, total = m_meas["grad_norm/solver"], m_meas["grad_norm/verifier"], m_meas["grad_norm"]
    assert gs > 0 and gv > 0 and total <= gs + gv + 1e-6 and total >= abs(gs - gv) - 1e-6
    assert total == pytest.approx(m_plain["grad_norm"], rel=1e-5)
    assert m_plain["num_samples"] == 7 and m_plain["num_tokens"] == sum(
        len(s.completion_ids) for s in samples
    )
    assert plain.state.global_step == 1


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_micro_batching_gives_the_same_update_for_dapo(tiny_model_and_tokenizer, tmp_path):
    samples = _samples()
    one = _trainer(
        tiny_model_and_tokenizer, tmp_path, vllm_importance_sampling_correction=False, loss_type="dapo"
    )
    many = _trainer(
        tiny_model_and_tokenizer,
        tmp_path,
        vllm_importance_sampling_correction=False,
        loss_type="dapo",
        micro_batch_size=2,
    )
    g1, g2 = _capture_grads(one), _capture_grads(many)
    m1, m2 = one.update(samples, ADV), many.update(samples, ADV)
    assert m2["num_micro_batches"] == 4 and m1["num_micro_batches"] == 1
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
    for k in g1[0]:
        torch.testing.assert_close(g2[0][k], g1[0][k], rtol=1e-4, atol=1e-7)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_zero_advantage_samples_are_skipped_exactly_for_dapo(tiny_model_and_tokenizer, tmp_path, monkeypatch):
    samples = _samples()
    adv = [1.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]  # the verifier's three samples all 0
    kw = dict(vllm_importance_sampling_correction=False, loss_type="dapo", micro_batch_size=2)
    skip, full = (
        _trainer(tiny_model_and_tokenizer, tmp_path, **kw),
        _trainer(tiny_model_and_tokenizer, tmp_path, **kw),
    )
    monkeypatch.setattr(full, "_zero_advantage_is_free", lambda: False)
    g_skip, g_full = _capture_grads(skip), _capture_grads(full)
    m_skip = skip.update(samples, adv, agent_grad_norms=True)
    m_full = full.update(samples, adv, agent_grad_norms=True)
    assert m_skip["num_skipped_zero_advantage"] == 5 and m_full["num_skipped_zero_advantage"] == 0
    assert m_skip["num_micro_batches"] == 1 and m_full["num_micro_batches"] == 4
    # positions run through the model, padding included: kept [r0, r2] pad to 8 + 4; the full update's
    # length-sorted micro-batches [r0, r1] 7 + 3, [r3, r2] 8 + 5, [r4, r6] 7 + 4, [r5] 8 + 3
    assert m_skip["num_forward_tokens"] == 2 * 12
    assert m_full["num_forward_tokens"] == 2 * 10 + 2 * 13 + 2 * 11 + 11
    assert (
        m_skip["num_samples"] == m_full["num_samples"] == 7 and m_skip["num_tokens"] == m_full["num_tokens"]
    )
    assert m_skip["grad_norm/verifier"] == 0.0 and m_full["grad_norm/verifier"] < 1e-6
    assert m_skip["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-5) and m_skip["grad_norm"] > 0
    for k in g_full[0]:
        torch.testing.assert_close(g_skip[0][k], g_full[0][k], rtol=1e-5, atol=1e-7)
    # all zero: one sample is kept so the optimizer still steps; the gradient is exactly 0
    m0 = skip.update(samples, [0.0] * 7)
    assert m0["num_skipped_zero_advantage"] == 6 and m0["grad_norm"] == 0.0 and skip.state.global_step == 2
    # a per-sequence loss averages over rows, so a zero row changes it: nothing is skipped
    grpo = _trainer(
        tiny_model_and_tokenizer, tmp_path, vllm_importance_sampling_correction=False, loss_type="grpo"
    )
    assert grpo.update(samples, adv)["num_skipped_zero_advantage"] == 0
    beta = _trainer(tiny_model_and_tokenizer, tmp_path, vllm_importance_sampling_correction=False, beta=0.1)
    assert beta.update(samples, adv)["num_skipped_zero_advantage"] == 0


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_copies_of_one_sequence_are_trained_as_one_row_exactly(
    tiny_model_and_tokenizer, tmp_path, monkeypatch
):
    # a game revisits its states: copies of r0 (solver) and r5 (verifier) from other trajectories
    base = _samples()
    copies = [
        dataclasses.replace(base[0], traj_uid="r7", sampling_logprobs=[-11.0] * len(base[0].completion_ids)),
        dataclasses.replace(base[5], traj_uid="r8"),
        dataclasses.replace(base[0], traj_uid="r9"),
    ]
    samples = base + copies
    adv = [*ADV, 0.25, 0.7, -2.0]  # r0's row: 1.0 + 0.25 - 2.0 = -0.75; r5's: -0.7 + 0.7 = 0 (then skipped)
    kw = dict(vllm_importance_sampling_correction=False, loss_type="dapo", micro_batch_size=3)
    merged, full = (
        _trainer(tiny_model_and_tokenizer, tmp_path, **kw),
        _trainer(tiny_model_and_tokenizer, tmp_path, **kw),
    )
    monkeypatch.setattr(full, "_merging_is_exact", lambda: False)
    g_m, g_f = _capture_grads(merged), _capture_grads(full)
    m_m = merged.update(samples, adv, agent_grad_norms=True)
    m_f = full.update(samples, adv, agent_grad_norms=True)
    assert m_m["num_merged_duplicates"] == 3 and m_f["num_merged_duplicates"] == 0
    assert m_m["num_skipped_zero_advantage"] == 1 and m_f["num_skipped_zero_advantage"] == 0  # r5's sum is 0
    assert m_m["num_samples"] == m_f["num_samples"] == 10 and m_m["num_tokens"] == m_f["num_tokens"]
    assert m_m["num_forward_tokens"] < m_f["num_forward_tokens"]
    for a in ("solver", "verifier"):
        assert m_m[f"grad_norm/{a}"] == pytest.approx(m_f[f"grad_norm/{a}"], rel=1e-4)
    for k in g_f[0]:
        torch.testing.assert_close(g_m[0][k], g_f[0][k], rtol=1e-4, atol=1e-7)
    # where the loss is not linear in a row's advantage, or reads each copy's own numbers, nothing is merged
    for other in (
        {"loss_type": "grpo"},
        {"num_iterations": 2},
        {"beta": 0.1},
        {"vllm_importance_sampling_correction": True},
        {"delta": 0.9},
    ):
        tr = _trainer(tiny_model_and_tokenizer, tmp_path, **{**kw, **other})
        assert tr.update(samples, adv)["num_merged_duplicates"] == 0, other


def test_merge_duplicates_sums_the_advantages_of_a_sequences_copies():
    s = _samples(n_solver=2, n_verifier=1)
    same_ids_other_agent = dataclasses.replace(s[0], agent="verifier")
    rows, adv = merge_duplicates(
        [s[0], s[1], dataclasses.replace(s[0], traj_uid="x"), same_ids_other_agent, s[2]],
        [1.0, 2.0, 0.5, 4.0, 8.0],
        masked=lambda smp: False,
    )
    assert [r.traj_uid for r in rows] == ["r0", "r1", "r0", "r2"] and adv == [1.5, 2.0, 4.0, 8.0]
    assert rows[2].agent == "verifier"  # the same tokens by another agent are another row
    # a truncated copy left out of the loss is not the same row as one in it
    cut = dataclasses.replace(s[0], finish_reason="length")
    rows, adv = merge_duplicates([s[0], cut], [1.0, 1.0], masked=lambda smp: smp.finish_reason == "length")
    assert len(rows) == 2 and adv == [1.0, 1.0]


def _prefixed_samples(seed=0):
    """Solver and verifier samples whose prompts start with one 20-token (solver) / 24-token (verifier) prefix
    each, as the few-shot prompts do; prompt and completion lengths vary."""
    g = torch.Generator().manual_seed(seed)
    heads = {
        a: torch.randint(0, 5000, (n,), generator=g).tolist() for a, n in (("solver", 20), ("verifier", 24))
    }
    out = []
    for i in range(7):
        agent = "solver" if i < 4 else "verifier"
        p = heads[agent] + torch.randint(0, 5000, (1 + i % 3 * 2,), generator=g).tolist()
        c = torch.randint(0, 5000, (2 + i % 4,), generator=g).tolist()
        out.append(
            Sample(
                f"t{i % 2}", f"r{i}", agent, "g", 0, p, c, [-12.0] * len(c), False, 1.0, True, 0, "stop", "x"
            )
        )
    return out


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("lora", [False, True])
def test_shared_prefix_update_has_the_plain_gradient(tiny_model_and_tokenizer, tmp_path, lora, monkeypatch):
    import mas_train.grpo.update as update_module
    from mas_train.grpo.prefix import common_prefix_len

    calls = []  # the shared path must really run (one call per micro-batch of the shared trainer)
    real = update_module.prefix_logps
    monkeypatch.setattr(update_module, "prefix_logps", lambda *a, **k: calls.append(1) or real(*a, **k))

    samples = _prefixed_samples()
    assert common_prefix_len([s.prompt_ids for s in samples[:4]]) == 20
    model, tok = tiny_model_and_tokenizer

    def build(share):
        policy = copy.deepcopy(model)
        if lora:
            from mas_train import lora as L
            from mas_train.config import LoraConfig

            torch.manual_seed(0)  # the same adapter initialisation in both
            policy = L.wrap(policy, LoraConfig(r=4, alpha=8), "a")
        args = grpo_args(str(tmp_path / "trl"), max_steps=10, learning_rate=1e-2, loss_type="dapo")
        return GroupGRPOTrainer(policy, tok, args, micro_batch_size=2, share_prefix=share)

    shared, plain = build(True), build(False)
    inputs = plain.build_inputs(samples, ADV)
    # on-policy sampling logprobs (the IS ratio is 1 but its path runs)
    true = plain.completion_logps(plain.model, inputs)
    samples = [
        Sample(**{**s.__dict__, "sampling_logprobs": true[i, : len(s.completion_ids)].tolist()})
        for i, s in enumerate(samples)
    ]
    g_shared, g_plain = _capture_grads(shared), _capture_grads(plain)
    m_shared = shared.update(samples, ADV, agent_grad_norms=True)
    m_plain = plain.update(samples, ADV, agent_grad_norms=True)
    assert shared.share_prefix  # the tiny Qwen3's cache can be broadcast
    assert len(calls) == 4  # solver 4 samples + verifier 3, micro-batches of 2 per agent: 2 + 2 forwards
    assert g_shared[0].keys() == g_plain[0].keys() and g_plain[0]
    for k in g_plain[0]:
        torch.testing.assert_close(g_shared[0][k], g_plain[0][k], rtol=1e-4, atol=1e-6)
    for key in ("grad_norm", "grad_norm/solver", "grad_norm/verifier", "loss", "entropy"):
        assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-4, abs=1e-6), key
    assert m_shared["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    # the work done: each prefix once (20 + 24) and the rest of each micro-batch padded (rest of the prompt +
    # completion): solver [r0, r1] 3 + 3, [r3, r2] 5 + 5, verifier [r4, r6] 3 + 4, [r5] 5 + 3; plain: whole prompts
    assert m_shared["num_forward_tokens"] == 20 + 24 + 2 * 6 + 2 * 10 + 2 * 7 + 8
    assert m_plain["num_forward_tokens"] == 2 * (23 + 3) + 2 * (25 + 5) + 2 * (27 + 4) + (29 + 3)


def test_importance_sampling_ratio_from_sampling_logprobs(tiny_model_and_tokenizer, tmp_path):
    tr = _trainer(tiny_model_and_tokenizer, tmp_path)  # TRL default: sequence_mask, clip max 3
    samples = _samples(2, 0)
    inputs = tr.build_inputs(samples, [1.0, -1.0])
    true = tr.completion_logps(tr.model, inputs)
    on_policy = [
        Sample(**{**s.__dict__, "sampling_logprobs": true[i, : len(s.completion_ids)].tolist()})
        for i, s in enumerate(samples)
    ]
    m = tr.update(on_policy, [1.0, -1.0])
    assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["sampling/sampling_logp_difference/mean"] < 1e-4
    assert m["grad_norm"] > 0
    # sampling logprobs 2 nats below the policy on every token: the sequence ratio exp(2T) > 3 is masked out
    tr2 = _trainer(tiny_model_and_tokenizer, tmp_path)
    off = [
        Sample(**{**s.__dict__, "sampling_logprobs": [x - 2.0 for x in s.sampling_logprobs]})
        for s in on_policy
    ]
    m2 = tr2.update(off, [1.0, -1.0])
    assert m2["sampling/importance_sampling_ratio/mean"] == 0.0
    assert m2["grad_norm"] == 0.0


@pytest.mark.slow
def test_kl_term_with_beta(tiny_model_and_tokenizer, tmp_path):
    tr = _trainer(tiny_model_and_tokenizer, tmp_path, beta=0.1, vllm_importance_sampling_correction=False)
    ref_before = _params(tr.ref_model)
    m1 = tr.update(_samples(), ADV)
    m2 = tr.update(_samples(seed=1), ADV)
    assert m1["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first step
    assert m2["kl"] > 0
    ref_after = _params(tr.ref_model)
    assert all(torch.equal(ref_before[k], ref_after[k]) for k in ref_before)


def test_build_inputs_padding(tiny_model_and_tokenizer, tmp_path):
    tr = _trainer(tiny_model_and_tokenizer, tmp_path)
    s1 = Sample(
        "t", "a", "solver", "g", 0, [5, 6, 7], [8, 9], [-1.0, -2.0], False, 0.0, False, 0, "stop", "x"
    )
    s2 = Sample(
        "t", "b", "solver", "g", 0, [5], [8, 9, 10], [-1.0, -2.0, -3.0], False, 0.0, False, 0, "stop", "x"
    )
    inp = tr.build_inputs([s1, s2], [0.5, -0.5])
    pad = tr.pad_token_id
    assert inp["prompt_ids"].tolist() == [[5, 6, 7], [pad, pad, 5]]
    assert inp["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert inp["completion_ids"].tolist() == [[8, 9, pad], [8, 9, 10]]
    assert inp["completion_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert inp["sampling_per_token_logps"].tolist() == [[-1.0, -2.0, 0.0], [-1.0, -2.0, -3.0]]
    assert inp["advantages"].tolist() == [0.5, -0.5] and int(inp["num_items_in_batch"]) == 5
    with pytest.raises(ValueError, match="logprobs"):
        tr.build_inputs([Sample(**{**s1.__dict__, "sampling_logprobs": [0.0]})], [1.0])


def test_task_sampler_is_deterministic_and_resumable():
    tasks = [{"id": i} for i in range(5)]
    a = TaskSampler(tasks, seed=3)
    first = [t["id"] for t in a.next(7)]
    assert sorted(first[:5]) == [0, 1, 2, 3, 4]  # one full epoch before any repeat
    b = TaskSampler(tasks, seed=3)
    b.next(4)
    state = b.state_dict()
    c = TaskSampler(tasks, seed=3)
    c.load_state_dict(state)
    assert [t["id"] for t in c.next(3)] == first[4:7]
    with pytest.raises(ValueError, match="same seed"):
        TaskSampler(tasks, seed=4).load_state_dict(state)


# ------------------------------------------------------------------------------------------------------------
# MultiGroupTrainer: one step trains every model group
# ------------------------------------------------------------------------------------------------------------


def _multi(tmp_path, tiny_qwen3_path, sharing, **extra):
    from mas_train.config import TrainConfig

    cfg = TrainConfig.from_dict(
        dict(
            env="parity",
            model=tiny_qwen3_path,
            model_sharing=sharing,
            num_generations=2,
            tasks_per_step=2,
            max_steps=3,
            output_dir=str(tmp_path),
            run_name="run",
            learning_rate=1e-3,
            sampling={"max_new_tokens": 4},
            **extra,
        )
    )
    resolved = cfg.resolve(["solver", "verifier"])
    return assemble_trainer(resolved, env_factory=make_parity_env, train_tasks=PARITY_TASKS)


def _group_params(tr):
    return {g: _params(tr.pool.worker(g).model) for g in tr.groups}


def _changed(before, after):
    return {g: [k for k in before[g] if not torch.equal(before[g][k], after[g][k])] for g in before}


def test_one_step_trains_the_shared_group(tmp_path, tiny_qwen3_path):
    tr = _multi(tmp_path, tiny_qwen3_path, "shared")
    try:
        assert tr.groups == ["shared"]
        before = _group_params(tr)
        metrics, extra = tr.train_step()
        changed = _changed(before, _group_params(tr))
        assert len(changed["shared"]) == len(before["shared"])  # every trained parameter moved
        assert metrics["losses/group_grad_norm/shared"] > 0
        assert metrics["losses/grad_norm/solver"] > 0 and metrics["losses/grad_norm/verifier"] > 0
        assert metrics["charts/num_samples"] == 8 and len(extra["tasks"]) == 2
        assert tr.pool.worker("shared").weight_version == 1  # synced once
    finally:
        tr.close()


def test_one_step_trains_each_non_shared_group_and_skips_a_group_that_did_not_act(tmp_path, tiny_qwen3_path):
    tr = _multi(tmp_path, tiny_qwen3_path, "per_agent")
    try:
        assert tr.groups == ["solver", "verifier"]
        before = _group_params(tr)
        tr.train_step()
        after = _group_params(tr)
        changed = _changed(before, after)
        assert {g: len(v) for g, v in changed.items()} == {g: len(before[g]) for g in before}
        # the backend generates with the synced weights: its copy equals the trained policy
        w = tr.pool.worker("solver")
        gen_state = w.backend.model.state_dict()
        for k, v in w.model.state_dict().items():
            assert torch.equal(gen_state[k], v)

        # next step: the verifier never acts -> its group is skipped, untouched, without error
        tr.sampler = TaskSampler([dict(t, skip_verifier=True) for t in PARITY_TASKS], seed=0)
        metrics, _ = tr.train_step()
        assert metrics["charts/skipped/verifier"] == 1.0 and metrics["charts/skipped/solver"] == 0.0
        after2 = _group_params(tr)
        assert _changed({"verifier": after["verifier"]}, {"verifier": after2["verifier"]}) == {"verifier": []}
        assert len(_changed({"solver": after["solver"]}, {"solver": after2["solver"]})["solver"]) > 0
        assert tr.pool.worker("verifier").weight_version == 1 and tr.pool.worker("solver").weight_version == 2

        # samples generated before the last sync are refused, and the error counts them
        def sample(uid, version):
            return Sample(
                "t", uid, "solver", "solver", 0, [1, 2], [3], [-1.0], False, 0.0, False, version, "stop", "x"
            )

        solver = tr.pool.worker("solver")
        with pytest.raises(StaleSampleError) as err:
            solver.update([sample("a", 2), sample("b", 1), sample("c", 0)], [1.0, 1.0, 1.0])
        assert str(err.value) == (
            "model group 'solver': 2 of 3 samples were generated with weights older than the policy's v2 (the "
            "first: sample b turn 0, v1); collect fresh rollouts after each update"
        )
        assert (err.value.group, err.value.version, err.value.stale, err.value.checked) == ("solver", 2, 2, 3)
        again = pickle.loads(pickle.dumps(err.value))  # whole across a Ray actor's boundary
        assert (str(again), again.stale, again.checked) == (str(err.value), 2, 3)
        assert solver.updates == 2 and solver.weight_version == 2  # refused before any update
    finally:
        tr.close()


@pytest.mark.slow
def test_one_step_trains_heterogeneous_groups(tmp_path, tiny_qwen3_path):
    from mas_train.models import build_tiny_qwen3

    other = build_tiny_qwen3(
        tmp_path / "other", seed=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1
    )
    tr = _multi(tmp_path, tiny_qwen3_path, "shared", agents={"verifier": {"model": str(other)}})
    try:
        assert len(tr.groups) == 2
        sizes = {tr.pool.worker(g).num_parameters for g in tr.groups}
        assert len(sizes) == 2  # two different models
        before = _group_params(tr)
        tr.train_step()
        changed = _changed(before, _group_params(tr))
        assert {g: len(v) for g, v in changed.items()} == {g: len(before[g]) for g in before}
    finally:
        tr.close()


# -- issue: settings the update must honour -----------------------------------------------------------------------
def test_mask_truncated_completions_leaves_cut_completions_out_of_the_loss(
    tiny_model_and_tokenizer, tmp_path
):
    # Regression: the setting was accepted and did nothing (TRL applies it only in the generation path we bypass).
    cut = dataclasses.replace(_samples(1, 0)[0], finish_reason="length")
    norms = {}
    for flag in (False, True):
        tr = _trainer(tiny_model_and_tokenizer, tmp_path / str(flag), mask_truncated_completions=flag)
        inputs = tr.build_inputs([cut], [1.0])
        assert inputs["completion_mask"].sum().item() == (0 if flag else len(cut.completion_ids))
        out = tr.update([cut], [1.0])
        norms[flag] = out["grad_norm"]
        assert out["num_masked_truncated"] == float(flag)
    assert norms[False] > 0 and norms[True] == 0.0
    # a completion that stopped on its own is trained either way
    tr = _trainer(tiny_model_and_tokenizer, tmp_path / "stop", mask_truncated_completions=True)
    assert tr.update([_samples(1, 0)[0]], [1.0])["grad_norm"] > 0


def test_an_agent_named_star_is_not_trained_twice(tiny_model_and_tokenizer, tmp_path):
    # Regression: the per-agent micro-batching used "*" as its all-agents key, so an agent called "*" pulled
    # every other agent's samples into its micro-batches too.
    samples = [dataclasses.replace(s, agent="*" if s.agent == "solver" else s.agent) for s in _samples()]
    tr = _trainer(tiny_model_and_tokenizer, tmp_path, micro_batch_size=2)
    mbs = tr._micro_batches(samples, ADV, by_agent=True)
    seen = sorted(i for _, idx in mbs for i in idx)
    assert seen == list(range(len(samples)))  # every sample exactly once
    assert {a for a, _ in mbs} == {"*", "verifier"}
    assert all(samples[i].agent == a for a, idx in mbs for i in idx)
    assert [a for a, _ in tr._micro_batches(samples, ADV, by_agent=False)] == [None] * 4

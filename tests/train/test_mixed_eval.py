"""``mas-eval`` with sources mixed per agent: the solver from a trained checkpoint, the verifier a frozen agent on
an OpenAI-compatible endpoint (the local test server of tests/backends/openai_server.py, on a real socket)."""

from __future__ import annotations

import io
import json
import shutil

import pytest

pytest.importorskip("trl")

from mas_train.cli import eval_main, run_eval  # noqa: E402
from mas_train.config import parse_eval_args  # noqa: E402
from tests.backends.openai_server import OpenAITestServer  # noqa: E402

NUM_TASKS, K = 2, 2
TRAIN = [
    "--env", "math-2agent", "--model", "tiny-qwen3", "--model_sharing", "per_agent",
    "--num_generations", "2", "--tasks_per_step", "1", "--max_steps", "1", "--sampling.max_new_tokens", "4",
    "--eval_steps", "0", "--save_steps", "1", "--report_to", "jsonl", "--run_name", "mix",
]  # fmt: skip
EVAL = ["--data", "gsm8k-test", "--num_tasks", str(NUM_TASKS), "--k", str(K), "--max_new_tokens", "4"]
NORM = "model.norm.weight"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 1-step per_agent run's checkpoint, with a solver whose weights differ from the initial ones.

    The random-init tiny model never writes a valid action, so every reward is equal, every advantage 0 and one
    step leaves the weights as they were; the solver's saved weights are therefore scaled afterwards (its
    final norm weight x3), so that "the checkpoint's solver" and "the initial solver" are told apart. The
    verifier's saved weights are deleted: an agent served elsewhere must not need them.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from mas_train.config import parse_args
    from mas_train.run import train

    out = tmp_path_factory.mktemp("mixeval")
    summary = train(parse_args([*TRAIN, "--output_dir", str(out)]), progress=False)
    ckpt = out / "mix" / "checkpoints" / "step-000001"
    assert summary["checkpoint"] and ckpt.is_dir(), summary
    solver_dir = ckpt / "groups" / "solver" / "model"
    model = AutoModelForCausalLM.from_pretrained(solver_dir, dtype=torch.float32)
    with torch.no_grad():
        model.get_parameter(NORM).mul_(3.0)
    model.save_pretrained(solver_dir)
    verifier = ckpt / "groups" / "verifier"
    shutil.rmtree(verifier / "model")
    for name in ("optimizer.pt", "scheduler.pt"):
        (verifier / name).unlink()
    from mas_train.checkpoint import write_manifest

    write_manifest(ckpt)  # a hand-edited checkpoint lists its files again, or it reads as incomplete
    return ckpt, model.get_parameter(NORM).detach().clone()


@pytest.fixture
def workers_seen(monkeypatch):
    """What each model group's worker held when mas-eval shut its pool down."""
    from mas_train.hosting.pools import LocalPool

    seen: dict[str, dict] = {}
    shutdown = LocalPool.shutdown

    def spy(self):
        for g, w in self._workers.items():
            norm = w.model.get_parameter(NORM).detach().clone() if w.model is not None else None
            seen[g] = {"backend": type(w.backend).__name__, "model": w.model, "norm": norm, "usage": w.usage}
        shutdown(self)

    monkeypatch.setattr(LocalPool, "shutdown", spy)
    return seen


def _verifier_flags(srv) -> list[str]:
    return [
        "--model_groups.verifier.backend", "openai",
        "--model_groups.verifier.backend_options", f"base_url={srv.base_url},model=frozen-verifier",
        "--model_groups.verifier.backend_options.api_key_env", "null",
    ]  # fmt: skip


def _solver_answers(requests) -> list[str]:
    """The solver attempts the verifier was shown (the last user turn of each request), sorted."""
    return sorted(r.body["messages"][-1]["content"] for r in requests)


def test_solver_from_the_checkpoint_verifier_from_an_openai_endpoint(run, workers_seen):
    import torch

    ckpt, trained_norm = run
    with OpenAITestServer(reply=lambda body: "Step two is wrong. <verify>reject</verify>") as srv:
        text = io.StringIO()
        metrics = run_eval(
            parse_eval_args(["--checkpoint", str(ckpt), *EVAL, *_verifier_flags(srv)]), out=text
        )
        from_ckpt = _solver_answers(srv.requests)
        n_ckpt = len(srv.requests)
        seen_ckpt = dict(workers_seen)
        run_eval(
            parse_eval_args(["--checkpoint", str(ckpt), "--initial", *EVAL, *_verifier_flags(srv)]),
            out=io.StringIO(),
        )
        from_initial = _solver_answers(srv.requests[n_ckpt:])

    # Every reply rejects, so each episode is solver, verifier (reject), solver (max_loops 2): one verifier turn
    # per episode, NUM_TASKS * K requests, each a chat request for the endpoint's model with the verifier's
    # stop string and its own max_new_tokens.
    assert n_ckpt == NUM_TASKS * K
    bodies = [r.body for r in srv.requests[:n_ckpt]]
    assert {r.path for r in srv.requests} == {"/v1/chat/completions"}
    assert all(b["model"] == "frozen-verifier" and b["stop"] == ["</verify>"] for b in bodies)
    assert all(b["max_tokens"] == 4 and b["temperature"] == 0.6 for b in bodies)
    assert seen_ckpt["verifier"]["usage"]["requests"] == NUM_TASKS * K
    # the verdicts as scripted: all valid, none approves, every rejected attempt was wrong (the tiny model
    # writes no boxed answer), so the verifier was always right, and no rejection led to a right answer
    assert metrics["eval/invalid_rate/verifier"] == 0.0
    assert metrics["eval/env/verifier_approve_rate"] == 0.0
    assert metrics["eval/env/verifier_accuracy"] == 1.0
    assert metrics["eval/env/solver_turns"] == 2.0
    assert metrics["eval/env/rejection_fixed"] == 0.0
    assert metrics["eval/invalid_rate/solver"] == 1.0 and metrics["eval/avg@2"] == 0.0
    assert metrics["eval/num_tasks"] == NUM_TASKS
    # the solver sampled with the checkpoint's weights; the verifier loaded none (its were deleted)
    assert (
        seen_ckpt["solver"]["backend"] == "HFBackend" and seen_ckpt["verifier"]["backend"] == "OpenAIBackend"
    )
    assert seen_ckpt["verifier"]["model"] is None
    assert torch.equal(seen_ckpt["solver"]["norm"], trained_norm)
    assert not torch.equal(workers_seen["solver"]["norm"], trained_norm)  # --initial: the model's own
    assert torch.equal(workers_seen["solver"]["norm"] * 3.0, trained_norm)
    assert from_ckpt != from_initial  # ... and the verifier saw other solver attempts
    lines = text.getvalue().splitlines()
    assert "  solver (solver): the checkpoint's weights (backend hf)" in lines
    assert f"  verifier (verifier): openai endpoint {srv.base_url} (model frozen-verifier)" in lines


def test_sources_from_an_eval_config_file(run, workers_seen, tmp_path):
    """The same override as a --config eval.yaml; a reply without a verdict is an invalid verifier action (routed
    as reject, so still one verifier turn per episode)."""
    import yaml

    ckpt, _ = run
    with OpenAITestServer(reply=lambda body: "I am not sure.") as srv:
        path = tmp_path / "eval.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "checkpoint": str(ckpt),
                    "model_groups": {
                        "verifier": {
                            "backend": "openai",
                            "backend_options": {
                                "base_url": srv.base_url,
                                "model": "frozen-verifier",
                                "api_key_env": None,
                            },
                        }
                    },
                }
            )
        )
        out = tmp_path / "metrics.json"
        assert eval_main(["--config", str(path), *EVAL, "--output", str(out)]) == 0
        assert len(srv.requests) == NUM_TASKS * K
    metrics = json.loads(out.read_text())
    assert metrics["eval/invalid_rate/verifier"] == 1.0
    assert metrics["eval/env/solver_turns"] == 2.0
    assert "eval/env/verifier_approve_rate" not in metrics  # no valid verdict in any episode
    assert workers_seen["verifier"]["backend"] == "OpenAIBackend"


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--model_groups.verfier.backend", "openai"],
            "mas-eval: error: model_groups.verfier: the evaluated run has no model group 'verfier'; its groups "
            "are: solver (agents: solver); verifier (agents: verifier). Did you mean 'verifier'?",
        ),
        (
            ["--model_groups.verifier.backend", "openai"],
            "mas-eval: error: model_groups.verifier.backend_options.base_url is required",
        ),
        (
            ["--model_groups.verifier.learning_rate", "1e-5"],
            "mas-eval: error: unknown setting 'model_groups.verifier.learning_rate'. Known here: model, backend, "
            "backend_options, dtype",
        ),
        (
            ["--model_groups.verifier.backend", "openai", "--model_groups.verifier.backend_options",
             "base_url=http://127.0.0.1:9/v1,model=m,api_key_env=MAS_TEST_UNSET_KEY"],
            "mas-eval: error: model_groups.verifier: environment variable 'MAS_TEST_UNSET_KEY' "
            "(backend_options.api_key_env) is unset or empty; export the API key there, or pass "
            "--model_groups.verifier.backend_options.api_key_env null for a server without authentication",
        ),
    ],
)  # fmt: skip
def test_an_override_that_cannot_be_honoured_is_one_error_line(run, flags, line, capsys, monkeypatch):
    from mas_train.hosting.pools import LocalPool

    def no_models(self):
        raise AssertionError("a model was loaded before the error")

    monkeypatch.setattr(LocalPool, "start", no_models)
    monkeypatch.delenv("MAS_TEST_UNSET_KEY", raising=False)
    ckpt, _ = run
    assert eval_main(["--checkpoint", str(ckpt), *EVAL, *flags]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [line, "mas-eval: (run with --debug for the traceback)"]


def test_apply_sources_merges_over_the_run_config():
    """The merge rule without models: a switched kind drops the run's options of the old kind, the same kind
    merges them, a sampling-only backend makes the group frozen, and ``fresh`` names the groups whose source the
    overrides give."""
    from mas_train.config import ConfigError, parse_args

    agents = ["solver", "verifier"]
    cfg = parse_args(
        ["--env", "math-2agent", "--model", "tiny-qwen3", "--model_sharing", "per_agent"]
        + [
            "--model_groups.verifier.backend_options.max_batch_size",
            "2",
            "--agents.verifier.trainable",
            "true",
        ]
        + ["--model_groups.solver.backend_options.max_batch_size", "3"]
    )
    ev = parse_eval_args(
        ["--model_groups.verifier.backend", "openai", "--model_groups.verifier.backend_options.base_url"]
        + ["http://h:1/v1", "--model_groups.verifier.backend_options.model", "m"]
        + ["--model_groups.solver.backend_options.seed", "5"]
    )
    merged, resolved, fresh = ev.apply_sources(cfg, agents)
    v, s = resolved.model_groups["verifier"], resolved.model_groups["solver"]
    assert (v.backend, v.trainable, v.backend_options.base_url, v.backend_options.model) == (
        "openai", False, "http://h:1/v1", "m"
    )  # fmt: skip
    assert merged.agents["verifier"].trainable is None
    assert (s.backend, s.trainable, s.backend_options.max_batch_size, s.backend_options.seed) == (
        "hf",
        True,
        3,
        5,
    )
    assert fresh == {"verifier"}
    assert parse_eval_args(["--agents.solver.model", "tiny-qwen3"]).apply_sources(cfg, agents)[2] == {
        "solver"
    }
    assert parse_eval_args([]).apply_sources(cfg, agents)[2] == frozenset()
    shared = parse_args(["--env", "math-2agent", "--model", "tiny-qwen3"])  # one group "shared" for both
    with pytest.raises(ConfigError, match=r"move agents to other model groups .*'verifier': 'shared'"):
        parse_eval_args(["--agents.verifier.model", "other"]).apply_sources(shared, agents)
    with pytest.raises(
        ConfigError, match=r"no model group 'verifier'; its groups are: shared \(agents: solver, "
    ):
        parse_eval_args(["--model_groups.verifier.dtype", "float32"]).apply_sources(shared, agents)
    with pytest.raises(ConfigError, match=r"^model_groups.verifier: give at least one of model, backend"):
        parse_eval_args(["--model_groups.verifier.backend_options", "{}"])

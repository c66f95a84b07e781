"""Checkpoint / resume: a resumed run continues exactly (same next batch, same weights, same samples)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from _train_fakes import PARITY_TASKS, make_parity_env  # noqa: E402

from mas_train.assemble import assemble_trainer  # noqa: E402
from mas_train.checkpoint import find_checkpoint, list_checkpoints  # noqa: E402
from mas_train.config import TrainConfig  # noqa: E402
from mas_train.tracking import RunLogger, read_jsonl  # noqa: E402


def _trainer(tmp_path, model, run_name, **settings):
    cfg = TrainConfig.from_dict(
        dict(
            **settings,
            env="parity",
            model=model,
            num_generations=2,
            tasks_per_step=2,
            max_steps=4,
            output_dir=str(tmp_path),
            run_name=run_name,
            learning_rate=1e-3,
            sampling={"max_new_tokens": 4},
        )
    )
    return assemble_trainer(
        cfg.resolve(["solver", "verifier"]), env_factory=make_parity_env, train_tasks=PARITY_TASKS
    )


POOLED = {"task_pool": {"enabled": True}, "dynamic_sampling": {"enabled": True, "max_rounds": 2}}
RAE = {"advantage_mode": "rae"}  # its per-agent baselines carry over steps, so they must resume too


@pytest.mark.parametrize(
    "settings", [{}, POOLED, RAE], ids=["data-order", "task-pool+dynamic-sampling", "rae-baseline"]
)
def test_resume_in_process_continues_exactly(tmp_path, tiny_qwen3_path, settings):
    a = _trainer(tmp_path, tiny_qwen3_path, "a", **settings)
    try:
        a.train_step()
        ckpt = a.save_checkpoint()
        saved_baseline = a.role_baseline.state_dict() if a.role_baseline else None
        m2, extra2 = a.train_step()
        params_a = {k: v.clone() for k, v in a.pool.worker("shared").model.state_dict().items()}
    finally:
        a.close()
    assert ckpt.name == "step-000001" and find_checkpoint(tmp_path / "a") == ckpt
    b = _trainer(tmp_path, tiny_qwen3_path, "b", **settings)
    try:
        b.load_checkpoint(ckpt)
        assert b.step == 1
        assert (b.role_baseline.state_dict() if b.role_baseline else None) == saved_baseline
        assert b.pool.worker("shared").policy.trainer.state.global_step == 1
        m2b, extra2b = b.train_step()
        params_b = b.pool.worker("shared").model.state_dict()
    finally:
        b.close()
    assert extra2b["tasks"] == extra2["tasks"]  # the same next batch
    for k in ("charts/reward", "charts/tokens/solver", "charts/num_samples", "losses/loss/shared"):
        assert m2b[k] == pytest.approx(m2[k], rel=1e-5, abs=1e-7), k
    for k, v in params_a.items():
        torch.testing.assert_close(params_b[k], v, rtol=1e-5, atol=1e-6)
    if settings is RAE:  # the baselines moved on from the restored ones exactly as in the uninterrupted run
        assert saved_baseline is not None and saved_baseline["counts"] == {"solver": 4, "verifier": 4}
        for agent in ("solver", "verifier"):
            k = f"charts/advantage/baseline/{agent}"
            assert m2b[k] == m2[k] and m2[k] != saved_baseline["values"][agent], k
    elif settings:  # the pool's solve rates and draws continued too, and a run without the pool refuses it
        assert b.sampler.state_dict() == a.sampler.state_dict()
        c = _trainer(tmp_path, tiny_qwen3_path, "c")
        try:
            with pytest.raises(ValueError, match="resume with the same task_pool setting"):
                c.load_checkpoint(ckpt)
        finally:
            c.close()


def test_checkpoint_folders_are_atomic(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    (root / "step-000003.tmp-123").mkdir(parents=True)  # a save killed half-way
    (root / "step-000002").mkdir()
    (root / "step-000002" / "trainer_state.pt").write_bytes(b"")
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-000002"]
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        find_checkpoint(tmp_path / "nothing")


def _lines(run: Path) -> list[tuple[int, str, float]]:
    """(step, kind, value) per metrics.jsonl line, without the wall-clock time."""
    out = []
    for r in read_jsonl(run / "metrics.jsonl"):
        kind = "eval" if "eval/avg@2" in r else "train"
        out.append((r["step"], kind, r["eval/avg@2" if kind == "eval" else "charts/reward"]))
    return out


def test_resumed_metrics_keep_history_until_each_step_is_redone(tmp_path):
    run = tmp_path / "run"
    # The first attempt logged steps 1-4 (eval at 4), but its newest checkpoint is step 2.
    first = RunLogger(run, ["jsonl"])
    for step in (1, 2, 3, 4):
        first.log(step, {"charts/reward": step / 10})
    first.log(4, {"eval/avg@2": 0.5})
    first.close()

    # A resume from step 2 that is stopped after redoing step 3: the old step 4 lines must survive.
    stopped = RunLogger(run, ["jsonl"], resume_step=2)
    stopped.log(3, {"charts/reward": 0.33})
    stopped.close()
    assert _lines(run) == [(1, "train", 0.1), (2, "train", 0.2), (3, "train", 0.33), (4, "train", 0.4),
                           (4, "eval", 0.5)]  # fmt: skip

    # A second resume from step 2 that completes: one attempt per step, the newest, in step order.
    done = RunLogger(run, ["jsonl"], resume_step=2)
    done.log(3, {"charts/reward": 0.3})
    assert _lines(run)[2:] == [(3, "train", 0.3), (4, "train", 0.4), (4, "eval", 0.5)]
    done.log(4, {"charts/reward": 0.44})
    done.log(4, {"eval/avg@2": 0.55})
    done.log(5, {"charts/reward": 0.5})  # past the old attempt: appended
    done.close()
    assert _lines(run) == [(1, "train", 0.1), (2, "train", 0.2), (3, "train", 0.3), (4, "train", 0.44),
                           (4, "eval", 0.55), (5, "train", 0.5)]  # fmt: skip
    assert not (run / "metrics.jsonl.tmp").exists()


def _cmd():
    exe = shutil.which("mas-train", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("mas-train is not installed (pip install -e .)")
    return exe


ARGS = [
    "--env",
    "math-2agent",
    "--model",
    "tiny-qwen3",
    "--num_generations",
    "2",
    "--tasks_per_step",
    "1",
    "--sampling.max_new_tokens",
    "6",
    "--max_steps",
    "4",
    "--save_steps",
    "1",
    "--eval_steps",
    "0",
    "--report_to",
    "jsonl",
]


def _records(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    ref = subprocess.run(
        [_cmd(), *ARGS, "--output_dir", str(tmp_path), "--run_name", "ref"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]

    run = tmp_path / "killed"
    proc = subprocess.Popen(
        [_cmd(), *ARGS, "--output_dir", str(tmp_path), "--run_name", "killed"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.time() + 900
    while not list_checkpoints(run) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the run finished before it could be killed; raise max_steps"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    last = list_checkpoints(run)[-1]
    resumed_from = int(last.name.split("-")[1])
    assert resumed_from < 4

    res = subprocess.run(
        [_cmd(), *ARGS, "--output_dir", str(tmp_path), "--resume", str(run)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resumed from {last} at step {resumed_from}" in res.stdout
    got, want = _records(run), _records(tmp_path / "ref")
    assert sorted(got) == [1, 2, 3, 4]  # steps after the checkpoint were redone, not duplicated
    for step in range(resumed_from + 1, 5):
        assert got[step]["tasks"] == want[step]["tasks"], step  # the same next batch
        for k in ("charts/tokens/solver", "charts/num_samples", "charts/invalid_rate"):
            assert got[step][k] == pytest.approx(want[step][k]), (step, k)

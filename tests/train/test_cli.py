"""`mas-train` / `mas-eval` through the real commands (subprocess), plus start-up errors in-process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from mas_train.cli import train_main  # noqa: E402


def _env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def _cmd(name):
    exe = shutil.which(name, path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip(f"{name} is not installed (pip install -e .)")
    return exe


@pytest.mark.parametrize("name,expect", [("mas-train", "--num_generations"), ("mas-eval", "--checkpoint")])
def test_help_works(name, expect):
    res = subprocess.run([_cmd(name), "--help"], capture_output=True, text=True, env=_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    assert expect in res.stdout and "usage:" in res.stdout


def test_agents_sharing_a_group_with_different_learning_rates_fail_at_start_up(capsys, tmp_path):
    code = train_main(
        [
            "--env",
            "math-2agent",
            "--model",
            "tiny-qwen3",
            "--agents.solver.learning_rate",
            "1e-5",
            "--agents.verifier.learning_rate",
            "2e-5",
            "--output_dir",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "share model group" in err and "learning_rate" in err and "solver=1e-05" in err
    assert not any(tmp_path.iterdir())  # failed before creating the run or loading a model


def test_bad_flag_is_a_clear_error(capsys):
    assert train_main(["--num_generation", "4"]) == 2
    assert "num_generations" in capsys.readouterr().err  # close-match suggestion


TINY = [
    "--env",
    "math-2agent",
    "--model",
    "tiny-qwen3",
    "--num_generations",
    "2",
    "--tasks_per_step",
    "1",
    "--sampling.max_new_tokens",
    "4",
    "--eval_sampling.max_new_tokens",
    "4",
    "--eval_num_tasks",
    "1",
    "--eval_k",
    "2",
]


def test_tiny_end_to_end_train_then_eval(tmp_path):
    res = subprocess.run(
        [_cmd("mas-train"), *TINY, "--max_steps", "2", "--save_steps", "1", "--eval_steps", "2"]
        + ["--output_dir", str(tmp_path), "--run_name", "e2e"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "e2e"
    assert "mas-train finished 2 steps" in res.stdout and str(run) in res.stdout
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "charts/reward" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert 0.0 <= r["charts/reward"] <= 1.0 and 0.0 <= r["charts/invalid_rate"] <= 1.0
        # a random-weight model scores 0 everywhere, so advantages (and the gradient) may be 0; the keys exist
        assert (
            r["losses/group_grad_norm/shared"] >= 0
            and r["charts/skipped/shared"] == 0
            and len(r["tasks"]) == 1
        )
        # the Lemma 4.2 statistics and the LLD probe are logged every step for every agent (null where
        # undefined: flat rewards, no success)
        assert {
            "lemma/factor/solver",
            "lemma/noise_share/verifier",
            "lemma/defined_frac/verifier",
            "lld/success_logp/solver",
        } <= set(r)
    evals = [r for r in records if "eval/avg@2" in r]
    assert [r["step"] for r in evals] == [0, 2] and "eval/gsm8k/pass@2" in evals[0]  # step 0: before training
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["step-000001", "step-000002"]
    model_dir = run / "checkpoints" / "step-000002" / "groups" / "shared" / "model"
    assert (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file()
    assert any((run / "tb").iterdir())
    # what the agents said: a sample of each step (log_episodes, default 4 > the step's 2) and each evaluation
    from mas_train.episodes import read_episodes

    episodes = read_episodes(run / "rollouts")
    assert [p.name for p in sorted((run / "rollouts").iterdir())] == [
        f"step-00000{i}.jsonl" for i in range(3)
    ]
    assert [(r["kind"], r["step"]) for r in episodes] == [("eval", 0), ("train", 1), ("train", 1)] + [
        ("train", 2),
        ("train", 2),
        ("eval", 2),
    ]
    assert (run / "report.html").is_file() and f"report:       {run / 'report.html'}" in res.stdout

    out = tmp_path / "eval.json"
    res = subprocess.run(
        [_cmd("mas-eval"), "--checkpoint", str(run), "--data", "gsm8k-test", "--num_tasks", "2", "--k", "2"]
        + ["--max_new_tokens", "4", "--output", str(out)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads(out.read_text())
    assert metrics["eval/num_tasks"] == 2 and 0.0 <= metrics["eval/avg@2"] <= metrics["eval/pass@2"] <= 1.0
    # --output also writes every episode (2 tasks x k=2), as mas-train's records, at the checkpoint's step
    recs = read_episodes(tmp_path / "eval.episodes.jsonl")
    assert [(r["kind"], r["step"], r["sample"]) for r in recs] == [("eval", 2, 0), ("eval", 2, 1)] * 2
    assert len({r["task_id"] for r in recs}) == 2 and "4 episodes written to" in res.stdout


def test_help_for_resume_names_every_accepted_form(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option, so the help text is matched whole
    with pytest.raises(SystemExit) as exc:
        train_main(["--help"])
    assert exc.value.code == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.lstrip().startswith("--resume"))
    assert "checkpoint folder (runs/<run>/checkpoints/step-N)" in line
    assert "a run folder (its newest checkpoint)" in line
    assert "'latest' (the newest checkpoint of any run under --output_dir)" in line


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_resuming_a_finished_run_says_so_and_touches_nothing(capsys, tmp_path):
    import torch

    from mas_train.config import parse_args

    # A run that reached max_steps=2: its last checkpoint, config and logs, as mas-train leaves them.
    run = tmp_path / "done"
    ckpt = run / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    cfg = parse_args([*TINY, "--max_steps", "2", "--output_dir", str(tmp_path), "--run_name", "done"])
    cfg.to_yaml(ckpt / "config.yaml")
    torch.save({"step": 2}, ckpt / "trainer_state.pt")
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 2, "eval/avg@2": 0.0}\n')
    (run / "complete.json").write_text(
        '{"step": 2}\n'
    )  # written last, once the final evaluation and plots are done
    (run / "tb").mkdir()
    before = _tree(tmp_path)

    code = train_main([*TINY, "--max_steps", "2", "--output_dir", str(tmp_path), "--resume", "latest"])

    out = capsys.readouterr().out
    assert code == 0
    assert out == (
        f"mas-train: run {run} is already complete at step 2 (max_steps 2); raise --max_steps to train further\n"
    )
    assert _tree(tmp_path) == before  # no eval re-run, no new metrics line, no new events file


def test_status_lines_go_through_the_bar_and_library_bars_stay_quiet(capfd, tmp_path, monkeypatch):
    import io

    import mas_train.run as trainer

    monkeypatch.setattr(trainer, "_is_terminal", lambda stream: True)  # the live bar of a terminal

    from transformers.utils import logging as hf_logging

    from mas_train.cli import run_training
    from mas_train.config import parse_args

    cfg = parse_args(
        [*TINY, "--max_steps", "2", "--save_steps", "1", "--eval_steps", "2", "--report_to", "jsonl"]
        + ["--output_dir", str(tmp_path), "--run_name", "st"]
    )
    out = io.StringIO()
    run_training(cfg, progress=True, out=out)
    status = [x for x in out.getvalue().splitlines() if x.endswith("…")]
    assert status == [
        "  loading models…",
        "  evaluating on 1 tasks × k=2 before training (step 0)…",
        "  saving checkpoint step-000001…",
        "  saving checkpoint step-000002…",
        "  evaluating on 1 tasks × k=2 at step 2…",
    ]
    assert any(x.startswith("  ready in ") and x.endswith("step 1 starts with the first rollout") for x in
               out.getvalue().splitlines())  # fmt: skip
    err = capfd.readouterr().err
    assert "mas-train: 100%" in err  # our bar was drawn (stderr) ...
    assert (
        "Writing model shards" not in err and "Loading weights" not in err
    )  # ... and transformers' were not
    assert hf_logging.is_progress_bar_enabled()  # switched back on after each save / load


def test_time_off_the_clock_is_left_out_of_the_bar_rate():
    import io
    import time

    from tqdm import tqdm

    from mas_train.progress import off_the_clock as _off_the_clock

    bar = tqdm(total=4, file=io.StringIO(), mininterval=0)
    bar.update(1)
    with _off_the_clock(bar):
        time.sleep(0.5)  # an eval
    bar.update(1)
    elapsed = bar.format_dict["elapsed"]
    bar.close()
    assert elapsed < 0.25  # without the shift it would be >= 0.5 s


def test_evaluation_shows_a_bar_over_its_tasks(capsys):
    """A 50-task evaluation ran minutes without a sign of life (issue 28.12): evaluate's per-batch progress
    callback now drives a bar over the tasks."""
    from mas_train.eval import evaluate
    from mas_train.progress import eval_progress

    class Batch:
        def __init__(self, tasks, k):
            self.trajectories = [
                type("T", (), {"task_uid": str(t["id"]), "success": True, "data_source": "s", "team_reward": 1.0,
                               "metrics": {}})()
                for t in tasks
                for _ in range(k)
            ]  # fmt: skip
            self.samples = []

    class Collector:
        def collect(self, tasks, k, **_):
            return Batch(tasks, k)

    tasks = [{"id": i} for i in range(20)]
    with eval_progress(len(tasks), 4) as tick:
        out = evaluate(Collector(), tasks, k=4, tasks_per_batch=8, progress=tick, exact=False)
    err = capsys.readouterr().err
    assert out["eval/avg@4"] == 1.0 and out["eval/num_tasks"] == 20.0
    assert "eval (k=4)" in err and "8/20" in err and "16/20" in err  # then cleared (leave=False)
    with eval_progress(len(tasks), 4, enabled=False) as tick:
        assert tick is None

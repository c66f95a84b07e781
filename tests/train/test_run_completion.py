"""A run is complete only when its final evaluation and plots are done: a run killed during its final evaluation
resumes into exactly that evaluation; Ctrl-C names the run folder to resume; a resumed run's summary counts the
steps it ran; a log file gets each step's line once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from mas_train.cli import train_main  # noqa: E402
from mas_train.tracking import read_jsonl  # noqa: E402

TINY = [
    "--model", "tiny-qwen3", "--num_generations", "2", "--tasks_per_step", "1",
    "--sampling.max_new_tokens", "6", "--eval_k", "1", "--eval_num_tasks", "1", "--report_to", "jsonl",
]  # fmt: skip


def _eval_steps(run: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "eval/avg@1" in r]


def test_a_run_killed_during_its_final_evaluation_resumes_into_it(tmp_path, monkeypatch, capsys):
    # Regression: the last checkpoint is written before the final evaluation and completeness was judged by the
    # step count alone, so `--resume` of a run killed there said "already complete" and the evaluation was lost.
    from mas_train.checkpoint import completed_step
    from mas_train.trainer import MultiGroupTrainer

    real_evaluate = MultiGroupTrainer.evaluate

    def killed_at_the_end(self, *args, **kwargs):
        if self.step == self.cfg.max_steps:
            raise KeyboardInterrupt  # Ctrl-C (or a kill) in the middle of the final evaluation
        return real_evaluate(self, *args, **kwargs)

    monkeypatch.setattr(MultiGroupTrainer, "evaluate", killed_at_the_end)
    run = tmp_path / "r"
    argv = [*TINY, "--max_steps", "1", "--eval_steps", "1", "--output_dir", str(tmp_path), "--run_name", "r"]
    assert train_main(argv) == 130
    err = capsys.readouterr().err
    # the Ctrl-C message gives the real folder, not "--resume <run folder>"
    assert err.strip().splitlines()[-1] == (
        f"mas-train: interrupted; continue from its last checkpoint (step-000001) with --resume {run}"
    )
    assert _eval_steps(run) == [0] and completed_step(run) is None and not (run / "plots").exists()
    assert not (run / "trl").exists()  # transformers' empty Trainer output folder is not left behind

    monkeypatch.setattr(MultiGroupTrainer, "evaluate", real_evaluate)
    assert train_main(["--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"mas-train: run {run} trained to step 1 but did not finish its final evaluation: running it now"
    )
    assert "  ready in " in out and "; the final evaluation of step 1 starts" in out
    assert "mas-train finished the run at step 1 (its final evaluation and plots)" in out
    assert "online check" not in out  # no step ran, no sample was checked
    assert _eval_steps(run) == [0, 1] and completed_step(run) == 1
    assert (run / "plots" / "reward.png").is_file()
    assert len(list((run / "checkpoints").iterdir())) == 1  # no training step, no new checkpoint

    assert train_main(["--resume", str(run)]) == 0
    assert "is already complete at step 1" in capsys.readouterr().out
    assert _eval_steps(run) == [0, 1]

    # killed after the final evaluation was logged but before the plots: only the plots are drawn, no model loads
    (run / "complete.json").unlink()
    for p in (run / "plots").iterdir():
        p.unlink()
    assert train_main(["--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "did not finish (its plots): drawing them now" in out and "loading models" not in out
    assert (
        (run / "plots" / "reward.png").is_file() and completed_step(run) == 1 and _eval_steps(run) == [0, 1]
    )

    # a resumed run's summary counts the steps it ran, not the run's step
    assert train_main(["--resume", str(run), "--max_steps", "2", "--eval_steps", "0"]) == 0
    out = capsys.readouterr().out
    assert "mas-train finished 1 step (resumed at step 1, now at step 2) in " in out
    assert completed_step(run) == 2
    # ... and the samples of that step it checked; the resumed backend's first sync is the checkpoint's weights
    step2 = next(r for r in read_jsonl(run / "metrics.jsonl") if r["step"] == 2 and "charts/reward" in r)
    assert f"  online check: {int(step2['charts/num_samples'])} samples checked, 0 refused as stale" in out
    assert (step2["weights/trained_at_version/shared"], step2["weights/stale_samples/shared"]) == (1.0, 0.0)


def test_ctrl_c_before_the_first_checkpoint_and_the_openai_start_up_line(tmp_path, monkeypatch, capsys):
    import mas_train.run as trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "assemble_trainer", interrupted)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    argv = [*TINY, "--model_groups.shared.backend", "openai", "--model_groups.shared.trainable", "false"]
    argv += ["--model_groups.shared.backend_options", "base_url=http://127.0.0.1:9/v1,model=served-name"]
    argv += ["--max_steps", "1", "--output_dir", str(tmp_path), "--run_name", "o"]
    assert train_main(argv) == 130
    captured = capsys.readouterr()
    # the start-up line names the endpoint that samples, not the local model whose tokenizer counts tokens
    assert (
        "  model group 'shared': openai endpoint http://127.0.0.1:9/v1 (model served-name) samples for solver, "
        "verifier"
    ) in captured.out.splitlines()
    assert captured.err.strip() == (
        f"mas-train: interrupted before its first checkpoint, so there is nothing to resume in {tmp_path / 'o'}"
    )


def test_a_log_file_gets_each_step_once(tmp_path, capfd):
    # Regression: in a non-tty log the bar's last line was printed three times (redrawn around each status line
    # and at close).
    assert train_main([*TINY, "--max_steps", "2", "--eval_steps", "2", "--save_steps", "1",
                       "--output_dir", str(tmp_path), "--run_name", "log"]) == 0  # fmt: skip
    captured = capfd.readouterr()
    lines = captured.out.splitlines()
    steps = [x for x in lines if x.startswith("  step ")]
    assert [x.split(":")[0] for x in steps] == ["  step 1/2", "  step 2/2"]
    assert all(" R=" in x and x.endswith(" s)") for x in steps)
    assert "\r" not in captured.err and "mas-train: 100%" not in captured.err
    status = [x for x in lines if x.endswith("…") or x.startswith("  step ")]
    assert status == [
        "  loading models…",
        "  evaluating on 1 tasks × k=1 before training (step 0)…",
        steps[0],
        "  saving checkpoint step-000001…",
        steps[1],
        "  saving checkpoint step-000002…",
        "  evaluating on 1 tasks × k=1 at step 2…",
    ]
    assert json.loads((tmp_path / "log" / "complete.json").read_text()) == {"step": 2}

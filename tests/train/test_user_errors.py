"""User mistakes end mas-train / mas-eval with one ``error:`` line and exit 2, before any model is loaded; a
resumed run continues the saved run's settings, applies the changes it can and refuses the others; the
evaluation during training and ``mas-eval --checkpoint`` are the same evaluation."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")

from mas_train.cli import eval_main, train_main  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = [
    "--model", "tiny-qwen3", "--num_generations", "2", "--tasks_per_step", "1",
    "--sampling.max_new_tokens", "6", "--eval_k", "2", "--eval_num_tasks", "1", "--report_to", "jsonl",
]  # fmt: skip


def _run(fn, argv, capsys):
    t0 = time.perf_counter()
    code = fn(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err, time.perf_counter() - t0


def _assert_user_error(code, out, err, seconds, *needles, prog="mas-train"):
    assert code == 2, (out, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err and "loading models" not in out
    for n in needles:
        assert n in lines[0], lines[0]
    assert seconds < 10


@pytest.fixture
def bad_files(tmp_path):
    no_question = tmp_path / "noq.jsonl"
    no_question.write_text(json.dumps({"text": "1+1?", "label": "2"}) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(
        json.dumps({"question": "1+1?", "answer": "2"}) + '\n{"question": "2+2?", "answer": 4\n'
    )
    return {
        "noq": str(no_question),
        "empty": str(empty),
        "broken": str(broken),
        "missing": str(tmp_path / "missing.jsonl"),
    }


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--env", "math-3agent"], ["math-3agent"]),
        (["--env_kwargs.max_loop", "3"], ["max_loop", "env_kwargs"]),
        (["--eval_data", "{missing}"], ["missing.jsonl"]),
        (["--train_data", "{noq}"], ["data_fields"]),
        (["--train_data", "{empty}"], ["empty.jsonl is empty"]),
        (["--train_data", "{broken}"], ["broken.jsonl, line 2: not valid JSON"]),
        (["--eval_data", "{broken}"], ["eval_data", "broken.jsonl, line 2"]),
        (["--train_data", "gsm8k-trian"], ["did you mean 'gsm8k-train'"]),
        (["--max_steps", "ten"], ["max_steps"]),
        (["--grpo.repetition_penalty", "1.1"], ["repetition_penalty"]),
        (["--grpo.loss_type", "foo"], ["grpo.loss_type must be one of", "'foo'"]),
        (["--model", "does-not/exist"], ["'does-not/exist' is not a builtin", "hf download does-not/exist"]),
        (["--model", "{missing_dir}"], ["no such folder"]),
        (["--model", "tiny-qwen"], ["did you mean 'tiny-qwen3'?"]),
        (
            ["--model_sharing", "per_agent", "--agent_models", "solver=Qwen/Qwen3-4B,verifier=tiny-qwen3"],
            ["model group 'solver' (solver)", "Qwen/Qwen3-4B", "not in the local Hugging Face cache"],
        ),
        (
            ["--model", "tiny-qwen3", "--model_groups.shared.backend", "openai"]
            + ["--model_groups.shared.trainable", "false"]
            + [
                "--model_groups.shared.backend_options",
                "base_url=http://127.0.0.1:9/v1,model=m,api_key_env=OPENAI_API_KEY",
            ],
            ["OPENAI_API_KEY", "api_key_env"],
        ),
        (["--num_generations", "1"], ["num_generations must be >= 2"]),
        (["--trainable", "false", "--lora.r", "8"], ["every model group is frozen"]),
    ],
    ids=[
        "unknown-env",
        "bad-env-kwarg",
        "missing-eval-data",
        "no-question-column",
        "empty-file",
        "broken-jsonl-line",
        "broken-eval-jsonl-line",
        "misspelled-set-name",
        "bad-type",
        "unhonoured-grpo",
        "bad-loss-type",
        "hub-model-not-there",
        "local-model-folder-not-there",
        "mistyped-builtin",
        "readme-agent-models-offline",
        "openai-without-key",
        "one-generation",
        "lora-on-frozen-run",
    ],
)
def test_user_mistakes_are_one_error_line_before_any_model_loads(
    argv, needles, bad_files, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    bad_files = {**bad_files, "missing_dir": str(tmp_path / "no-model-here")}
    argv = [a.format(**bad_files) for a in argv] + ["--output_dir", str(tmp_path / "runs")]
    _assert_user_error(*_run(train_main, argv, capsys), *needles)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("checkpoints"))


def test_debug_shows_the_traceback(capsys):
    code, _, err, _ = _run(train_main, ["--env", "math-3agent", "--debug"], capsys)
    assert code == 2 and "Traceback" in err and "mas-train: error:" in err


def test_custom_env_without_eval_data_fails_fast_naming_eval_data(monkeypatch, tmp_path, capsys):
    # Regression: it trained, checkpointed, then died with a bare ValueError traceback at its first evaluation.
    monkeypatch.syspath_prepend(str(EXAMPLES))
    argv = ["--env", "custom_env:echo-2agent", "--output_dir", str(tmp_path)]
    _assert_user_error(*_run(train_main, argv, capsys), "has no evaluation set: set eval_data")
    # with evaluation off it is a valid run (checked up to the start-up plan, no model needed)
    from mas_train.config import parse_args
    from mas_train.startup import prepare

    plan = prepare(parse_args([*argv, "--eval_steps", "0"]))
    assert plan.eval_tasks is None and [t["answer"] for t in plan.train_tasks] == ["blue", "yes"]


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--num_tasks", "-1"], ["num_tasks"]),
        (["--tasks_per_batch", "0"], ["tasks_per_batch"]),
        (["--initial"], ["--checkpoint"]),
        (["--checkpoint", "{missing}"], ["--checkpoint", "missing", "not a checkpoint folder"]),
        (["--checkpoint", "latest", "--output_dir", "{missing}"], ["--checkpoint latest: no checkpoint"]),
        (["--data", "{noq}"], ["data_fields"]),
        (["--data", "{broken}"], ["broken.jsonl, line 2: not valid JSON"]),
        (["--data", "{empty}"], ["empty.jsonl is empty"]),
        (["--model", "{missing_dir}"], ["no such folder"]),
    ],
    ids=[
        "negative-num-tasks",
        "zero-tasks-per-batch",
        "initial-without-checkpoint",
        "no-checkpoint",
        "no-checkpoint-latest",
        "no-question",
        "broken-jsonl-line",
        "empty-file",
        "local-model-folder-not-there",
    ],
)
def test_mas_eval_mistakes_are_one_error_line(argv, needles, bad_files, capsys, tmp_path):
    bad_files = {**bad_files, "missing_dir": str(tmp_path / "no-model-here")}
    given = "--checkpoint" in argv or "--model" in argv
    argv = [a.format(**bad_files) for a in argv] + ["--model", "tiny-qwen3"] * (not given)
    if "--initial" in argv:
        argv.remove("--model")
        argv.remove("tiny-qwen3")
    code, out, err, seconds = _run(eval_main, argv, capsys)
    _assert_user_error(code, out, err, seconds, *needles, prog="mas-eval")
    assert "--resume" not in err  # mas-eval has no --resume flag


# -- one run, resumed and evaluated -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 1-step tiny run with a non-default env setting, evaluated at step 0 and 1, checkpointed."""
    out = tmp_path_factory.mktemp("runs")
    argv = [*TINY, "--env_kwargs.max_loops", "1", "--max_steps", "1", "--eval_steps", "1"]
    assert train_main([*argv, "--output_dir", str(out), "--run_name", "r"]) == 0
    return out / "r"


def test_resume_alone_continues_a_non_default_run(tiny_run, capsys):
    # Regression: --resume RUN built the default config and refused ("made with env_kwargs ... but this run has").
    code, out, err, _ = _run(train_main, ["--resume", str(tiny_run)], capsys)
    assert code == 0 and "already complete at step 1" in out, err


def test_resume_refuses_an_optimisation_change(tiny_run, capsys):
    # Regression: a new --learning_rate was recorded in config.yaml while the optimizer kept the old one.
    code, out, err, sec = _run(train_main, ["--resume", str(tiny_run), "--learning_rate", "0.5"], capsys)
    _assert_user_error(code, out, err, sec, "learning_rate")
    code, out, err, sec = _run(
        train_main, ["--resume", str(tiny_run), "--model", "smollm2-135m-instruct"], capsys
    )
    _assert_user_error(code, out, err, sec, "model")
    code, out, err, sec = _run(train_main, ["--resume", str(tiny_run), "--advantage_mode", "grpo"], capsys)
    _assert_user_error(code, out, err, sec, "advantage_mode")


def test_mas_eval_of_the_last_checkpoint_reproduces_the_last_training_eval(tiny_run, tmp_path, capsys):
    # Regression: training evaluated with eval_sampling, mas-eval with the training sampling: other numbers.
    records = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/avg@2" in r]
    assert [r["step"] for r in evals] == [0, 1]  # before the first update, and at the end
    out_file = tmp_path / "eval.json"
    # no --num_tasks / --k: the run's own evaluation settings (it evaluated 1 task x k=2; the env's set has more)
    code = eval_main(["--checkpoint", str(tiny_run), "--output", str(out_file)])
    assert code == 0
    assert "on 1 tasks of the env eval set, k=2" in capsys.readouterr().out
    got = json.loads(out_file.read_text())
    for key in ("eval/avg@2", "eval/pass@2", "eval/reward", "eval/invalid_rate"):
        assert got[key] == evals[-1][key], key
    # --initial: the run's configuration with its initial weights reproduces the step-0 evaluation
    code = eval_main(
        [
            "--checkpoint",
            str(tiny_run),
            "--initial",
            "--num_tasks",
            "1",
            "--k",
            "2",
            "--output",
            str(out_file),
        ]
    )
    assert code == 0
    got = json.loads(out_file.read_text())
    for key in ("eval/avg@2", "eval/reward", "eval/invalid_rate"):
        assert got[key] == evals[0][key], key


def test_resume_with_more_steps_records_the_change(tiny_run, capsys):
    code, out, err, _ = _run(
        train_main, ["--resume", str(tiny_run), "--max_steps", "2", "--eval_steps", "0"], capsys
    )
    assert code == 0, err
    assert "resumed with max_steps changed: 1 -> 2" in out
    history = [json.loads(x) for x in (tiny_run / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["step"] == 1 and history[-1]["changes"]["max_steps"] == [1, 2]
    from mas_train.config import TrainConfig

    assert TrainConfig.from_yaml(tiny_run / "config.yaml").max_steps == 2


def test_a_dead_retriever_url_is_a_start_up_warning_not_an_error():
    # Regression: retrieval errors were visible only in transcripts; nothing said at start-up that the URL is down.
    pytest.importorskip("faiss")
    from mas_train.config import parse_args
    from mas_train.startup import prepare

    url = "http://127.0.0.1:9/retrieve"  # the discard port: nothing listens there
    plan = prepare(parse_args(["--env", "search-3agent", "--env_kwargs.retriever", url, "--eval_steps", "0"]))
    assert len(plan.warnings) == 1 and "127.0.0.1:9" in plan.warnings[0]
    assert prepare(parse_args(["--env", "search-3agent", "--eval_steps", "0"])).warnings == []


def test_training_rows_never_hold_an_evaluation_question():
    # Two seeds of a small procedural generator repeat questions: the start-up drops them from training.
    from mas_train.config import parse_args
    from mas_train.startup import prepare

    spec = "rg:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=1&operators=+,-"
    argv = ["--train_data", f"{spec}&size=500&seed=1", "--eval_data", f"{spec}&size=50&seed=1001"]
    plan = prepare(parse_args([*argv, "--eval_num_tasks", "50"]))
    held_out = {r["question"] for r in plan.eval_tasks}
    assert len(plan.eval_tasks) == 50 and 0 < len(plan.train_tasks) < 500
    # the count is a start-up banner line, not a Python warning
    dropped = 500 - len(plan.train_tasks)
    assert plan.warnings == [
        f"dropped {dropped} of 500 training rows whose question is also in the evaluation set "
        "(train and eval must not overlap)"
    ]
    assert not any(r["question"] in held_out for r in plan.train_tasks)

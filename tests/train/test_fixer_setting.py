"""math-fixer's laptop setting: a plain run trains it, and examples/math_fixer_cpu.yaml is that run written out."""

from __future__ import annotations

from pathlib import Path

from mas_train.config import LAPTOP_DEFAULTS, TrainConfig, config_diff, parse_args

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math_fixer_cpu.yaml"


def test_plain_fixer_run_is_its_written_out_example():
    plain = parse_args(["--env", "math-fixer"])
    example = TrainConfig.from_yaml(EXAMPLE)
    # the example restates TRL's grpo defaults, as math_2agent_cpu.yaml does; everything else is equal
    assert config_diff(plain, example) == {
        "grpo.loss_type": (None, "dapo"),
        "grpo.epsilon": (None, 0.2),
        "grpo.beta": (None, 0.0),
    }
    assert plain.env == "math-fixer" and plain.env_kwargs == {"prompt_style": "fewshot"}
    assert plain.train_data == LAPTOP_DEFAULTS["math-2agent"]["train_data"]
    assert (plain.num_generations, plain.tasks_per_step, plain.max_steps) == (8, 2, 14)
    # naming tasks leaves the laptop setting: the env's own data and paper prompts
    paper = parse_args(["--env", "math-fixer", "--train_data", "gsm8k-train"])
    assert paper.env_kwargs == {} and paper.eval_data is None

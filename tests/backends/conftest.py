"""Fixtures shared by the SGLang fake-backend tests: one fake runtime per module, reset before each test."""

import pytest
import torch

from tests.backends.fake_sglang import FakeRuntime


@pytest.fixture(scope="module")
def model_path(tiny_qwen3_path):
    """The tiny Qwen3 test model folder the fakes generate with."""
    return tiny_qwen3_path


@pytest.fixture(scope="module")
def runtime(model_path):
    torch.set_num_threads(1)
    return FakeRuntime(model_path, random_seed=0)


@pytest.fixture
def fresh_runtime(runtime, model_path):
    """The shared runtime with its original weights and an empty call log (tests mutate weights)."""
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    runtime.model.load_state_dict(original)
    runtime.calls.clear()
    runtime.released = False
    yield runtime
    runtime.model.load_state_dict(original)


def pytest_terminal_summary(terminalreporter):
    """The numbers the real-vLLM tests measured (start-up, sync bytes and seconds, logprob agreement)."""
    import sys

    lines = [
        line for name, mod in list(sys.modules.items()) if name.endswith("test_vllm") for line in mod.REPORT
    ]
    if lines:
        terminalreporter.section("vLLM measurements")
        for line in lines:
            terminalreporter.write_line(line)

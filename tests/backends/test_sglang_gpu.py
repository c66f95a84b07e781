"""The SGLang backends against the real ``sglang`` on a CUDA GPU (run by ``scripts/gpu_check.sh``).

Skipped unless CUDA and ``sglang`` are both available. Never run while this project was written (no GPU was
available); the checks mirror the fake-based tests and add the two facts only real SGLang can confirm:
``output_ids`` include the EOS token and ``output_token_logprobs`` line up 1:1 with them, and logprobs agree
with a teacher-forced Hugging Face recomputation.
"""

from __future__ import annotations

import importlib.util
import os
import socket

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("sglang") is None,
        reason="needs a CUDA GPU and sglang (pip install 'mas-rl[gpu]')",
    ),
]

# SmolLM2 (llama architecture, head_dim 64) is served by SGLang's standard kernels; override with a local folder.
MODEL = os.environ.get("MAS_GPU_TEST_MODEL", "smollm2-135m-instruct")


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from mas_train.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(MODEL, dtype="bfloat16", device="cuda")
    return model, tok


@pytest.fixture(scope="module")
def engine_backend(model_and_tokenizer):
    from mas_train.backends.sglang import SGLangEngineBackend
    from mas_train.models import resolve_model_path

    model, tok = model_and_tokenizer
    backend = SGLangEngineBackend(
        resolve_model_path(MODEL),
        tokenizer=tok,
        mem_fraction_static=0.3,
        random_seed=0,
        enable_memory_saver=importlib.util.find_spec("torch_memory_saver") is not None,
        model_config=model.config,
        engine_kwargs={"dtype": "bfloat16"},
    )
    yield backend
    backend.close()


def _prompt(tok):
    msgs = [{"role": "user", "content": "What is 2 + 3? Answer with <answer>...</answer>."}]
    return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_real_engine_round_trip_and_logprobs(engine_backend, model_and_tokenizer):
    from mas_train.backends.base import SamplingParams

    model, tok = model_and_tokenizer
    prompt = list(_prompt(tok))
    out = engine_backend.generate([prompt], SamplingParams(max_new_tokens=64, temperature=1.0, seed=0))[0]
    assert len(out.completion_ids) == len(out.logprobs) > 0
    if out.finish_reason == "stop" and out.stop_string is None:
        assert out.completion_ids[-1] in {tok.eos_token_id, *(model.generation_config.eos_token_id or [])}
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.completion_ids], device="cuda")).logits.float()
    lp = torch.log_softmax(logits[0, len(prompt) - 1 : -1], -1)
    ref = lp.gather(1, torch.tensor(out.completion_ids, device="cuda")[:, None])[:, 0].cpu()
    # bf16 engine vs bf16 HF: expect small, not zero, differences
    assert (ref - torch.tensor(out.logprobs)).abs().mean() < 0.1


def test_real_engine_stop_string(engine_backend, model_and_tokenizer):
    from mas_train.backends.base import SamplingParams

    _, tok = model_and_tokenizer
    out = engine_backend.generate(
        [list(_prompt(tok))], SamplingParams(max_new_tokens=128, temperature=0.0, stop=("</answer>",))
    )[0]
    text = tok.decode(out.completion_ids)
    if "</answer>" in text:  # the model used the tag: generation must end on the token that completed it
        assert out.stop_string == "</answer>" and out.finish_reason == "stop"
        assert "</answer>" not in tok.decode(out.completion_ids[:-1])
    else:
        assert out.stop_string is None


def test_real_engine_weight_sync_changes_output(engine_backend, model_and_tokenizer):
    from mas_train.backends.base import SamplingParams

    model, tok = model_and_tokenizer
    prompt = [list(_prompt(tok))]
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    before = engine_backend.generate(prompt, greedy)[0]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    noisy = {k: v + 0.05 * torch.randn_like(v) if v.ndim == 2 else v for k, v in state.items()}
    version = engine_backend.update_weights(noisy)
    after = engine_backend.generate(prompt, greedy)[0]
    assert after.weight_version == version == before.weight_version + 1
    assert after.completion_ids != before.completion_ids
    engine_backend.update_weights(state)  # restore
    assert engine_backend.generate(prompt, greedy)[0].completion_ids == before.completion_ids


def test_real_engine_sleep_wake(engine_backend, model_and_tokenizer):
    from mas_train.backends.base import SamplingParams

    if not engine_backend.enable_memory_saver:
        pytest.skip("torch_memory_saver not installed")
    _, tok = model_and_tokenizer
    free_before = torch.cuda.mem_get_info()[0]
    engine_backend.sleep()
    assert torch.cuda.mem_get_info()[0] > free_before
    engine_backend.wake()
    assert engine_backend.generate([list(_prompt(tok))], SamplingParams(max_new_tokens=4))[0].completion_ids


def test_real_http_server(model_and_tokenizer):
    from mas_train.backends.base import SamplingParams
    from mas_train.backends.sglang import SGLangHTTPBackend
    from mas_train.models import resolve_model_path

    model, tok = model_and_tokenizer
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = SGLangHTTPBackend.launch(
        resolve_model_path(MODEL),
        port=port,
        mem_fraction_static=0.2,
        random_seed=0,
        tokenizer=tok,
        model_config=model.config,
        extra_args=["--dtype", "bfloat16"],
    )
    try:
        greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
        before = backend.generate([list(_prompt(tok))], greedy)[0]
        assert len(before.completion_ids) == len(before.logprobs) > 0
        noisy = {
            k: v + 0.05 * torch.randn_like(v) if v.ndim == 2 else v for k, v in model.state_dict().items()
        }
        assert backend.update_weights(noisy) == 1
        assert backend.generate([list(_prompt(tok))], greedy)[0].completion_ids != before.completion_ids
    finally:
        backend.close()

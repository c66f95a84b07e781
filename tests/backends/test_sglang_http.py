"""SGLangHTTPBackend against a fake SGLang server (FastAPI, SGLang's /generate etc. shapes, a real tiny model)."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from fastapi.testclient import TestClient

from mas_train.backends.base import GenerationBackend, SamplingParams
from mas_train.backends.sglang import SGLangHTTPBackend
from tests.backends.fake_sglang import make_app, script_model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture
def server(fresh_runtime):
    """(runtime, TestClient) with the original weights restored and an empty call log."""
    with TestClient(make_app(fresh_runtime)) as client:
        yield fresh_runtime, client


def _backend(client, path, **kw):
    return SGLangHTTPBackend("http://testserver", client=client, model_path=path, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_round_trip_and_wire_format(server, model_path):
    runtime, client = server
    tok = runtime.tokenizer
    backend = _backend(client, model_path, tokenizer=tok)
    assert isinstance(backend, GenerationBackend)
    backend.wait_until_healthy(timeout=5)
    prompts = [tok.encode("Hello world"), tok.encode("1 + 1 =")]
    outs = backend.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    req = runtime.requests[-1]
    assert req["input_ids"] == prompts and req["return_logprob"] is True
    assert req["sampling_params"][0] == {
        "max_new_tokens": 4,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    for prompt, o in zip(prompts, outs, strict=True):
        assert len(o.completion_ids) == len(o.logprobs) == 4 and o.weight_version == 0
        with torch.no_grad():
            logits = runtime.model(torch.tensor([prompt + o.completion_ids])).logits[0, len(prompt) - 1 : -1]
        # greedy: ids are the argmax and logprobs the unscaled log_softmax (SGLang's greedy convention)
        assert o.completion_ids == logits.argmax(-1).tolist()
        expected = torch.log_softmax(logits, -1).max(-1).values
        assert torch.allclose(torch.tensor(o.logprobs), expected, atol=1e-4)


def test_http_weight_update_through_disk_changes_samples(server, model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    runtime, client = server
    tok = runtime.tokenizer
    start, a, b = tok.encode("Q")[0], tok.encode(" red green blue"), tok.encode(" one two three")
    script_model(runtime.model, [start, *a])
    backend = _backend(client, model_path, tokenizer=tok, weight_dir=tmp_path)
    greedy = SamplingParams(max_new_tokens=len(a), temperature=0.0)
    assert backend.generate([[start]], greedy)[0].completion_ids == a

    trained = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    script_model(trained, [start, *b])
    assert backend.update_weights(trained.state_dict()) == 1
    assert runtime.calls == ["update_weights_from_disk", "flush_cache"]
    after = backend.generate([[start]], greedy)[0]
    assert after.completion_ids == b and after.weight_version == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]  # the folder the server loaded

    assert backend.update_weights(trained.state_dict()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2"]  # older checkpoints are removed


def test_http_failed_update_reports_the_server_message(server, model_path):
    runtime, client = server
    backend = _backend(client, model_path)
    with pytest.raises(RuntimeError, match="update_weights_from_disk failed.*HTTP 400.*shape mismatch"):
        backend.update_weights({"lm_head.weight": torch.zeros(2, 2)})
    assert backend.weight_version == 0


def test_http_error_answers_are_raised(server, model_path):
    runtime, client = server
    backend = _backend(client, model_path)
    with pytest.raises(ValueError, match="empty"):
        backend.generate([[]], SamplingParams())
    r = client.post("/generate", json={"input_ids": [[1]], "sampling_params": {"max_tokens": 3}})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]  # the fake is strict, too


def test_http_sleep_wake(server, model_path):
    runtime, client = server
    backend = _backend(client, model_path, memory_saver=True)
    backend.sleep()
    assert runtime.released
    with pytest.raises(RuntimeError, match="wake"):
        backend.generate([[1]], SamplingParams(max_new_tokens=1))
    backend.wake()
    assert runtime.calls == ["release_memory_occupation", "resume_memory_occupation"]
    assert len(backend.generate([[1]], SamplingParams(max_new_tokens=2))[0].completion_ids) == 2
    backend.close()
    backend.close()


def test_unreachable_server_fails_fast_with_a_clear_error():
    url = f"http://127.0.0.1:{_free_port()}"
    backend = SGLangHTTPBackend(url, connect_retries=2, timeout=5)  # httpx transport retries: 1 retry
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"cannot reach the SGLang server at {url}/generate after 2"):
        backend.generate([[1, 2]], SamplingParams(max_new_tokens=1))
    with pytest.raises(TimeoutError, match="not healthy"):
        backend.wait_until_healthy(timeout=0.3, poll=0.05)
    assert time.monotonic() - started < 10
    backend.close()


@pytest.mark.slow
def test_launch_a_server_process_over_real_sockets(model_path):
    """``SGLangHTTPBackend.launch`` with the fake standing in for ``sglang.launch_server`` (same flags)."""
    port = _free_port()
    backend = SGLangHTTPBackend.launch(
        model_path,
        port=port,
        random_seed=0,
        server_module="tests.backends.fake_sglang",
        startup_timeout=300,
        env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    try:
        out = backend.generate([[9707, 1879]], SamplingParams(max_new_tokens=3, temperature=0.0))[0]
        assert len(out.completion_ids) == 3 and out.finish_reason == "length"
        process = backend._process

        # a model group pointing at a running server (backend_options.url) reaches the same server
        from types import SimpleNamespace

        from mas_train.backends import make_backend

        group = SimpleNamespace(
            name="solver", model=model_path, backend="sglang_http", dtype="auto",
            backend_options={"url": backend.url, "timeout": 60, "startup_timeout": 30},
        )  # fmt: skip
        remote = make_backend(group)
        try:
            again = remote.generate([[9707, 1879]], SamplingParams(max_new_tokens=3, temperature=0.0))[0]
            assert again.completion_ids == out.completion_ids
        finally:
            remote.close()
        assert process.poll() is None  # a backend that did not launch the server leaves it running
    finally:
        backend.close()
    assert process.poll() is not None  # close() stopped the server it launched


# -- the shared backend contract (mas_train.backends.testing) -------------------------------------------------

from mas_train.backends.testing import BackendContract  # noqa: E402


class TestSGLangHTTPContract(BackendContract):
    """The contract over HTTP against the fake server (the ASGI app, in-process)."""

    @pytest.fixture
    def make_backend(self, runtime, tiny_qwen3_path, tiny_model_and_tokenizer, tmp_path):
        reference, tok = tiny_model_and_tokenizer
        made = []
        with TestClient(make_app(runtime)) as client:

            def factory():
                runtime.model.load_state_dict(reference.state_dict())  # fresh weights, version 0
                runtime.released = False
                made.append(
                    SGLangHTTPBackend(
                        "http://testserver",
                        client=client,
                        tokenizer=tok,
                        model_path=tiny_qwen3_path,
                        weight_dir=tmp_path / f"w{len(made)}",
                    )
                )
                return made[-1]

            yield factory
            for b in made:
                b.close()

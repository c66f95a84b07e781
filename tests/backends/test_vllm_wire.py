"""``vllm_http`` wire mapping and error paths without a server (httpx.MockTransport); the real engine is
``tests/backends/test_vllm.py`` (``pytest -m vllm``)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from mas_train.backends import build_options
from mas_train.backends.base import SamplingParams
from mas_train.backends.vllm import VLLMHTTPBackend, _lora_rank, find_vllm_python, to_vllm_request


class FakeVLLM:
    """Answers like vLLM 0.32's OpenAI server; ``choices`` maps a prompt (tuple of ids) to its answer."""

    def __init__(self, choices=None, rpc_status=200, healthy_after_rpc=True):
        self.requests: list[tuple[str, dict | None]] = []
        self.choices = choices or {}
        self.rpc_status = rpc_status
        self.healthy = True
        self.healthy_after_rpc = healthy_after_rpc

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.url.path, body))
        path = request.url.path
        if path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "/models/served"}]})
        if path == "/v1/completions":
            out = [dict(self.choices[tuple(p)], index=i) for i, p in enumerate(body["prompt"])]
            return httpx.Response(200, json={"choices": out[::-1]})  # any order: index says which
        if path == "/collective_rpc":
            self.healthy = self.healthy_after_rpc
            if self.rpc_status != 200:
                return httpx.Response(self.rpc_status, json={"error": {"message": "Worker failed: boom"}})
            return httpx.Response(200, json={"results": [None]})
        if path == "/reset_prefix_cache":
            return httpx.Response(200)
        return httpx.Response(404)


def _choice(ids, logprobs, finish="length", stop_reason=None):
    return {"token_ids": ids, "logprobs": {"token_logprobs": logprobs}, "finish_reason": finish,
            "stop_reason": stop_reason, "text": ""}  # fmt: skip


def _backend(fake, **kw):
    client = httpx.Client(transport=httpx.MockTransport(fake), base_url="http://vllm")
    return VLLMHTTPBackend("http://vllm", client=client, **kw)


def test_request_fields_are_vllms_and_neutral():
    req = to_vllm_request(SamplingParams(max_new_tokens=5, temperature=0.7, top_k=0, stop=("</a>",), seed=3))
    assert req == {
        "max_tokens": 5, "temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "n": 1, "logprobs": 0, "return_token_ids": True,
        "skip_special_tokens": False, "include_stop_str_in_output": True, "stream": False, "stop": ["</a>"],
        "seed": 3,
    }  # fmt: skip


def test_one_request_per_sampling_params_and_prompt_order(tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    eos = tok.eos_token_id
    hello, world = tok.encode("Hello"), tok.encode(" world")
    fake = FakeVLLM(
        {
            (1, 2): _choice([5, 6], [-0.5, -0.25]),
            (3,): _choice([7, eos], [-1.0, -0.1]),  # EOS on the last allowed token: vLLM says "length"
            (4,): _choice(hello + world, [-0.1] * len(hello + world), "stop", " w"),
        }
    )
    backend = _backend(fake, tokenizer=tok)
    a = SamplingParams(max_new_tokens=2, temperature=0.0)
    b = SamplingParams(max_new_tokens=8, temperature=1.0, seed=1, stop=(" w",))
    outs = backend.generate([[1, 2], [4], [3]], [a, b, a])
    completions = [p for p, body in fake.requests if p == "/v1/completions"]
    assert len(completions) == 2  # a's two prompts in one request, b's in another
    bodies = {tuple(map(tuple, body["prompt"])): body for p, body in fake.requests if p == "/v1/completions"}
    assert bodies[((1, 2), (3,))]["model"] == "/models/served" and bodies[((4,),)]["seed"] == 1
    assert outs[0].completion_ids == [5, 6] and outs[0].logprobs == [-0.5, -0.25]
    assert outs[0].finish_reason == "length" and outs[0].weight_version == 0
    assert outs[2].completion_ids == [7, eos] and outs[2].finish_reason == "stop"
    assert outs[1].finish_reason == "stop" and outs[1].stop_string == " w"
    assert " w" in tok.decode(outs[1].completion_ids) and outs[1].completion_ids == hello + world[:1]


def test_malformed_answers_raise():
    fake = FakeVLLM({(1,): {"logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}})
    with pytest.raises(RuntimeError, match="no choices\\[\\].token_ids"):
        _backend(fake).generate([[1]], SamplingParams(max_new_tokens=2))
    fake = FakeVLLM({(1,): _choice([3, 4], [-1.0])})
    with pytest.raises(RuntimeError, match="1 token logprobs for 2 tokens"):
        _backend(fake).generate([[1]], SamplingParams(max_new_tokens=2))
    fake = FakeVLLM({(1,): _choice([3], [-1.0], "abort")})
    with pytest.raises(RuntimeError, match="finished a request with 'abort'"):
        _backend(fake).generate([[1]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="prompt 0 is empty; vLLM"):
        _backend(FakeVLLM()).generate([[]], SamplingParams())


@pytest.fixture
def tiny_state(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    return {k: v for k, v in model.state_dict().items() if "layers.0." in k or "norm" in k}


def test_sync_writes_reloads_resets_and_bumps(
    tiny_qwen3_path, tiny_model_and_tokenizer, tiny_state, tmp_path
):
    model, _ = tiny_model_and_tokenizer
    fake = FakeVLLM()
    backend = _backend(fake, model_path=tiny_qwen3_path, model_config=model.config, sync_dir=tmp_path)
    assert backend.update_weights(tiny_state) == 1
    calls = [(p, b) for p, b in fake.requests]
    assert [p for p, _ in calls] == ["/collective_rpc", "/reset_prefix_cache"]
    kwargs = calls[0][1]["kwargs"]
    assert calls[0][1]["method"] == "reload_weights" and kwargs["weights_path"].endswith("/v1")
    assert kwargs["weights_path"].startswith(str(backend.sync_dir)) and backend.sync_dir.parent == tmp_path
    assert list(backend.sync_dir.iterdir()) == []  # loaded, then deleted
    nbytes = sum(t.numel() * t.element_size() for t in tiny_state.values())
    assert nbytes < backend.last_sync["bytes"] < nbytes + 1e5
    backend.close()
    assert not backend.sync_dir.exists()


def test_failed_sync_raises_keeps_version_and_says_the_engine_is_down(tiny_qwen3_path, tiny_state):
    fake = FakeVLLM(rpc_status=500, healthy_after_rpc=False)
    backend = _backend(fake, model_path=tiny_qwen3_path)
    with pytest.raises(RuntimeError, match=r"reload_weights failed: HTTP 500 .*boom.*engine is down"):
        backend.update_weights(tiny_state)
    assert backend.weight_version == 0 and list(backend.sync_dir.iterdir()) == []
    assert "/reset_prefix_cache" not in [p for p, _ in fake.requests]
    with pytest.raises(ValueError, match=r"1 tensor\(s\) do not fit .*model.nope.weight"):
        backend.update_weights({"model.nope.weight": torch.zeros(2)})
    assert [p for p, _ in fake.requests].count("/collective_rpc") == 1  # the second never reached the server


def test_options_and_python_lookup(tmp_path, monkeypatch):
    opts = build_options("vllm_http", {"python": "/x/bin/python", "kv_cache_gib": 1})
    assert (opts.max_model_len, opts.logprobs_mode, opts.enforce_eager) == (2048, "processed_logprobs", True)
    with pytest.raises(ValueError, match="either url .* or python"):
        build_options("vllm_http", {"url": "http://h:1", "python": "/x"})
    with pytest.raises(ValueError, match="extra_args sets '--max-model-len=4'"):
        build_options("vllm_http", {"extra_args": ["--max-model-len=4"]})
    with pytest.raises(ValueError, match="logprobs_mode must be"):
        build_options("vllm_http", {"logprobs_mode": "raw_logits"})
    monkeypatch.delenv("MAS_VLLM_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"\.venv-vllm/bin/python .*scripts/setup_vllm_cpu.sh"):
        find_vllm_python()
    monkeypatch.setenv("MAS_VLLM_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="MAS_VLLM_PYTHON"):
        find_vllm_python()
    assert [_lora_rank(4, None, "g"), _lora_rank(9, None, "g"), _lora_rank(8, 32, "g")] == [8, 16, 32]
    with pytest.raises(ValueError, match="max_lora_rank=8 is below its lora.r=16"):
        _lora_rank(16, 8, "g")

"""Secrets stay where they belong: config values do not read the environment unless the user asks
(``MAS_RL_CONFIG_ENV=1``), and an API key goes only to the endpoint it is configured for."""

from __future__ import annotations

import logging

import pytest

from mas_train.config import ConfigError, TrainConfig, parse_args

SECRET = "s3cr3t-value-9f2"


def test_env_interpolation_in_a_flag_is_refused(monkeypatch):
    monkeypatch.setenv("MAS_TEST_SECRET", SECRET)
    monkeypatch.delenv("MAS_RL_CONFIG_ENV", raising=False)
    with pytest.raises(
        ConfigError, match=r"run_name: .*reads an environment variable.*MAS_RL_CONFIG_ENV=1"
    ) as e:
        parse_args(["--env", "math-2agent", "--run_name", "x-${oc.env:MAS_TEST_SECRET}"])
    assert SECRET not in str(e.value)


def test_env_interpolation_in_a_yaml_file_is_refused_even_nested(monkeypatch, tmp_path):
    monkeypatch.setenv("MAS_TEST_SECRET", SECRET)
    monkeypatch.delenv("MAS_RL_CONFIG_ENV", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("env: math-2agent\nenv_kwargs:\n  tag: 'a ${ oc.env:MAS_TEST_SECRET,x}'\n")
    with pytest.raises(ConfigError, match=r"env_kwargs.tag: .*reads an environment variable"):
        TrainConfig.from_yaml(path)


def test_env_interpolation_when_asked_for(monkeypatch):
    monkeypatch.setenv("MAS_TEST_SECRET", "abc")
    monkeypatch.setenv("MAS_RL_CONFIG_ENV", "1")
    cfg = parse_args(["--env", "math-2agent", "--run_name", "x-${oc.env:MAS_TEST_SECRET}"])
    assert cfg.run_name == "x-abc"


# -- the API key ---------------------------------------------------------------------------------------------


@pytest.fixture
def server():
    from tests.backends.openai_server import OpenAITestServer

    with OpenAITestServer() as srv:
        yield srv


def _chat(backend):
    from mas_train.backends.base import SamplingParams

    return backend.generate_messages([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=2))


def test_openai_api_key_is_not_sent_to_another_server_by_default(
    server, monkeypatch, tiny_model_and_tokenizer
):
    pytest.importorskip("openai")
    from mas_train.backends.endpoint_keys import key_env_for
    from mas_train.backends.openai import OpenAIBackend, OpenAIOptions

    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-openai-key-123")
    backend = OpenAIBackend(OpenAIOptions(base_url=server.base_url, model="m"), tiny_model_and_tokenizer[1])
    try:
        _chat(backend)
    finally:
        backend.close()
    assert "authorization" not in server.requests[0].headers
    assert key_env_for(OpenAIOptions(base_url="https://api.openai.com/v1", model="m")) == "OPENAI_API_KEY"
    assert key_env_for(OpenAIOptions(base_url="http://api.openai.com/v1", model="m")) is None
    named = OpenAIOptions(base_url=server.base_url, model="m", api_key_env="MAS_TEST_KEY")
    monkeypatch.setenv("MAS_TEST_KEY", "sk-test-abc")
    backend = OpenAIBackend(named, tiny_model_and_tokenizer[1])
    try:
        _chat(backend)
    finally:
        backend.close()
    assert server.requests[-1].headers["authorization"] == "Bearer sk-test-abc"


@pytest.mark.parametrize(
    "url, warned",
    [
        ("http://10.1.2.3:8000/v1", True),
        ("http://example.com/v1", True),
        ("http://127.0.0.1:8000/v1", False),
        ("http://localhost:8000/v1", False),
        ("http://[::1]:8000/v1", False),
        ("https://example.com/v1", False),
    ],
)
def test_a_key_over_plain_http_beyond_loopback_is_warned_about(monkeypatch, caplog, url, warned):
    pytest.importorskip("openai")
    from mas_train.backends.openai import OpenAIBackend, OpenAIOptions

    monkeypatch.setenv("MAS_TEST_KEY", "sk-test-abc")
    with caplog.at_level(logging.WARNING, logger="mas_train.backends.openai"):
        OpenAIBackend(OpenAIOptions(base_url=url, model="m", api_key_env="MAS_TEST_KEY"), None).close()
    hits = [r.getMessage() for r in caplog.records if "plain http" in r.getMessage()]
    assert bool(hits) == warned, hits
    assert all("sk-test-abc" not in h and url in h for h in hits)

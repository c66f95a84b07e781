"""OpenAIBackend against a local OpenAI-compatible server on a real socket, driven by the official client."""

from __future__ import annotations

import json
import logging
import pickle
import socket
import time

import pytest

from mas_train.backends.base import GenerationBackend, SamplingParams
from mas_train.backends.openai import OpenAIBackend, OpenAIBackendError, OpenAIOptions
from mas_train.backends.testing import BackendContract, chat_prompt
from tests.backends.openai_server import WORDS, Action, OpenAITestServer

KEY = "sk-test-4f9c1e7a2b"  # a fake key: must reach the server as a Bearer header and nowhere else


@pytest.fixture
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


@pytest.fixture
def server():
    with OpenAITestServer() as srv:
        yield srv


def _backend(srv, tok, **kw) -> OpenAIBackend:
    opts = {"base_url": srv.base_url, "model": "frozen-verifier", "api_key_env": None, **kw}
    return OpenAIBackend(OpenAIOptions(**opts), tok)


def _user(content: str) -> list[dict]:
    return [{"role": "system", "content": "You verify."}, {"role": "user", "content": content}]


def _words(text: str) -> int:
    return len(text.split())


# -- wire format and outputs ---------------------------------------------------------------------------------


def test_chat_round_trip_wire_format_and_usage(server, tok):
    backend = _backend(server, tok)
    assert backend.wants_messages and backend.can_train is False
    convs = [_user("is 2 + 3 = 5?"), _user("check 7 x 6 = 42 please")]
    outs = backend.generate_messages(
        convs, SamplingParams(max_new_tokens=4, temperature=0.0, top_p=0.9, seed=7)
    )
    assert [r.path for r in server.requests] == ["/v1/chat/completions"] * 2
    body = next(r.body for r in server.requests if r.body["messages"] == convs[0])
    assert body == {
        "model": "frozen-verifier",
        "messages": convs[0],
        "max_tokens": 4,
        "temperature": 0.0,
        "top_p": 0.9,
        "n": 1,
        "seed": 7,
    }
    assert "authorization" not in server.requests[0].headers  # api_key_env=None: no header at all
    for out in outs:
        text = out.meta["env_text"]
        assert _words(text) == 4 and all(w in WORDS for w in (" " + x for x in text.split()))
        assert (
            out.completion_ids == tok.encode(text, add_special_tokens=False) and len(out.completion_ids) == 4
        )
        assert out.logprobs == [0.0] * 4
        assert out.finish_reason == "length" and out.meta["server_finish_reason"] == "length"
        assert out.weight_version == 0 and out.stop_string is None and out.meta["trainable"] is False
    # usage as the server counts it (words): "You verify." + the user turn, 4 reply words each, summed
    assert backend.usage == {
        "requests": 2,
        "prompt_tokens": (2 + 6) + (2 + 7),
        "completion_tokens": 8,
        "retries": 0,
        "errors": 0,
    }
    backend.generate_messages(convs[:1], SamplingParams(max_new_tokens=3, temperature=0.0))
    assert backend.usage["prompt_tokens"] == 17 + 8 and backend.usage["completion_tokens"] == 8 + 3
    backend.close()


def test_completions_sends_the_rendered_prompt_text(server, tok):
    backend = _backend(server, tok, endpoint="completions")
    assert not backend.wants_messages
    ids = chat_prompt(tok, "What is 2 + 3?")
    out = backend.generate([ids], SamplingParams(max_new_tokens=5, temperature=1.0, top_k=20, seed=3))[0]
    req = server.requests[0]
    assert req.path == "/v1/completions"
    assert req.body["prompt"] == tok.decode(ids, skip_special_tokens=False)
    assert req.body["prompt"].startswith("<|im_start|>user\nWhat is 2 + 3?")
    assert req.body["top_k"] == 20 and req.body["seed"] == 3 and req.body["max_tokens"] == 5
    assert len(out.completion_ids) == 5 and out.finish_reason == "length"
    assert backend.usage["requests"] == 1 and backend.usage["completion_tokens"] == 5


def test_endpoint_and_entry_point_must_agree(server, tok):
    chat, comp = _backend(server, tok), _backend(server, tok, endpoint="completions")
    with pytest.raises(ValueError, match="generate_messages"):
        chat.generate([[1, 2, 3]], SamplingParams())
    with pytest.raises(ValueError, match="generate\\(prompt_ids"):
        comp.generate_messages([_user("hi")], SamplingParams())
    with pytest.raises(ValueError, match="2 SamplingParams for 1"):
        chat.generate_messages([_user("hi")], [SamplingParams()] * 2)
    assert server.requests == []


# -- stop strings --------------------------------------------------------------------------------------------


def test_stop_string_reported_by_server_is_kept(tok):
    # the word model's text for this prompt contains " dog"; the server cuts before it and names it (vLLM)
    with OpenAITestServer(reply=lambda b: " the cat sat dog ran", report_stop=True) as srv:
        backend = _backend(srv, tok)
        out = backend.generate_messages([_user("go")], SamplingParams(stop=(" dog", "</answer>")))[0]
        assert srv.requests[0].body["stop"] == [" dog", "</answer>"]
    assert (
        out.meta["env_text"] == " the cat sat dog"
        and out.stop_string == " dog"
        and out.finish_reason == "stop"
    )
    assert out.completion_ids == tok.encode(" the cat sat dog", add_special_tokens=False)


def test_closing_tag_stop_restored_when_server_does_not_say(tok):
    # OpenAI style: the stop string is cut off and not reported; an open <verify> only closes with </verify>
    with OpenAITestServer(reply=lambda b: "<verify>yes</verify> and more") as srv:
        backend = _backend(srv, tok)
        tagged = backend.generate_messages([_user("go")], SamplingParams(stop=("</verify>",)))[0]
        plain = backend.generate_messages([_user("go")], SamplingParams(stop=(" and",)))[0]
    assert tagged.meta["env_text"] == "<verify>yes</verify>" and tagged.stop_string == "</verify>"
    # a plain stop the server does not name cannot be told from the model's end of turn: text as returned
    assert plain.meta["env_text"] == "<verify>yes</verify>" and plain.stop_string is None
    assert plain.finish_reason == "stop"


def test_stop_cut_locally_when_server_ignores_it(tok):
    with OpenAITestServer(
        reply=lambda b: {"text": " the cat sat on mat", "finish_reason": "length"}, honour_stop=False
    ) as srv:
        out = _backend(srv, tok).generate_messages([_user("go")], SamplingParams(stop=(" on", "cat s")))[0]
    # "cat s" is completed (ends) before " on" starts: the earliest completed stop wins, and it is kept
    assert out.meta["env_text"] == " the cat s" and out.stop_string == "cat s" and out.finish_reason == "stop"


# -- retries, timeouts, dead servers -------------------------------------------------------------------------


def test_429_then_success_is_retried_once(server, tok):
    server.push(Action(status=429, headers={"retry-after-ms": "10"}))
    backend = _backend(server, tok, max_retries=3)
    out = backend.generate_messages([_user("hi")], SamplingParams(max_new_tokens=2, temperature=0.0))[0]
    assert len(server.requests) == 2  # exactly one retry, then the reply
    assert len(out.completion_ids) == 2 and out.finish_reason == "length"
    assert backend.usage["retries"] == 1 and backend.usage["requests"] == 1 and backend.usage["errors"] == 0


def test_5xx_after_bounded_retries_raises_naming_the_server(server, tok):
    server.push(*[Action(status=503, headers={"retry-after-ms": "5"}, message="overloaded")] * 3)
    backend = _backend(server, tok, max_retries=2)
    with pytest.raises(OpenAIBackendError, match="HTTP 503, server error") as err:
        backend.generate_messages([_user("hi")], SamplingParams(max_new_tokens=2))
    assert server.base_url in str(err.value) and "(after 2 retries)" in str(err.value)
    assert len(server.requests) == 3  # 1 attempt + max_retries


def test_4xx_is_a_config_error_without_retries(server, tok):
    server.push(Action(status=404, message="model 'frozen-verifier' does not exist"))
    with pytest.raises(OpenAIBackendError, match="HTTP 404, no such model"):
        _backend(server, tok).generate_messages([_user("hi")], SamplingParams())
    assert len(server.requests) == 1


def test_timeout_raises_after_bounded_retries(server, tok):
    server.push(Action(sleep_s=1.0), Action(sleep_s=1.0))
    backend = _backend(server, tok, timeout_s=0.2, max_retries=1)
    t0 = time.perf_counter()
    with pytest.raises(OpenAIBackendError, match="timeout_s=0.2 after 1 retries") as err:
        backend.generate_messages([_user("hi")], SamplingParams(max_new_tokens=2))
    # 2 attempts x 0.2 s + one backoff of at most 0.5 s
    assert time.perf_counter() - t0 < 1.5
    assert server.base_url in str(err.value)
    assert len(server.requests) == 2


def test_dead_server_raises_naming_base_url(tok):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    opts = OpenAIOptions(base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key_env=None, max_retries=0)
    with pytest.raises(OpenAIBackendError, match=f"127.0.0.1:{port}/v1.*cannot connect"):
        OpenAIBackend(opts, tok).generate_messages([_user("hi")], SamplingParams())


# -- malformed replies: an empty completion (an invalid action), counted, never a crash ----------------------


@pytest.mark.parametrize(
    "action, why",
    [
        (Action(body=b"{not json", content_type="application/json"), "not valid JSON"),
        (Action(body=b"<html>gateway</html>", content_type="text/html"), "not JSON"),
        (Action(body=b'{"id": "x", "object": "chat.completion", "choices": []}'), "no choices"),
        (Action(body=b"[1, 2]"), "no choices"),
        (Action(body=b'{"choices": {"first": 1}}'), "unexpected shape (KeyError"),
        (Action(body=b'{"choices": [{"message": "ok"}]}'), "no text content"),
        (
            Action(body=b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": null}}]}'),
            "no text content",
        ),
    ],
)
def test_malformed_reply_is_an_empty_completion(server, tok, caplog, action, why):
    server.push(action)
    backend = _backend(server, tok, max_concurrency=1)  # one at a time: the first request gets the action
    with caplog.at_level(logging.WARNING, logger="mas_train.backends.openai"):
        bad, good = backend.generate_messages(
            [_user("one"), _user("two")], SamplingParams(max_new_tokens=3, temperature=0.0)
        )
    assert bad.completion_ids == [] and bad.logprobs == [] and bad.meta["env_text"] == ""
    assert bad.finish_reason == "stop" and why in bad.meta["error"] and bad.meta["trainable"] is False
    assert len(good.completion_ids) == 3  # the rest of the batch is unaffected
    assert backend.usage["errors"] == 1 and backend.usage["requests"] == 1
    assert any("malformed reply" in r.getMessage() and why in r.getMessage() for r in caplog.records)


# -- concurrency ---------------------------------------------------------------------------------------------


def test_garbage_usage_counts_zero_but_keeps_the_reply(server, tok):
    reply = {"role": "assistant", "content": " the cat"}
    body = {"choices": [{"message": reply, "finish_reason": "stop"}], "usage": {"prompt_tokens": "many"}}
    server.push(Action(body=json.dumps(body).encode()))
    backend = _backend(server, tok)
    out = backend.generate_messages([_user("hi")], SamplingParams())[0]
    assert out.meta["env_text"] == " the cat" and out.finish_reason == "stop"
    assert backend.usage == {
        "requests": 1,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "retries": 0,
        "errors": 0,
    }


def test_concurrency_limit_and_order(tok):
    echo = lambda body: "echo " + body["messages"][-1]["content"]  # noqa: E731
    with OpenAITestServer(reply=echo, delay_s=0.05) as srv:
        backend = _backend(srv, tok, max_concurrency=3)
        outs = backend.generate_messages([_user(f"n{i}") for i in range(9)], SamplingParams())
        assert srv.max_in_flight == 3
        assert [o.meta["env_text"] for o in outs] == [f"echo n{i}" for i in range(9)]
        one = _backend(srv, tok, max_concurrency=1)
        srv.max_in_flight = 0
        one.generate_messages([_user(f"n{i}") for i in range(3)], SamplingParams())
        assert srv.max_in_flight == 1


# -- the API key ---------------------------------------------------------------------------------------------


def test_api_key_sent_as_bearer_and_never_shown(server, tok, monkeypatch, caplog):
    monkeypatch.setenv("MAS_TEST_OPENAI_KEY", KEY)
    opts = OpenAIOptions(
        base_url=server.base_url, model="m", api_key_env="MAS_TEST_OPENAI_KEY", max_retries=0
    )
    backend = OpenAIBackend(opts, tok)
    with caplog.at_level(logging.DEBUG):
        backend.generate_messages([_user("hi")], SamplingParams(max_new_tokens=1))
        # a server error that echoes the key back must not carry it into our error
        server.push(Action(status=401, message=f"Incorrect API key provided: {KEY}"))
        with pytest.raises(OpenAIBackendError, match=r"HTTP 401.*MAS_TEST_OPENAI_KEY was rejected") as err:
            backend.generate_messages([_user("hi")], SamplingParams(max_new_tokens=1))
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    shown = [repr(backend), str(backend), repr(opts), str(err.value), repr(err.value), caplog.text]
    assert "***" in str(err.value)
    assert not [s for s in shown if KEY in s]
    assert err.value.__cause__ is None and err.value.__context__ is None  # the client's error is not chained
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(backend)


def test_missing_key_env_is_a_clear_error(server, tok, monkeypatch):
    monkeypatch.delenv("MAS_TEST_OPENAI_KEY", raising=False)
    with pytest.raises(ValueError, match="'MAS_TEST_OPENAI_KEY' \\(api_key_env\\) is unset"):
        OpenAIBackend(
            OpenAIOptions(base_url=server.base_url, model="m", api_key_env="MAS_TEST_OPENAI_KEY"), tok
        )


def test_no_key_env_never_sends_the_ambient_openai_key(server, tok, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    _backend(server, tok).generate_messages([_user("hi")], SamplingParams(max_new_tokens=1))
    assert "authorization" not in server.requests[0].headers


# -- options and lifecycle -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"base_url": "127.0.0.1:8000/v1"}, "http:// or https://"),
        ({"model": ""}, "model is empty"),
        ({"endpoint": "responses"}, "endpoint must be one of"),
        ({"timeout_s": 0}, "timeout_s must be > 0"),
        ({"max_retries": -1}, "max_retries must be >= 0"),
        ({"max_concurrency": 0}, "max_concurrency must be >= 1"),
    ],
)
def test_options_are_validated(bad, match):
    with pytest.raises(ValueError, match=match):
        OpenAIOptions(**{"base_url": "http://127.0.0.1:1/v1", "model": "m", **bad})


def test_frozen_lifecycle(server, tok):
    backend = _backend(server, tok)
    assert isinstance(backend, GenerationBackend) and backend.weight_version == 0
    with pytest.raises(RuntimeError, match="frozen agent: it has no weight sync"):
        backend.update_weights({})
    backend.sleep()
    backend.wake()
    assert (
        len(backend.generate_messages([_user("hi")], SamplingParams(max_new_tokens=2))[0].completion_ids) == 2
    )
    backend.close()
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        backend.generate_messages([_user("hi")], SamplingParams())


# -- the backend contract, where it applies ------------------------------------------------------------------

_NO_MODEL = "needs the reference model's exact tokens/logprobs; a remote endpoint serves other weights"


class TestOpenAIBackendContract(BackendContract):
    """The contract on the completions endpoint (token ids in), against the word-model server.

    The checks that compare with the reference model or update weights do not apply to a frozen remote agent;
    every output's logprobs must instead be zeros aligned with the ids (never trainable).
    """

    @pytest.fixture
    def make_backend(self, tiny_model_and_tokenizer):
        made = []
        with OpenAITestServer(report_stop=True) as srv:

            def factory():
                made.append(_backend(srv, tiny_model_and_tokenizer[1], endpoint="completions"))
                return made[-1]

            yield factory
            for b in made:
                b.close()

    def _check_logprobs(self, model, prompt, out, temperature) -> None:
        assert out.logprobs == [0.0] * len(out.completion_ids) and out.meta["trainable"] is False

    def test_greedy_round_trip_matches_reference_model(self):
        pytest.skip(_NO_MODEL)

    def test_sampling_logprobs_match_teacher_forcing(self):
        pytest.skip(_NO_MODEL)

    def test_top_k_1_is_greedy(self):
        pytest.skip(_NO_MODEL)

    def test_tiny_top_p_is_greedy(self):
        pytest.skip(_NO_MODEL)

    def test_stop_string_ends_generation_at_completing_token(self):
        pytest.skip(_NO_MODEL + " (stop strings: test_stop_* above)")

    def test_mixed_sampling_params_in_one_call(self):
        pytest.skip(_NO_MODEL)

    def test_eos_stops_and_is_kept(self):
        pytest.skip("needs update_weights; a frozen endpoint has none (test_frozen_lifecycle)")

    def test_update_weights_bumps_version_and_changes_samples(self):
        pytest.skip("a frozen endpoint has no weight sync (test_frozen_lifecycle)")

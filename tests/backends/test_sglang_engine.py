"""SGLangEngineBackend against a fake ``sglang.Engine`` that speaks SGLang 0.5.x shapes and generates for real."""

from __future__ import annotations

import math
import types

import pytest
import torch

from mas_train.backends.base import GenerationBackend, SamplingParams
from mas_train.backends.sglang import (
    SGLangEngineBackend,
    parse_sglang_output,
    to_sglang_sampling_params,
)
from tests.backends.fake_sglang import FakeEngine, FakeEngineLegacy, FakeRuntime, script_model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


# -- pure mapping -------------------------------------------------------------------------------------------


def test_sampling_params_use_sglang_names():
    sp = SamplingParams(max_new_tokens=7, temperature=0.5, top_p=0.9, top_k=0, stop=("</a>",), seed=3)
    assert to_sglang_sampling_params(sp) == {
        "max_new_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": -1,
        "no_stop_trim": True,
        "skip_special_tokens": False,
        "stop": ["</a>"],
        "sampling_seed": 3,
    }
    assert to_sglang_sampling_params(SamplingParams(top_k=5))["top_k"] == 5


def test_parse_triples_eos_and_finish():
    out = {
        "text": "hi<|im_end|>",
        "output_ids": [5, 6, 151645],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 151645},
            "output_token_logprobs": [[-0.5, 5, None], [-1.25, 6, None], [-0.125, 151645, None]],
        },
    }
    g = parse_sglang_output(out, SamplingParams(max_new_tokens=4), weight_version=3)
    assert g.completion_ids == [5, 6, 151645]  # EOS kept
    assert g.logprobs == [-0.5, -1.25, -0.125]
    assert (g.finish_reason, g.weight_version, g.stop_string) == ("stop", 3, None)

    length = {**out, "meta_info": {**out["meta_info"], "finish_reason": {"type": "length", "length": 3}}}
    assert (
        parse_sglang_output(length, SamplingParams(max_new_tokens=3), weight_version=0).finish_reason
        == "length"
    )
    # SGLang tests the length cap before EOS; an EOS on the last allowed token still ended the turn
    tok = types.SimpleNamespace(eos_token_id=151645, decode=lambda ids, **kw: "")
    g = parse_sglang_output(length, SamplingParams(max_new_tokens=3), weight_version=0, tokenizer=tok)
    assert g.finish_reason == "stop" and g.completion_ids[-1] == 151645


def test_parse_rejects_malformed_answers():
    sp = SamplingParams(max_new_tokens=4)
    with pytest.raises(RuntimeError, match="return_logprob"):
        parse_sglang_output({"output_ids": [1], "meta_info": {"finish_reason": None}}, sp, weight_version=0)
    with pytest.raises(RuntimeError, match="disagree"):
        parse_sglang_output(
            {"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[-1.0, 1, None]]}},
            sp,
            weight_version=0,
        )
    with pytest.raises(RuntimeError, match="aborted.*out of memory"):
        parse_sglang_output(
            {"meta_info": {"finish_reason": {"type": "abort", "message": "out of memory"}}},
            sp,
            weight_version=0,
        )


def test_parse_cuts_a_server_that_ran_past_the_stop_string(runtime):
    tok = runtime.tokenizer
    head, tail = _ids(tok, "ok <search>x</search>"), _ids(tok, " junk after")
    ids = head + tail
    out = {
        "output_ids": ids,
        "meta_info": {
            "finish_reason": {"type": "length", "length": len(ids)},
            "output_token_logprobs": [[-float(i), t, None] for i, t in enumerate(ids)],
        },
    }
    g = parse_sglang_output(out, SamplingParams(stop=("</search>",)), weight_version=0, tokenizer=tok)
    assert g.completion_ids == head
    assert g.logprobs == [-float(i) for i in range(len(head))]
    assert tok.decode(g.completion_ids).endswith("</search>")
    assert (g.finish_reason, g.stop_string) == ("stop", "</search>")


# -- against the fake engine ----------------------------------------------------------------------------------


def test_engine_round_trip_logprobs_match_teacher_forcing(fresh_runtime):
    backend = SGLangEngineBackend(engine=FakeEngine(runtime=fresh_runtime), tokenizer=fresh_runtime.tokenizer)
    assert isinstance(backend, GenerationBackend)
    prompts = [_ids(fresh_runtime.tokenizer, "Hello world"), _ids(fresh_runtime.tokenizer, "2 + 2 =")]
    outs = backend.generate(prompts, SamplingParams(max_new_tokens=5, temperature=0.7, seed=1))
    req = fresh_runtime.requests[-1]
    assert req["input_ids"] == prompts and req["return_logprob"] is True  # token ids went in, not text
    model = fresh_runtime.model
    for prompt, o in zip(prompts, outs, strict=True):
        assert len(o.completion_ids) == len(o.logprobs) == 5 and o.finish_reason == "length"
        seq = torch.tensor([prompt + o.completion_ids])
        with torch.no_grad():
            logits = model(seq).logits[0, len(prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(o.completion_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(o.logprobs), expected, atol=1e-4)


def test_engine_stop_string_and_eos_on_a_scripted_model(fresh_runtime):
    tok = fresh_runtime.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    text_ids = _ids(tok, "I will check: capital of France</search>")
    chain = [_ids(tok, "Q")[0], *text_ids, eos]
    script_model(fresh_runtime.model, chain)
    backend = SGLangEngineBackend(engine=FakeEngine(runtime=fresh_runtime), tokenizer=tok)

    stop = backend.generate([[chain[0]]], SamplingParams(max_new_tokens=40, stop=("</search>",)))[0]
    assert stop.completion_ids == text_ids  # stops on the token that completes "</search>", nothing after
    assert tok.decode(stop.completion_ids).endswith("</search>") and stop.meta["text"].endswith("</search>")
    assert (stop.finish_reason, stop.stop_string) == ("stop", "</search>")
    assert all(math.isclose(lp, 0.0, abs_tol=1e-3) for lp in stop.logprobs)  # logit gap 160 => p ~ 1

    end = backend.generate([[chain[0]]], SamplingParams(max_new_tokens=40, temperature=0.0))[0]
    assert end.completion_ids == [*text_ids, eos]  # EOS kept as the last id
    assert (end.finish_reason, end.stop_string) == ("stop", None)

    short = backend.generate([[chain[0]]], SamplingParams(max_new_tokens=3, temperature=0.0))[0]
    assert short.completion_ids == text_ids[:3] and short.finish_reason == "length"


def test_tensor_sync_uses_the_0_5_23_session_and_changes_samples(fresh_runtime, model_path):
    from transformers import AutoModelForCausalLM

    tok = fresh_runtime.tokenizer
    a, b = _ids(tok, " alpha beta gamma"), _ids(tok, " one two three")
    start = _ids(tok, "Q")[0]
    script_model(fresh_runtime.model, [start, *a])
    backend = SGLangEngineBackend(
        engine=FakeEngine(runtime=fresh_runtime), tokenizer=tok, weight_sync="tensor", tensor_device="cpu"
    )
    greedy = SamplingParams(max_new_tokens=len(a), temperature=0.0)
    before = backend.generate([[start]], greedy)[0]
    assert before.completion_ids == a and before.weight_version == 0

    trained = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    script_model(trained, [start, *b])
    assert backend.update_weights(trained.state_dict()) == 1
    assert fresh_runtime.calls == [
        "begin_weight_update",
        "update_weights_from_tensor",
        "end_weight_update",
        "flush_cache",
    ]
    after = backend.generate([[start]], greedy)[0]
    assert after.completion_ids == b and after.weight_version == 1


def test_legacy_engine_without_session_and_failed_update(fresh_runtime):
    backend = SGLangEngineBackend(
        engine=FakeEngineLegacy(runtime=fresh_runtime), weight_sync="tensor", tensor_device="cpu"
    )
    assert backend.has_update_session is False
    good = {"lm_head.weight": fresh_runtime.model.lm_head.weight.detach().clone()}
    assert backend.update_weights(good) == 1
    assert fresh_runtime.calls == ["update_weights_from_tensor", "flush_cache"]
    with pytest.raises(RuntimeError, match="update_weights_from_tensor failed.*shape mismatch"):
        backend.update_weights({"lm_head.weight": torch.zeros(3, 3)})
    assert backend.weight_version == 1  # a failed sync does not bump the version


def test_session_engine_refuses_tensor_update_without_session(fresh_runtime):
    engine = FakeEngine(runtime=fresh_runtime)
    ok, message = engine.update_weights_from_tensor([("lm_head.weight", fresh_runtime.model.lm_head.weight)])
    assert not ok and "begin_weight_update" in message  # what a backend that ignored the session would hit


def test_disk_sync_loads_the_written_checkpoint(fresh_runtime, model_path):
    from transformers import AutoModelForCausalLM

    tok = fresh_runtime.tokenizer
    start, b = _ids(tok, "Q")[0], _ids(tok, " one two")
    backend = SGLangEngineBackend(
        model_path, engine=FakeEngine(runtime=fresh_runtime), tokenizer=tok, weight_sync="disk"
    )
    trained = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    script_model(trained, [start, *b])
    assert backend.update_weights(trained.named_parameters()) == 1
    assert fresh_runtime.calls == ["update_weights_from_disk", "flush_cache"]
    out = backend.generate([[start]], SamplingParams(max_new_tokens=len(b), temperature=0.0))[0]
    assert out.completion_ids == b and out.weight_version == 1


def test_sleep_wake_release_and_resume_memory(fresh_runtime):
    engine = FakeEngine(runtime=fresh_runtime, enable_memory_saver=True)
    backend = SGLangEngineBackend(engine=engine, enable_memory_saver=True)
    backend.sleep()
    backend.sleep()  # idempotent
    with pytest.raises(RuntimeError, match="asleep.*wake"):
        backend.generate([[1, 2]], SamplingParams(max_new_tokens=1))
    backend.wake()
    assert fresh_runtime.calls == ["release_memory_occupation", "resume_memory_occupation"]
    assert len(backend.generate([[1, 2]], SamplingParams(max_new_tokens=1))[0].completion_ids) == 1

    no_saver = SGLangEngineBackend(engine=FakeEngine(runtime=fresh_runtime))
    no_saver.sleep()  # pointless without the memory saver: a no-op, not an error
    assert fresh_runtime.calls == ["release_memory_occupation", "resume_memory_occupation"]
    backend.close()
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        backend.generate([[1]], SamplingParams(max_new_tokens=1))


def test_per_prompt_sampling_and_bad_input(fresh_runtime):
    backend = SGLangEngineBackend(engine=FakeEngine(runtime=fresh_runtime))
    outs = backend.generate(
        [[1, 2], [3]], [SamplingParams(max_new_tokens=1), SamplingParams(max_new_tokens=3, temperature=0.0)]
    )
    assert [len(o.completion_ids) for o in outs] == [1, 3]
    assert [s["max_new_tokens"] for s in fresh_runtime.requests[-1]["sampling_params"]] == [1, 3]
    with pytest.raises(ValueError, match="one per prompt"):
        backend.generate([[1], [2]], [SamplingParams()])
    with pytest.raises(ValueError, match="empty"):
        backend.generate([[]], SamplingParams())


def test_missing_sglang_gives_the_install_line(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sglang(name, *args, **kwargs):
        if name == "sglang":
            raise ImportError("No module named 'sglang'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sglang)
    with pytest.raises(ImportError, match=r"pip install 'mas-rl\[gpu\]'"):
        SGLangEngineBackend("some/model")


def test_factory_builds_the_engine_with_server_args(monkeypatch, fresh_runtime, model_path):
    import sys
    import types

    from mas_train.backends.sglang import make_sglang_backend

    built = []

    def engine(**server_args):  # stands in for sglang.Engine; FakeEngine checks the ServerArgs names
        built.append(server_args)
        return FakeEngine(runtime=fresh_runtime, **server_args)

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=engine))
    group = types.SimpleNamespace(
        name="verifier",
        model=model_path,
        backend="sglang_engine",
        dtype="bfloat16",
        backend_options={"mem_fraction_static": 0.3, "gpu_ids": [2], "random_seed": 7, "weight_sync": "disk"},
    )
    backend = make_sglang_backend(group, model=fresh_runtime.model, tokenizer=fresh_runtime.tokenizer)
    assert built == [
        {
            "model_path": model_path,
            "tp_size": 1,
            "base_gpu_id": 2,
            "enable_memory_saver": False,
            "mem_fraction_static": 0.3,
            "random_seed": 7,
            "dtype": "bfloat16",
        }
    ]
    assert backend.weight_sync == "disk" and backend.model_config is fresh_runtime.model.config
    backend.close()
    assert backend.engine.shut_down  # the backend built the engine, so it shuts it down

    group.backend_options = {"mem_fraction": 0.3}
    with pytest.raises(ValueError, match=r"no option 'mem_fraction'. Did you mean 'mem_fraction_static'"):
        make_sglang_backend(group)
    group.backend_options = {"gpu_ids": [0, 1], "tp_size": 1}
    with pytest.raises(ValueError, match=r"gpu_ids \[0, 1\] must list tp_size=1"):
        make_sglang_backend(group)


# -- the shared backend contract (mas_train.backends.testing) -------------------------------------------------

from mas_train.backends.testing import BackendContract  # noqa: E402


@pytest.fixture(scope="module")
def contract_runtime(tiny_qwen3_path):
    torch.set_num_threads(1)
    return FakeRuntime(tiny_qwen3_path, random_seed=0)


class TestSGLangEngineContract(BackendContract):
    """The contract through a fake 0.5.23 engine: tensor sync inside the begin/end weight-update session."""

    engine_cls = FakeEngine
    weight_sync = "tensor"

    @pytest.fixture
    def make_backend(self, contract_runtime, tiny_qwen3_path, tiny_model_and_tokenizer):
        reference, tok = tiny_model_and_tokenizer
        made = []

        def factory():
            contract_runtime.model.load_state_dict(reference.state_dict())  # fresh weights, version 0
            made.append(
                SGLangEngineBackend(
                    tiny_qwen3_path,
                    engine=self.engine_cls(runtime=contract_runtime),
                    tokenizer=tok,
                    weight_sync=self.weight_sync,
                    tensor_device="cpu",
                    model_config=reference.config,
                )
            )
            return made[-1]

        yield factory
        for b in made:
            b.close()


@pytest.mark.slow
class TestSGLangEngineLegacyDiskContract(TestSGLangEngineContract):
    """The contract through a pre-0.5.23 engine, syncing through update_weights_from_disk (slow: the same
    generation path as above; the sync path alone is covered by the fast tests of this file)."""

    engine_cls = FakeEngineLegacy
    weight_sync = "disk"

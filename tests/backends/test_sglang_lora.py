"""LoRA model groups on the SGLang backends, against the fakes: each request selects the group's adapter by
name, a weight sync writes a PEFT folder and swaps it in with unload + load (never a base-weight update), and
LoRA options that cannot serve the group's adapter are refused before SGLang starts."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
from fastapi.testclient import TestClient

from mas_train import lora as lora_lib
from mas_train.backends.base import SamplingParams
from mas_train.backends.sglang import (
    SGLangEngineBackend,
    SGLangHTTPBackend,
    _server_flags,
    make_sglang_backend,
    write_peft_adapter,
)
from mas_train.config import LoraConfig
from tests.backends.fake_sglang import FakeEngine, make_app

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

CFG = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
FULL_UPDATES = {"update_weights_from_tensor", "update_weights_from_disk", "begin_weight_update"}


@pytest.fixture
def rt(fresh_runtime):
    """The shared fake runtime with no adapters loaded and LoRA off (each test enables what it needs)."""
    fresh_runtime.loras.clear()
    fresh_runtime.requests.clear()
    fresh_runtime.lora_settings.update(
        enable_lora=False, max_lora_rank=None, lora_target_modules=None, max_loras_per_batch=8
    )
    yield fresh_runtime
    fresh_runtime.loras.clear()


@pytest.fixture
def peft(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    torch.manual_seed(0)
    return lora_lib.wrap(copy.deepcopy(model), CFG, "solver").eval()


def _perturb(peft_model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def _greedy_logprobs(model, prompt, completion):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def _check_served_by(peft_model, prompts, outs):
    for p, o in zip(prompts, outs, strict=True):
        assert torch.allclose(
            torch.tensor(o.logprobs), _greedy_logprobs(peft_model, p, o.completion_ids), atol=1e-4
        )


def _sync_round_trip(backend, runtime, peft_model, tok, root):
    prompts = [tok.encode("Hello world"), tok.encode("2 + 2 =")]
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    with pytest.raises(RuntimeError, match="adapter 'solver' is not loaded"):
        backend.generate(prompts, greedy)
    backend.load_adapter(lora_lib.adapter_state(peft_model, "solver"))
    assert backend.weight_version == 0 and runtime.calls == ["load_lora_adapter"]
    before = backend.generate(prompts, greedy)
    assert runtime.requests[-1]["lora_path"] == ["solver", "solver"]
    assert runtime.requests[-1]["served"] == [str(root / "solver-v0")] * 2
    _check_served_by(peft_model, prompts, before)

    _perturb(peft_model, seed=1)
    assert backend.update_weights(lora_lib.adapter_state(peft_model, "solver")) == 1
    assert runtime.calls == ["load_lora_adapter", "unload_lora_adapter", "load_lora_adapter", "flush_cache"]
    after = backend.generate(prompts, greedy)
    assert runtime.requests[-1]["served"] == [str(root / "solver-v1")] * 2
    assert all(o.weight_version == 1 for o in after)
    _check_served_by(peft_model, prompts, after)  # the trained adapter, not the old one nor the base
    assert not torch.allclose(torch.tensor(after[0].logprobs), torch.tensor(before[0].logprobs), atol=1e-3)
    assert (root / "solver-v1" / "adapter_config.json").is_file() and not (root / "solver-v0").exists()

    with pytest.raises(ValueError, match="not one of its tensors"):
        backend.update_weights({"model.embed_tokens.weight": torch.zeros(2, 2)})
    assert backend.weight_version == 1 and not FULL_UPDATES & set(runtime.calls)


def test_engine_lora_requests_name_the_adapter_and_a_sync_serves_the_new_version(
    rt, peft, tiny_model_and_tokenizer, tmp_path
):
    _, tok = tiny_model_and_tokenizer
    engine = FakeEngine(
        runtime=rt, enable_lora=True, max_lora_rank=4, lora_target_modules=["q_proj", "v_proj"]
    )
    backend = SGLangEngineBackend(
        engine=engine, tokenizer=tok, weight_sync="tensor", lora_name="solver", lora=CFG, adapter_dir=tmp_path
    )
    _sync_round_trip(backend, rt, peft, tok, tmp_path)


def test_http_lora_sync_through_load_and_unload_endpoints(rt, peft, tiny_model_and_tokenizer, tmp_path):
    _, tok = tiny_model_and_tokenizer
    rt.lora_settings.update(enable_lora=True, max_lora_rank=8, lora_target_modules=["all"])
    with TestClient(make_app(rt)) as client:
        backend = SGLangHTTPBackend(
            "http://testserver",
            client=client,
            tokenizer=tok,
            weight_dir=tmp_path,
            lora_name="solver",
            lora=CFG,
        )
        backend.check_lora_server()  # rank 8 >= r=4, LoRA on
        _sync_round_trip(backend, rt, peft, tok, tmp_path)
        # the fake refuses names SGLang's request models do not have, as a misspelt payload would be
        assert client.post("/load_lora_adapter", json={"name": "x", "lora_path": "y"}).status_code == 422
        rt.lora_settings["max_lora_rank"] = 2
        with pytest.raises(ValueError, match="--max-lora-rank 2 < lora.r=4"):
            backend.check_lora_server()
        rt.lora_settings["enable_lora"] = False
        with pytest.raises(ValueError, match="runs without --enable-lora"):
            backend.check_lora_server()


def test_failed_load_keeps_serving_the_previous_version(rt, peft, tiny_model_and_tokenizer, tmp_path):
    _, tok = tiny_model_and_tokenizer
    engine = FakeEngine(runtime=rt, enable_lora=True, max_lora_rank=4)
    backend = SGLangEngineBackend(
        engine=engine, tokenizer=tok, lora_name="solver", lora=CFG, adapter_dir=tmp_path
    )
    backend.load_adapter(lora_lib.adapter_state(peft, "solver"))
    real_load = engine.load_lora_adapter

    def refuse_new_versions(lora_name, lora_path, pinned=False):
        if lora_path.endswith("-v1"):
            return types.SimpleNamespace(success=False, error_message="disk full", loaded_adapters={})
        return real_load(lora_name, lora_path, pinned)

    engine.load_lora_adapter = refuse_new_versions
    with pytest.raises(RuntimeError, match=r"^SGLang load_lora_adapter failed: disk full$"):
        backend.update_weights(lora_lib.adapter_state(peft, "solver"))
    # the version stays, the previous folder is loaded again and still served, the refused one is gone
    assert backend.weight_version == 0 and rt.loras["solver"]["lora_path"] == str(tmp_path / "solver-v0")
    assert not (tmp_path / "solver-v1").exists()
    backend.generate([[1, 2]], SamplingParams(max_new_tokens=1))
    assert rt.requests[-1]["served"] == [str(tmp_path / "solver-v0")]


def test_peft_folder_matches_what_peft_saves(peft, tmp_path):
    from safetensors.torch import load_file

    _perturb(peft, seed=2)
    lora_lib.save(peft, "solver", tmp_path / "peft")
    write_peft_adapter(list(lora_lib.adapter_state(peft, "solver").items()), "solver", CFG, tmp_path / "ours")
    theirs, ours = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("peft", "ours"))
    assert sorted(ours) == sorted(theirs) and len(ours) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    from peft import PeftConfig

    cfg = PeftConfig.from_pretrained(str(tmp_path / "ours"))
    assert (cfg.r, cfg.lora_alpha, sorted(cfg.target_modules)) == (4, 8, ["q_proj", "v_proj"])


def _group(model_path, **options):
    return types.SimpleNamespace(
        name="solver",
        model=model_path,
        backend="sglang_engine",
        dtype="auto",
        lora=CFG,
        backend_options=options,
    )


def test_factory_starts_sglang_with_lora_args_and_loads_the_adapter(monkeypatch, rt, peft, model_path):
    built = []

    def engine(**server_args):
        built.append(server_args)
        return FakeEngine(runtime=rt, **server_args)

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=engine))
    backend = make_sglang_backend(_group(model_path, max_loras_per_batch=2), model=peft, tokenizer=None)
    assert {
        k: built[0][k] for k in ("enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch")
    } == {
        "enable_lora": True,
        "max_lora_rank": 4,
        "lora_target_modules": ["q_proj", "v_proj"],
        "max_loras_per_batch": 2,
    }
    assert rt.calls == ["load_lora_adapter"] and list(rt.loras) == [
        "solver"
    ]  # loaded before the first request
    backend.generate([[1, 2]], SamplingParams(max_new_tokens=1))
    assert rt.requests[-1]["lora_path"] == ["solver"]
    backend.close()

    bad = {
        "max_lora_rank": (2, r"max_lora_rank=2 is below its lora.r=4"),
        "enable_lora": (False, r"enable_lora: false"),
        "lora_target_modules": (["q_proj"], r"lack \['v_proj'\] of its lora.target_modules"),
        "engine_kwargs": ({"max_lora_rank": 8}, r"use backend_options.max_lora_rank instead"),
    }
    for key, (value, message) in bad.items():
        with pytest.raises(ValueError, match=message) as err:
            make_sglang_backend(_group(model_path, **{key: value}), model=peft)
        assert "\n" not in str(err.value)
    full = _group(model_path, max_lora_rank=8)
    full.lora = None
    with pytest.raises(ValueError, match=r"has no lora section.*drop backend_options \['max_lora_rank'\]"):
        make_sglang_backend(full)
    assert len(built) == 1  # every refusal came before an engine was built


def test_launch_flags_and_config_refusal():
    assert _server_flags({"enable_lora": True, "max_lora_rank": 4, "lora_target_modules": ["q_proj", "v_proj"]}) == [
        "--enable-lora", "--max-lora-rank", "4", "--lora-target-modules", "q_proj", "v_proj",
    ]  # fmt: skip
    from mas_train.backends.options import SGLangHTTPOptions
    from mas_train.config import ConfigError, parse_args

    with pytest.raises(
        ValueError, match=r"extra_args sets '--max-lora-rank': use backend_options.max_lora_rank"
    ):
        SGLangHTTPOptions(extra_args=["--max-lora-rank", "8"])
    argv = ["--model_sharing", "per_agent", "--model_groups.solver.lora.r", "8"]
    argv += [
        "--model_groups.solver.backend",
        "sglang_http",
        "--model_groups.solver.backend_options.max_lora_rank",
        "4",
    ]
    with pytest.raises(
        ConfigError, match=r"model_groups.solver.backend_options: .*max_lora_rank=4 is below its lora.r=8"
    ):
        parse_args(argv).resolve(["solver", "verifier"])

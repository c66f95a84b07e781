"""Test doubles that speak SGLang 0.5.x's request/response shapes, generating for real with a small HF model.

SGLang needs CUDA, so the SGLang backends are verified here against fakes that reproduce what the real thing
accepts and answers (shapes read in SGLang's sources: ``srt/managers/io_struct.py::GenerateReqInput``,
``srt/sampling/sampling_params.py``, ``srt/managers/schedule_batch.py`` finish reasons,
``srt/entrypoints/http_server.py`` endpoints, ``srt/entrypoints/engine.py`` and
``scheduler_components/weight_updater.py`` for the weight-update session of 0.5.23):

* :class:`FakeRuntime` – the model + the SGLang semantics (sampling-key allow-list, EOS / stop-string / length
  finishing in SGLang's order, ``[logprob, token_id, None]`` triples, ``no_stop_trim``).
* :class:`FakeEngine` – ``sglang.Engine``'s methods (0.5.23: tensor updates need a begin/end session and
  answer ``(success, message)``); :class:`FakeEngineLegacy` – the pre-0.5.23 engine without the session calls.
* :func:`make_app` – a FastAPI app with ``/health``, ``/generate``, ``/update_weights_from_disk``,
  ``/flush_cache``, ``/release_memory_occupation``, ``/resume_memory_occupation``, ``/get_model_info``,
  ``/get_server_info``, ``/load_lora_adapter``, ``/unload_lora_adapter``.
* LoRA as SGLang serves it (``srt/lora/lora_manager.py``, ``srt/lora/lora_registry.py``,
  ``srt/managers/tokenizer_control_mixin.py``): adapters are loaded from PEFT folders under a name, a name
  that is loaded cannot be loaded again, an adapter of a larger rank than ``max_lora_rank`` or with modules
  outside ``lora_target_modules`` is refused, requests name adapters in ``lora_path`` (one per prompt). Each
  load gets a new ``lora_id`` and generates for real with the adapter (PEFT on a copy of the base model), and
  every request records the adapter folder that served each prompt (``requests[i]["served"]``).
* ``python -m tests.backends.fake_sglang --model-path P --port N`` serves that app like
  ``python -m sglang.launch_server`` (same flag names), bound to 127.0.0.1.

Unknown request keys raise, so a backend that sends a name SGLang does not know fails here too.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

# SGLang's SamplingParams.__init__ arguments (srt/sampling/sampling_params.py, 0.5.x)
SGLANG_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
        "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
        "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval", "logit_bias",
        "sampling_seed",
    }
)  # fmt: skip
# GenerateReqInput fields a client may send to /generate (io_struct.py); the fake implements the first four
SGLANG_GENERATE_KEYS = frozenset(
    {
        "text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
        "token_ids_logprob", "return_text_in_logprobs", "stream", "rid", "lora_path", "priority",
        "custom_logit_processor", "return_hidden_states",
    }
)  # fmt: skip
# ServerArgs fields the engine backend passes (srt/server_args.py)
SGLANG_SERVER_ARGS = frozenset(
    {
        "model_path", "tokenizer_path", "mem_fraction_static", "tp_size", "base_gpu_id", "random_seed",
        "enable_memory_saver", "skip_tokenizer_init", "log_level", "dtype", "device", "attention_backend",
        "enable_deterministic_inference", "rl_on_policy_target", "context_length", "port", "host",
        "enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch", "lora_paths",
    }
)  # fmt: skip
# LoadLoRAAdapterReqInput / UnloadLoRAAdapterReqInput fields a client sends (io_struct.py; lora_id is internal)
SGLANG_LORA_LOAD_KEYS = frozenset({"lora_name", "lora_path", "pinned"})
SGLANG_LORA_UNLOAD_KEYS = frozenset({"lora_name"})


class FakeRuntime:
    """A small causal LM behind SGLang's generate semantics.

    Args:
        model_path: Hugging Face folder with ``config.json``, weights and tokenizer.
        random_seed: seed of the sampling generator (SGLang's ``--random-seed``).

    Attributes:
        calls: names of the control calls received, in order (e.g. ``["update_weights_from_disk",
            "flush_cache"]``), for tests to assert the protocol.
        released: whether memory is released (generation then fails, as on a real engine).
    """

    def __init__(self, model_path: str | Path, *, random_seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).eval()
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids = {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]) if e is not None}
        self.generator = torch.Generator().manual_seed(int(random_seed))
        self.calls: list[str] = []
        self.released = False
        self.requests: list[dict] = []
        # ServerArgs LoRA fields (defaults as SGLang's: LoRA off, 8 adapters per batch)
        self.lora_settings: dict[str, Any] = {
            "enable_lora": False,
            "max_lora_rank": None,
            "lora_target_modules": None,
            "max_loras_per_batch": 8,
        }
        self.loras: dict[str, dict[str, Any]] = {}  # lora_name -> {"lora_id", "lora_path", "model"}

    # -- generation -------------------------------------------------------------------------------------

    def generate(
        self,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: dict | list[dict] | None = None,
        return_logprob: bool = False,
        text: Any = None,
        **kwargs: Any,
    ) -> dict | list[dict]:
        """SGLang's ``generate``: a flat ``input_ids`` gives one dict, a nested one a list of dicts."""
        unknown = set(kwargs) - SGLANG_GENERATE_KEYS
        if unknown:
            raise TypeError(f"GenerateReqInput got unknown fields {sorted(unknown)}")
        if self.released:
            raise RuntimeError("memory is released (release_memory_occupation); resume it before generating")
        if text is not None:
            raise NotImplementedError("the fake only takes input_ids (token-in/token-out)")
        if input_ids is None:
            raise ValueError("Either text or input_ids should be provided.")
        single = len(input_ids) == 0 or not isinstance(input_ids[0], list | tuple)
        batch = [list(input_ids)] if single else [list(p) for p in input_ids]
        sp = sampling_params if sampling_params is not None else {}
        sps = sp if isinstance(sp, list) else [sp] * len(batch)
        if len(sps) != len(batch):
            raise ValueError(f"{len(sps)} sampling_params for {len(batch)} prompts")
        names = self._lora_names(kwargs.get("lora_path"), len(batch))
        served = [None if n is None else self.loras[n]["lora_path"] for n in names]
        self.requests.append(
            {
                "input_ids": batch,
                "sampling_params": sps,
                "return_logprob": return_logprob,
                "lora_path": kwargs.get("lora_path"),
                "served": served,
            }
        )
        models = [self.model if n is None else self.loras[n]["model"] for n in names]
        outs = [
            self._generate_one(p, s, bool(return_logprob), m)
            for p, s, m in zip(batch, sps, models, strict=True)
        ]
        return outs[0] if single else outs

    def _lora_names(self, lora_path: Any, n: int) -> list[str | None]:
        if lora_path is None:
            return [None] * n
        names = [lora_path] * n if isinstance(lora_path, str) else list(lora_path)
        if len(names) != n:
            raise ValueError(f"lora_path has {len(names)} entries for {n} prompts")
        if any(x is not None for x in names) and not self.lora_settings["enable_lora"]:
            raise ValueError("LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        for name in names:
            if name is not None and name not in self.loras:
                raise ValueError(
                    f"The following requested LoRA adapters are not loaded: {name}\n"
                    f"Loaded adapters: {self.loras.keys()}."
                )
        return names

    # -- LoRA (LoRAUpdateOutput answers: success, error_message, loaded_adapters) ---------------------------

    def _lora_result(self, success: bool, error_message: str | None = None) -> dict[str, Any]:
        loaded = {k: v["lora_path"] for k, v in self.loras.items()}
        return {"success": success, "error_message": error_message, "loaded_adapters": loaded}

    def load_lora(self, lora_name: str, lora_path: str, pinned: bool = False) -> dict[str, Any]:
        import copy

        from peft import PeftConfig, PeftModel

        self.calls.append("load_lora_adapter")
        settings = self.lora_settings
        if not settings["enable_lora"]:
            return self._lora_result(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if lora_name in self.loras:
            return self._lora_result(
                False, f"Failed to load LoRA adapter {lora_name} because it is already loaded"
            )
        try:
            config = PeftConfig.from_pretrained(str(lora_path))
        except Exception as e:  # noqa: BLE001 - SGLang reports any load failure in error_message
            return self._lora_result(False, str(e))
        rank, targets = settings["max_lora_rank"], settings["lora_target_modules"]
        too_big = rank is not None and int(config.r) > int(rank)
        outside = (
            targets is not None and "all" not in targets and not set(config.target_modules) <= set(targets)
        )
        if too_big or outside:
            return self._lora_result(
                False,
                f"LoRA adapter {lora_name} with rank {config.r} is incompatible with the current LoRA memory pool "
                "configuration. Please ensure that the LoRA adapter's rank is within the configured "
                "`--max-lora-rank` and that the target modules are included in `--lora-target-modules`.",
            )
        model = PeftModel.from_pretrained(copy.deepcopy(self.model), str(lora_path)).eval()
        self.loras[lora_name] = {"lora_id": uuid.uuid4().hex, "lora_path": str(lora_path), "model": model}
        return self._lora_result(True)

    def unload_lora(self, lora_name: str) -> dict[str, Any]:
        self.calls.append("unload_lora_adapter")
        if lora_name not in self.loras:
            return self._lora_result(False, f"LoRA adapter {lora_name} is not loaded")
        del self.loras[lora_name]
        return self._lora_result(True)

    @torch.no_grad()
    def _generate_one(self, prompt: list[int], sp: dict, return_logprob: bool, model: Any = None) -> dict:
        unknown = set(sp) - SGLANG_SAMPLING_KEYS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {sorted(unknown)}")
        max_new = int(sp.get("max_new_tokens", 128))
        temperature = float(sp.get("temperature", 1.0))
        top_p = float(sp.get("top_p", 1.0))
        top_k = int(sp.get("top_k", -1))
        stops = sp.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        stop_ids = set(sp.get("stop_token_ids") or [])
        if not sp.get("ignore_eos", False):
            stop_ids |= self.eos_ids
        gen = self.generator
        if sp.get("sampling_seed") is not None:
            gen = torch.Generator().manual_seed(int(sp["sampling_seed"]))

        started = time.perf_counter()
        out_ids: list[int] = []
        lps: list[float] = []
        finish: dict = {}
        past = None
        step_input = torch.tensor([prompt])
        while True:
            res = (model or self.model)(input_ids=step_input, cache=past, use_cache=True)
            past = res.cache
            logits = res.logits[0, -1].float()
            if temperature == 0:
                # greedy: SGLang returns the unscaled log_softmax (srt/layers/sampler.py)
                tok = int(torch.argmax(logits))
                lp = float(torch.log_softmax(logits, -1)[tok])
            else:
                logp = torch.log_softmax(logits / temperature, -1)
                probs = logp.exp()
                if top_k > 0:
                    kth = torch.topk(probs, min(top_k, probs.numel())).values[-1]
                    probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
                if top_p < 1.0:
                    sorted_p, idx = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
                    mask = torch.zeros_like(probs, dtype=torch.bool)
                    mask[idx[keep]] = True
                    probs = torch.where(mask, probs, torch.zeros_like(probs))
                tok = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
                lp = float(logp[tok])
            out_ids.append(tok)
            lps.append(lp)
            step_input = torch.tensor([[tok]])
            # Req.check_finished order in SGLang: length, then matched token, then stop strings
            if len(out_ids) >= max_new:
                finish = {"type": "length", "length": max_new}
                break
            if tok in stop_ids:
                finish = {"type": "stop", "matched": tok}
                break
            if stops:
                decoded = self.tokenizer.decode(out_ids, skip_special_tokens=False)
                hit = next((s for s in stops if s in decoded), None)
                if hit is not None:
                    finish = {"type": "stop", "matched": hit}
                    break

        text = self.tokenizer.decode(out_ids, skip_special_tokens=bool(sp.get("skip_special_tokens", True)))
        if not sp.get("no_stop_trim", False) and isinstance(finish.get("matched"), str):
            text = text[: text.find(finish["matched"])]
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out_ids),
            "cached_tokens": 0,
            "e2e_latency": time.perf_counter() - started,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, out_ids, strict=True)]
        return {"text": text, "output_ids": out_ids, "meta_info": meta}

    # -- weights / memory ---------------------------------------------------------------------------------

    def load_named_tensors(self, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> tuple[bool, str]:
        params = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        for name, t in named_tensors:
            target = params.get(name, buffers.get(name))
            if target is None:
                return False, f"Failed to update weights: parameter {name} not found in the model"
            if tuple(target.shape) != tuple(t.shape):
                return False, f"Failed to update weights: shape mismatch for {name}: {tuple(t.shape)}"
            with torch.no_grad():
                target.copy_(t.to(target.dtype))
        return True, "Success"

    def load_from_disk(self, model_path: str) -> tuple[bool, str]:
        from safetensors.torch import load_file

        folder = Path(model_path)
        files = sorted(folder.glob("*.safetensors"))
        if not (folder / "config.json").is_file() or not files:
            return False, f"Failed to get the model from {model_path}: no config.json / *.safetensors"
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        return self.load_named_tensors(list(state.items()))

    def flush_cache(self) -> bool:
        self.calls.append("flush_cache")
        return True


class FakeEngineLegacy:
    """``sglang.Engine`` before 0.5.23: no ``begin_weight_update``/``end_weight_update``.

    Keyword arguments are checked against SGLang ``ServerArgs`` names; ``model_path`` loads the model unless a
    ``runtime=`` is shared in.
    """

    def __init__(self, runtime: FakeRuntime | None = None, **server_args: Any) -> None:
        unknown = set(server_args) - SGLANG_SERVER_ARGS
        if unknown:
            raise TypeError(f"ServerArgs got unexpected keyword arguments {sorted(unknown)}")
        self.server_args = server_args
        if runtime is None:
            runtime = FakeRuntime(server_args["model_path"], random_seed=server_args.get("random_seed") or 0)
        self.runtime = runtime
        self.shut_down = False
        for key in ("enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch"):
            if server_args.get(key) is not None:
                runtime.lora_settings[key] = server_args[key]

    def generate(self, prompt: Any = None, sampling_params: Any = None, input_ids: Any = None, **kw: Any):
        return self.runtime.generate(input_ids=input_ids, sampling_params=sampling_params, text=prompt, **kw)

    def _tensor_update_allowed(self) -> tuple[bool, str]:
        return True, ""

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.runtime.calls.append("update_weights_from_tensor")
        ok, msg = self._tensor_update_allowed()
        if not ok:
            return False, msg
        ok, msg = self.runtime.load_named_tensors(list(named_tensors))
        if ok and flush_cache:
            self.runtime.flush_cache()
        return ok, msg

    def update_weights_from_disk(self, model_path: str, load_format=None):
        self.runtime.calls.append("update_weights_from_disk")
        ok, msg = self.runtime.load_from_disk(model_path)
        return ok, msg, 0

    def flush_cache(self):
        return SimpleNamespace(success=self.runtime.flush_cache())

    def load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False):
        return SimpleNamespace(**self.runtime.load_lora(lora_name, lora_path, pinned))

    def unload_lora_adapter(self, lora_name: str):
        return SimpleNamespace(**self.runtime.unload_lora(lora_name))

    def release_memory_occupation(self, tags=None):
        if not self.server_args.get("enable_memory_saver"):
            raise RuntimeError("release_memory_occupation needs enable_memory_saver=True")
        self.runtime.calls.append("release_memory_occupation")
        self.runtime.released = True

    def resume_memory_occupation(self, tags=None):
        self.runtime.calls.append("resume_memory_occupation")
        self.runtime.released = False

    def shutdown(self):
        self.shut_down = True


class FakeEngine(FakeEngineLegacy):
    """``sglang.Engine`` 0.5.23+: ``update_weights_from_tensor`` fails outside a begin/end weight-update session."""

    def __init__(self, runtime: FakeRuntime | None = None, **server_args: Any) -> None:
        super().__init__(runtime, **server_args)
        self.session_open = False

    def begin_weight_update(self, selector: str = "all"):
        if self.session_open:
            return False, "begin_weight_update called while a weight-update session is already open"
        self.runtime.calls.append("begin_weight_update")
        self.session_open = True
        return True, "Success"

    def end_weight_update(self):
        if not self.session_open:
            return False, "end_weight_update called without begin_weight_update"
        self.runtime.calls.append("end_weight_update")
        self.session_open = False
        return True, "Success"

    def _tensor_update_allowed(self) -> tuple[bool, str]:
        if not self.session_open:
            return False, "update_weights_from_tensor requires an open begin_weight_update session"
        return True, ""


def make_app(runtime: FakeRuntime):
    """A FastAPI app with the SGLang HTTP endpoints the HTTP backend uses, answering in SGLang's shapes."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def get_model_info() -> dict:
        return {"model_path": runtime.model_path, "is_generation": True}

    @app.get("/get_server_info")
    async def get_server_info() -> dict:
        return {"model_path": runtime.model_path, **runtime.lora_settings}

    def _lora_call(body: Any, allowed: frozenset, required: tuple, call):
        unknown = set(body) - allowed if isinstance(body, dict) else {"<not an object>"}
        missing = [k for k in required if not isinstance(body, dict) or k not in body]
        if unknown or missing:  # SGLang's request model: 422 on a missing field (stricter here on extras)
            return JSONResponse({"detail": f"unknown {sorted(unknown)}, missing {missing}"}, status_code=422)
        result = call(**body)
        return JSONResponse(result, status_code=200 if result["success"] else 400)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await request.json()
        return _lora_call(body, SGLANG_LORA_LOAD_KEYS, ("lora_name", "lora_path"), runtime.load_lora)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        body = await request.json()
        return _lora_call(body, SGLANG_LORA_UNLOAD_KEYS, ("lora_name",), runtime.unload_lora)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        body = await request.json()
        try:
            return runtime.generate(**body)
        except (TypeError, ValueError, RuntimeError) as e:
            # http_server._create_error_response: {"error": {"message": ...}} with 400
            return JSONResponse({"error": {"message": str(e)}}, status_code=400)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await request.json()
        runtime.calls.append("update_weights_from_disk")
        ok, msg = runtime.load_from_disk(body["model_path"])
        content = {"success": ok, "message": msg, "num_paused_requests": 0}
        return JSONResponse(content, status_code=200 if ok else 400)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        ok = runtime.flush_cache()
        return Response(content="Cache flushed.\n", status_code=200 if ok else 400)

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release_memory_occupation(request: Request):
        runtime.calls.append("release_memory_occupation")
        runtime.released = True
        return None

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume_memory_occupation(request: Request):
        runtime.calls.append("resume_memory_occupation")
        runtime.released = False
        return None

    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Serve :func:`make_app` like ``python -m sglang.launch_server`` (flags it does not need are accepted)."""
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--enable-memory-saver", action="store_true")
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int, default=None)
    p.add_argument("--lora-target-modules", nargs="*", default=None)
    p.add_argument("--max-loras-per-batch", type=int, default=8)
    args = p.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost"):
        raise SystemExit("the fake SGLang server binds to 127.0.0.1 only")
    torch.set_num_threads(1)
    runtime = FakeRuntime(args.model_path, random_seed=args.random_seed)
    runtime.lora_settings.update(
        enable_lora=args.enable_lora,
        max_lora_rank=args.max_lora_rank,
        lora_target_modules=args.lora_target_modules,
        max_loras_per_batch=args.max_loras_per_batch,
    )
    uvicorn.run(make_app(runtime), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()


def script_model(model: torch.nn.Module, chain: Sequence[int], *, strength: float = 20.0) -> None:
    """Make a Llama/Qwen-style causal LM deterministically continue ``chain[i]`` with ``chain[i + 1]``.

    Zeroes every attention ``o_proj`` and MLP ``down_proj`` so each position's final hidden state is its own
    token embedding, gives ``chain[i]`` the one-hot embedding ``e_i`` and points the LM-head row of
    ``chain[i + 1]`` at ``e_i``. After RMSNorm (all-ones weight) the logit of the next chain token is
    ``strength * sqrt(hidden_size)`` and every other logit 0, so sampling follows the chain with probability
    ~1 at any temperature <= 1. Used to make completions hit stop strings / EOS on cue.

    Raises:
        ValueError: ``chain`` repeats a token or is longer than the hidden size.
    """
    chain = [int(t) for t in chain]
    if len(set(chain)) != len(chain):
        raise ValueError("chain tokens must be distinct")
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hidden = inner.embed_tokens.weight.shape[1]
    if len(chain) > hidden:
        raise ValueError(f"chain longer than hidden size {hidden}")
    with torch.no_grad():
        for layer in inner.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        inner.norm.weight.fill_(1.0)
        inner.embed_tokens.weight.zero_()
        head = model.get_output_embeddings().weight
        head.zero_()
        for i, tok in enumerate(chain):
            inner.embed_tokens.weight[tok, i] = 1.0
            if i + 1 < len(chain):
                head[chain[i + 1], i] = strength

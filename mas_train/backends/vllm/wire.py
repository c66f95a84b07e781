"""vLLM wire mapping: our :class:`SamplingParams` to ``/v1/completions`` fields, one answer choice to a
:class:`GenerationOutput`, and where the vLLM environment's Python is. The vLLM 0.32 shapes relied on are listed
in :mod:`mas_train.backends.vllm`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from mas_train.backends.base import FinishReason, GenerationOutput, SamplingParams
from mas_train.backends.checks import earliest_stop

__all__ = [
    "SETUP_HINT",
    "VLLM_LORA_RANKS",
    "VLLM_SERVER_MODULE",
    "find_vllm_python",
    "parse_vllm_choice",
    "to_vllm_request",
]

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SETUP_HINT = (
    "make a vLLM environment with scripts/setup_vllm_cpu.sh and point backend_options.python (or "
    "MAS_VLLM_PYTHON) at the Python it prints"
)
#: --max-lora-rank values vLLM 0.32 accepts (vllm/config/lora.py); a group's lora.r is rounded up to one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def find_vllm_python(python: str | os.PathLike | None = None) -> Path:
    """The Python of the vLLM environment: ``python``, else ``$MAS_VLLM_PYTHON``, else ``.venv-vllm/bin/python``
    under the working directory.

    Raises:
        FileNotFoundError: that file does not exist (the message says how to make the environment).
    """
    where = "backend_options.python"
    if python is None and os.environ.get("MAS_VLLM_PYTHON"):
        python, where = os.environ["MAS_VLLM_PYTHON"], "MAS_VLLM_PYTHON"
    if python is None:
        python, where = Path.cwd() / ".venv-vllm" / "bin" / "python", "the default .venv-vllm/bin/python"
    path = Path(python).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no vLLM Python at {path} ({where}): {SETUP_HINT}")
    return path


def to_vllm_request(sampling: SamplingParams) -> dict[str, Any]:
    """The ``/v1/completions`` fields of one :class:`SamplingParams` (everything but ``model`` and ``prompt``).

    Penalties and ``min_p`` are set to their neutral values explicitly: vLLM fills unset fields from the
    model's ``generation_config.json``, which would sample from another distribution than the one asked for.
    """
    req: dict[str, Any] = {
        "max_tokens": int(sampling.max_new_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": max(int(sampling.top_k), 0),  # 0 = off in vLLM
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "n": 1,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "stream": False,
    }
    if sampling.stop:
        req["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        req["seed"] = int(sampling.seed)
    return req


def parse_vllm_choice(
    choice: Mapping[str, Any],
    sampling: SamplingParams,
    *,
    weight_version: int,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> GenerationOutput:
    """One ``/v1/completions`` choice as a :class:`GenerationOutput`.

    An EOS on the last allowed token reads ``"length"`` in vLLM (it checks the length cap first); it is
    ``"stop"`` here. With a ``tokenizer`` the completion is cut right after the token that first completes a
    stop string, should the server have generated further.

    Raises:
        RuntimeError: no ``token_ids`` (the request needs ``return_token_ids``), missing logprobs, or ids and
            logprobs of different lengths.
    """
    ids = choice.get("token_ids")
    if ids is None:
        raise RuntimeError("vLLM answer has no choices[].token_ids; the server must support return_token_ids")
    ids = [int(t) for t in ids]
    lps_raw = (choice.get("logprobs") or {}).get("token_logprobs")
    if lps_raw is None or len(lps_raw) != len(ids) or any(lp is None for lp in lps_raw):
        raise RuntimeError(
            f"vLLM answer has {0 if lps_raw is None else len(lps_raw)} token logprobs for {len(ids)} tokens; "
            "cannot align logprobs with completion ids"
        )
    logprobs = [float(lp) for lp in lps_raw]
    finish_raw = choice.get("finish_reason")
    if finish_raw not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a request with {finish_raw!r}: {choice.get('stop_reason')!r}")
    finish: FinishReason = "stop" if finish_raw == "stop" else "length"
    reason = choice.get("stop_reason")
    stop_string = reason if finish == "stop" and isinstance(reason, str) and reason in sampling.stop else None
    eos = getattr(tokenizer, "eos_token_id", None)
    if finish == "length" and ids and eos is not None and ids[-1] == eos:
        finish = "stop"
    cut = earliest_stop(ids, sampling.stop, tokenizer)
    if cut is not None:
        i, s = cut
        ids, logprobs = ids[: i + 1], logprobs[: i + 1]
        finish, stop_string = "stop", s
    if len(ids) > sampling.max_new_tokens:
        raise RuntimeError(f"vLLM returned {len(ids)} tokens > max_new_tokens={sampling.max_new_tokens}")
    return GenerationOutput(
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason=finish,
        weight_version=weight_version,
        stop_string=stop_string,
        meta={"text": choice.get("text"), "vllm_stop_reason": reason},
    )

"""Generation backends behind one protocol (:class:`GenerationBackend`): token ids in, ids + logprobs out.

``make_backend`` builds one by name; heavy modules (torch for ``hf``, httpx/sglang for the SGLang backends) are
imported only when that backend is asked for.
"""

from __future__ import annotations

from typing import Any

from mas_train.backends.base import FinishReason, GenerationBackend, GenerationOutput, SamplingParams

__all__ = [
    "BACKEND_KINDS",
    "FinishReason",
    "GenerationBackend",
    "GenerationOutput",
    "SamplingParams",
    "make_backend",
]

BACKEND_KINDS = ("hf", "sglang_engine", "sglang_http")
_SGLANG_HINT = (
    "the SGLang backends live in mas_train.backends.sglang and need the gpu extra: pip install 'mas-rl[gpu]' "
    "(sglang_http only needs httpx: pip install httpx)"
)


def make_backend(kind: Any, model: Any = None, tokenizer: Any = None, **kwargs: Any) -> GenerationBackend:
    """Build a generation backend.

    Args:
        kind: ``"hf"``, ``"sglang_engine"`` or ``"sglang_http"``; or a model-group config object with
            ``backend`` and (optionally) ``backend_kwargs`` attributes, whose kwargs are merged under ``kwargs``.
        model: the model group's ``transformers`` model. ``hf`` samples with it (a private copy by default);
            ``sglang_engine`` takes its ``config`` (for the disk weight-sync fallback) and, unless
            ``model_path=`` is given, its ``name_or_path`` as the folder the engine serves.
        tokenizer: the model group's tokenizer.
        **kwargs: passed to the backend's constructor (:class:`~mas_train.backends.hf.HFBackend`,
            ``SGLangEngineBackend``, ``SGLangHTTPBackend``).

    Raises:
        ValueError: unknown ``kind``.
        ImportError: the backend's optional dependencies are missing (the message has the pip line).
    """
    if not isinstance(kind, str) and kind.backend in ("sglang_engine", "sglang_http") and not kwargs:
        # a model-group config: its backend_kwargs (gpu_ids, port, url, ...) are mapped by the SGLang factory
        from mas_train.backends.sglang import make_sglang_backend

        return make_sglang_backend(kind, model, tokenizer)
    if not isinstance(kind, str):
        kwargs = {**dict(getattr(kind, "backend_kwargs", None) or {}), **kwargs}
        kind = kind.backend
    if kind == "hf":
        if model is None or tokenizer is None:
            raise ValueError("the hf backend needs model= and tokenizer=")
        from mas_train.backends.hf import HFBackend

        return HFBackend(model, tokenizer, **kwargs)
    if kind in ("sglang_engine", "sglang_http"):
        try:
            from mas_train.backends import sglang
        except ImportError as err:
            raise ImportError(f"backend {kind!r}: {_SGLANG_HINT} ({err})") from err
        if kind == "sglang_engine":
            if model is not None:
                kwargs.setdefault("model_path", getattr(model, "name_or_path", None))
                kwargs.setdefault("model_config", getattr(model, "config", None))
            return sglang.SGLangEngineBackend(tokenizer=tokenizer, **kwargs)
        if model is not None:
            kwargs.setdefault("model_config", getattr(model, "config", None))
        return sglang.SGLangHTTPBackend(tokenizer=tokenizer, **kwargs)
    raise ValueError(f"unknown backend {kind!r}; choose one of {list(BACKEND_KINDS)}")

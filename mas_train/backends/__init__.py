"""Generation backends behind one protocol (:class:`GenerationBackend`): token ids in, ids + logprobs out.

The registry maps a backend kind to its options dataclass (:mod:`mas_train.backends.options`), a factory and
whether the kind can train (serve updated weights). :func:`make_backend` builds one; heavy modules (torch for
``hf``, httpx/sglang for the SGLang kinds, httpx for ``vllm_http``, openai for ``openai``) are imported only when that kind is built.
A third-party backend registers itself with :func:`register_backend` and checks itself with
:mod:`mas_train.backends.testing`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast, overload

from mas_train.backends.base import (
    BackendOptions,
    FinishReason,
    GenerationBackend,
    GenerationOutput,
    SamplingParams,
)
from mas_train.backends.options import (
    HFOptions,
    OpenAIOptions,
    SGLangEngineOptions,
    SGLangHTTPOptions,
    VLLMHTTPOptions,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from mas_train.config import ResolvedModelGroup


__all__ = [
    "BACKEND_KINDS",
    "BackendKind",
    "FinishReason",
    "GenerationBackend",
    "GenerationOutput",
    "SamplingParams",
    "backend_kind",
    "make_backend",
    "register_backend",
]


@dataclass(frozen=True)
class BackendKind:
    """One registered backend kind.

    Attributes:
        name: the config's ``backend`` value.
        options: its options dataclass (validated from ``backend_options`` at config time).
        factory: ``"module:function"`` (imported on first use) or a callable
            ``factory(options, model, tokenizer, group) -> GenerationBackend``; ``group`` is the resolved model
            group (``name``, ``model``, ``dtype``) or ``None``.
        can_train: ``False`` for kinds whose weights we cannot update (a remote API); the config refuses them on a
            trainable model group.
        install_hint: appended to the ``ImportError`` when the factory's packages are missing.
    """

    name: str
    options: type
    factory: str | Callable[..., GenerationBackend]
    can_train: bool = True
    install_hint: str = ""

    def load_factory(self) -> Callable[..., GenerationBackend]:
        if callable(self.factory):
            return self.factory
        module, _, attr = self.factory.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as err:
            hint = f"; {self.install_hint}" if self.install_hint else ""
            raise ImportError(f"backend {self.name!r} cannot be loaded ({err}){hint}") from err


_REGISTRY: dict[str, BackendKind] = {}


def register_backend(
    name: str,
    options: type,
    factory: str | Callable[..., GenerationBackend],
    *,
    can_train: bool = True,
    install_hint: str = "",
) -> BackendKind:
    """Register (or replace) a backend kind; ``options`` must be a dataclass. Returns the entry."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"options of backend {name!r} must be a dataclass, got {options!r}")
    kind = BackendKind(name, options, factory, can_train, install_hint)
    _REGISTRY[name] = kind
    return kind


def backend_kind(name: str) -> BackendKind:
    """The registry entry of ``name``.

    Raises:
        ValueError: unknown kind (the message lists the kinds, with close matches).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=2, cutoff=0.6)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown backend {name!r}; choose one of {list(_REGISTRY)}.{hint}") from None


def _make_hf(
    options: HFOptions,
    model: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase | None,
    group: ResolvedModelGroup | None = None,
) -> GenerationBackend:
    if model is None or tokenizer is None:
        raise ValueError("the hf backend needs the model group's model and tokenizer")
    import torch

    from mas_train.backends.hf import HFBackend

    kwargs = dataclasses.asdict(options)
    if kwargs["share_model"] is None:
        on_cpu = next(model.parameters()).device.type == "cpu"
        kwargs["share_model"] = on_cpu and kwargs["device"] is None and kwargs["dtype"] is None
    if kwargs["dtype"] is not None:
        kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    return HFBackend(model, tokenizer, **kwargs)


def _make_openai(
    options: OpenAIOptions,
    model: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase | None,
    group: ResolvedModelGroup | None = None,
) -> GenerationBackend:
    from mas_train.backends.openai import OpenAIBackend

    return OpenAIBackend(options, tokenizer)


_SGLANG_HINT = (
    "the SGLang backends need the gpu extra: pip install 'mas-rl[gpu]' (sglang_http only needs httpx: "
    "pip install httpx)"
)
register_backend("hf", HFOptions, _make_hf)
register_backend(
    "sglang_engine",
    SGLangEngineOptions,
    "mas_train.backends.sglang:make_from_options",
    install_hint=_SGLANG_HINT,
)
register_backend(
    "sglang_http", SGLangHTTPOptions, "mas_train.backends.sglang:make_from_options", install_hint=_SGLANG_HINT
)
register_backend(
    "vllm_http",
    VLLMHTTPOptions,
    "mas_train.backends.vllm:make_from_options",
    install_hint="vllm_http needs httpx here (pip install httpx) and vLLM in its own environment: "
    "scripts/setup_vllm_cpu.sh",
)
register_backend("openai", OpenAIOptions, _make_openai, can_train=False, install_hint="pip install openai")

#: The built-in kinds, in registry order (the config's ``backend`` choices; see :func:`backend_kind`).
BACKEND_KINDS: tuple[str, ...] = tuple(_REGISTRY)


def build_options(kind: str, options: BackendOptions | Mapping[str, object] | None = None) -> BackendOptions:
    """``options`` as an instance of ``kind``'s options dataclass: ``None`` = its defaults; a mapping is passed
    as keyword arguments; an instance of the class is returned as it is.

    Raises:
        ValueError: unknown kind, unknown option (with close matches) or an invalid value.
        TypeError: an options object of another kind's class.
    """
    cls = backend_kind(kind).options
    if isinstance(options, cls):
        return cast(BackendOptions, options)  # an instance of the kind's registered dataclass
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options of backend {kind!r} must be a {cls.__name__} or a mapping, got {options!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    for key in options:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=2, cutoff=0.6)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"backend {kind!r} has no option {key!r}.{hint} Its options: {', '.join(names)}")
    built: BackendOptions = cls(**options)
    return built


@overload
def make_backend(
    kind: ResolvedModelGroup,
    options: PreTrainedModel | None = None,
    model: PreTrainedTokenizerBase | None = None,
) -> GenerationBackend: ...


@overload
def make_backend(
    kind: str,
    options: BackendOptions | Mapping[str, object] | None = None,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    group: ResolvedModelGroup | None = None,
) -> GenerationBackend: ...


def make_backend(
    kind: str | ResolvedModelGroup,
    options: object = None,
    model: object = None,
    tokenizer: object = None,
    *,
    group: ResolvedModelGroup | None = None,
) -> GenerationBackend:
    """Build a generation backend.

    Two call forms:

    * ``make_backend(kind, options, model, tokenizer, group=None)``: ``kind`` a registered name; ``options``
      an instance of its options class (:mod:`mas_train.backends.options`), a mapping, or ``None`` (defaults).
    * ``make_backend(group, model, tokenizer)``: ``group`` a resolved model group
      (:class:`mas_train.config.ResolvedModelGroup`) whose ``backend`` and ``backend_options`` are used.

    Args:
        model: the model group's ``transformers`` model. ``hf`` samples with it (a private copy by default);
            the SGLang kinds take its ``config`` for the disk weight sync and, without a group, its
            ``name_or_path`` as the folder the engine serves.
        tokenizer: the model group's tokenizer.
        group: the resolved model group (``name``, ``model``, ``dtype``) for factories that need them.

    Raises:
        ValueError: unknown kind or option, an invalid option value.
        ImportError: the kind's optional packages are missing (the message has the pip line).
    """
    if not isinstance(kind, str):
        group, model, tokenizer = kind, options, model
        kind = group.backend
        options = getattr(group, "backend_options", None)
    spec = backend_kind(kind)
    # build_options refuses (TypeError) anything but the kind's options class or a mapping
    built = build_options(kind, cast("BackendOptions | Mapping[str, object] | None", options))
    return spec.load_factory()(built, model, tokenizer, group)

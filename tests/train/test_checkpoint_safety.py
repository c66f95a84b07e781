"""Checkpoints are data, never code, and every save leaves a resumable run.

* A pickle planted in ``trainer_state.pt`` or a group's ``optimizer.pt`` / ``scheduler.pt`` is refused by
  ``mas-train --resume`` with one ``error:`` line, before any model is loaded, and runs nothing.
* A checkpoint written before RNG states were stored as tensors (NumPy's key as an ndarray, no manifest)
  still resumes.
* A save killed at any stage (a real ``os._exit`` in a forked child) leaves the newest complete checkpoint
  for ``--resume``: a re-save of an existing step never deletes the old copy first, an incomplete newest folder
  is skipped with a warning, and the ``.tmp-`` / ``.old-`` leftovers of dead processes are tidied.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mas_train import checkpoint as ck
from mas_train.checkpoint import find_checkpoint, list_checkpoints, load_trainer_state, save_checkpoint


class _Planted:
    """Unpickling this runs ``touch <path>`` (what a malicious checkpoint does)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


# -- a fake pool: one group whose save() writes what a real group writes (weights folder, .pt, state.json) --


class _Worker:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def save(self, folder: str) -> None:
        f = Path(folder)
        (f / "model").mkdir(parents=True)
        (f / "model" / "config.json").write_text(json.dumps({"marker": self.marker}))
        (f / "model" / "model.safetensors").write_bytes(b"w" * 4096)
        m = torch.nn.Linear(4, 4)
        opt = torch.optim.AdamW(m.parameters())
        m(torch.ones(1, 4)).sum().backward()
        opt.step()
        torch.save(opt.state_dict(), f / "optimizer.pt")
        torch.save({"last_epoch": 1}, f / "scheduler.pt")
        (f / "state.json").write_text(json.dumps({"global_step": 1, "updates": 1, "marker": self.marker}))


class _Pool:
    groups = ["shared"]

    def __init__(self, marker: str) -> None:
        self._w = _Worker(marker)

    def worker(self, g):
        return self._w


def _save(run: Path, step: int, marker: str) -> Path:
    return save_checkpoint(run, step, _Pool(marker), {"marker": marker, "rng": ck.rng_state()}, "x: 1\n")


def _marker(ckpt: Path) -> str:
    return json.loads((ckpt / "groups" / "shared" / "state.json").read_text())["marker"]


# -- 1. no code from a checkpoint -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trainer_state.pt", "groups/shared/optimizer.pt"])
def test_load_refuses_a_planted_pickle_and_runs_nothing(tmp_path, name):
    ckpt = _save(tmp_path / "run", 1, "a")
    sentinel = tmp_path / "PWNED"
    torch.save({"step": 1, "evil": _Planted(sentinel)}, ckpt / name)
    with pytest.raises(
        ck.UnsafeCheckpointError, match=r"refusing to load .*posix\.system|refusing to load .*os"
    ):
        load_trainer_state(ckpt)
    with pytest.raises(ck.UnsafeCheckpointError, match="refusing to load"):
        ck.load_state(ckpt / name)
    assert not sentinel.exists()


def test_rng_state_round_trips_through_the_safe_loader(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    torch.save({"rng": ck.rng_state()}, tmp_path / "s.pt")
    want = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    ck.set_rng_state(ck.load_state(tmp_path / "s.pt")["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == want
    # an old-format state (NumPy's key as an ndarray, as the previous save code wrote it) loads as well
    np.random.seed(4)
    torch.save({"numpy": np.random.get_state()}, tmp_path / "old.pt")
    np.random.seed(0)
    ck.set_rng_state({**ck.rng_state(), "numpy": ck.load_state(tmp_path / "old.pt")["numpy"]})
    assert float(np.random.rand()) == want[1]


# -- the real command: mas-train --resume on a planted / an old-format checkpoint ----------------------------

TINY = [
    "--env", "math-2agent", "--model", "tiny-qwen3", "--num_generations", "2", "--tasks_per_step", "1",
    "--sampling.max_new_tokens", "4", "--eval_steps", "0", "--report_to", "jsonl", "--save_steps", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    pytest.importorskip("trl")
    from mas_train.cli import train_main

    out = tmp_path_factory.mktemp("runs")
    code = train_main([*TINY, "--max_steps", "1", "--output_dir", str(out), "--run_name", "r"])
    assert code == 0
    return out / "r"


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "runs" / run.name
    shutil.copytree(run, dst)
    return dst


@pytest.mark.parametrize(
    "name", ["trainer_state.pt", "groups/shared/optimizer.pt", "groups/shared/scheduler.pt"]
)
def test_mas_train_resume_refuses_a_planted_pickle(trained_run, tmp_path, capsys, name):
    from mas_train.cli import train_main

    run = _copy(trained_run, tmp_path)
    ckpt = list_checkpoints(run)[-1]
    sentinel = tmp_path / "PWNED"
    torch.save({"step": 1, "evil": _Planted(sentinel)}, ckpt / name)
    ck.write_manifest(ckpt)  # an attacker keeps the folder looking complete
    code = train_main([*TINY, "--max_steps", "2", "--resume", str(run)])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2, err
    assert lines[0].startswith("mas-train: error: refusing to load") and name in lines[0], err
    assert len([x for x in lines if "error:" in x]) == 1 and "Traceback" not in err
    assert not sentinel.exists()


def test_mas_train_resumes_a_checkpoint_in_the_previous_format(trained_run, tmp_path, capsys):
    """What the previous save code wrote: NumPy's RNG state with its ndarray key, no manifest.json."""
    from mas_train.cli import train_main

    run = _copy(trained_run, tmp_path)
    ckpt = list_checkpoints(run)[-1]
    state = ck.load_state(ckpt / "trainer_state.pt")
    np.random.seed(11)
    state["rng"]["numpy"] = np.random.get_state()
    torch.save(state, ckpt / "trainer_state.pt")
    (ckpt / "manifest.json").unlink()
    assert list_checkpoints(run) == [ckpt]
    code = train_main([*TINY, "--max_steps", "2", "--resume", str(run)])
    out = capsys.readouterr().out
    assert code == 0
    assert f"resumed from {ckpt} at step 1" in out
    assert [p.name for p in list_checkpoints(run)] == ["step-000001", "step-000002"]


# -- 2. a killed save leaves a resumable run -----------------------------------------------------------------

# Each stage is the n-th filesystem call of a re-save of step 2 at which the child is killed (os._exit).
STAGES = {
    "writing the new copy": ("torch.save", 2),
    "new copy written, before the swap": ("os.replace", 2),  # the manifest's replace is call 1
    "old copy moved aside, new not yet in": ("os.replace", 3),
    "new copy in, old not yet deleted": ("shutil.rmtree", 1),
}


def _killed_resave(run: str, what: str, n: int) -> None:
    calls = {"n": 0}
    real = {"os.replace": os.replace, "shutil.rmtree": shutil.rmtree, "torch.save": torch.save}

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            os._exit(9)
        return real[what](*a, **k)

    if what == "os.replace":
        os.replace = dying
    elif what == "shutil.rmtree":
        shutil.rmtree = dying
    else:
        torch.save = dying
    _save(Path(run), 2, "new")
    os._exit(0)


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_resave_killed_at_any_stage_resumes_from_a_complete_checkpoint(tmp_path, stage):
    run = tmp_path / "run"
    _save(run, 1, "one")
    _save(run, 2, "old")
    what, n = STAGES[stage]
    child = multiprocessing.get_context("fork").Process(target=_killed_resave, args=(str(run), what, n))
    child.start()
    child.join(60)
    assert child.exitcode == 9, "the child was not killed at this stage"
    ckpt = find_checkpoint(run)
    assert ckpt.name == "step-000002" and _marker(ckpt) in ("old", "new")
    assert load_trainer_state(ckpt)["step"] == 2
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == []


def test_resave_replaces_the_step_and_leaves_nothing_behind(tmp_path):
    run = tmp_path / "run"
    _save(run, 2, "old")
    _save(run, 2, "new")
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000002"]
    assert _marker(find_checkpoint(run)) == "new"


def test_an_incomplete_newest_checkpoint_is_skipped_with_a_warning(tmp_path):
    run = tmp_path / "run"
    _save(run, 15, "a")
    newest = _save(run, 16, "b")
    # what the old re-save left when killed inside rmtree: some files gone, the trainer state among them
    (newest / "trainer_state.pt").unlink()
    (newest / "groups" / "shared" / "optimizer.pt").unlink()
    with pytest.warns(
        ck.IncompleteCheckpointWarning, match="step-000016 is incomplete.*resuming from step-000015"
    ):
        assert find_checkpoint(run).name == "step-000015"
    with pytest.warns(ck.IncompleteCheckpointWarning):
        assert find_checkpoint("latest", tmp_path).name == "step-000015"
    # the same without a manifest (a folder the previous save code wrote and then half deleted)
    (newest / "manifest.json").unlink()
    with pytest.warns(ck.IncompleteCheckpointWarning):
        assert find_checkpoint(run).name == "step-000015"


def test_stale_tmp_folders_of_dead_processes_are_cleaned(tmp_path):
    run = tmp_path / "run"
    _save(run, 1, "a")
    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    child.join()
    dead = child.pid
    stale = run / "checkpoints" / f"step-000002.tmp-{dead}"
    (stale / "groups").mkdir(parents=True)
    (stale / "big.bin").write_bytes(b"x" * 1000)
    live = run / "checkpoints" / f"step-000003.tmp-{os.getpid()}"  # a save in progress: kept
    live.mkdir()
    assert find_checkpoint(run).name == "step-000001"
    assert not stale.exists() and live.exists()

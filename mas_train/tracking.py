"""Metric sinks: a JSONL file and TensorBoard by default, Weights & Biases when installed and asked for.

Every step logs one flat ``{name: float}`` dict. Names use fixed namespaces (cleanrl's habit): ``charts/…``
(rollout quantities), ``losses/…`` (optimisation), ``time/…`` (seconds), ``eval/…`` (validation); a per-agent
or per-model-group quantity ends in ``/<agent>`` or ``/<group>``. ``docs/training.md`` explains each one.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

__all__ = ["RunLogger", "eval_logged_at", "first_eval", "last_eval", "read_jsonl", "truncate_jsonl"]


class RunLogger:
    """Writes metrics to the sinks in ``report_to`` (``jsonl``, ``tensorboard``, ``wandb``, ``none``).

    Args:
        run_dir: the run folder; ``metrics.jsonl`` and ``tb/`` go there.
        report_to: sink names.
        run_name: the W&B run name.
        config: the run config as a dict (W&B config).
        resume_step: the checkpoint step a resumed run continues from; ``None`` for a fresh run.

    Each JSONL line is ``{"step": int, "time": float, <metric>: float, ...}`` (non-finite values written as
    ``null``); a step can have two lines (training metrics, then ``eval/…``). A resumed run continues the same
    file. Lines of steps after ``resume_step`` (an earlier attempt that got further than its last checkpoint)
    are kept until the resumed run logs that step again, and only then dropped: history is never lost if the
    resumed run stops early, and after it passes those steps the file again holds one attempt per step, in step
    order. While such stale lines remain, each log rewrites the file (atomic rename) with the new line placed
    before them.
    """

    def __init__(
        self,
        run_dir: str | Path,
        report_to: Sequence[str] = ("jsonl", "tensorboard"),
        *,
        run_name: str = "",
        config: Mapping[str, object] | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        sinks = set(report_to) - {"none"}
        self.jsonl_path = self.run_dir / "metrics.jsonl" if "jsonl" in sinks else None
        # (kept lines, stale lines) while a resumed run has not yet redone every step an earlier attempt logged.
        self._pending: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
        if self.jsonl_path is not None and resume_step is not None and self.jsonl_path.exists():
            records = read_jsonl(self.jsonl_path)
            stale = [r for r in records if int(r.get("step", 0)) > resume_step]
            if stale:
                self._pending = ([r for r in records if int(r.get("step", 0)) <= resume_step], stale)
        self._jsonl: IO[str] | None = None
        if self.jsonl_path is not None and self._pending is None:
            self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        self.tb_dir: Path | None = None
        self._tb = None
        if "tensorboard" in sinks:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb_dir = self.run_dir / "tb"
                self._tb = SummaryWriter(log_dir=str(self.tb_dir))
            except ImportError:
                logger.warning("tensorboard is not installed (pip install tensorboard); skipping that sink")
        self._wandb = None
        if "wandb" in sinks:
            try:
                import wandb

                self._wandb = wandb.init(
                    name=run_name or None, config=dict(config or {}), dir=str(self.run_dir)
                )
            except ImportError:
                logger.warning("report_to wandb, but wandb is not installed (pip install wandb); skipping it")

    def log(self, step: int, metrics: Mapping[str, float], extra: Mapping[str, object] | None = None) -> None:
        """Record ``metrics`` at ``step``; ``extra`` (JSON-able, e.g. task ids) goes to the JSONL line only."""
        clean = {
            k: (float(v) if v is not None and math.isfinite(float(v)) else None) for k, v in metrics.items()
        }
        if self.jsonl_path is not None:
            import time

            line = {"step": int(step), "time": time.time(), **clean, **dict(extra or {})}
            if self._pending is not None:
                self._replace_stale(self.jsonl_path, self._pending, line)
            elif self._jsonl is not None:
                self._jsonl.write(json.dumps(line) + "\n")
                self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if v is not None}, step=step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Record a markdown ``text`` under ``tag`` at ``step`` (TensorBoard's Text tab, beside the scalars).

        Only TensorBoard takes text; the JSONL sink has the episodes in ``RUN/rollouts/`` instead
        (:mod:`mas_train.episodes`), and W&B gets none.
        """
        if self._tb is not None:
            self._tb.add_text(tag, text, step)
            self._tb.flush()

    def _replace_stale(
        self,
        path: Path,
        pending: tuple[list[dict[str, Any]], list[dict[str, Any]]],
        line: dict[str, Any],
    ) -> None:
        kept, stale = pending
        step = line["step"]
        kept.append(line)
        stale = [r for r in stale if int(r.get("step", 0)) > step]
        _write_jsonl(path, kept + stale)
        if stale:
            self._pending = (kept, stale)
        else:  # every step of the earlier attempt is redone: back to plain appending
            self._pending = None
            self._jsonl = path.open("a", encoding="utf-8")

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file."""
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _evals(run_dir: str | Path) -> list[tuple[int, dict[str, float]]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = [
        (int(r.get("step", -1)), {k: v for k, v in r.items() if k.startswith("eval/")})
        for r in read_jsonl(path)
    ]
    return [(step, ev) for step, ev in lines if ev]


def first_eval(run_dir: str | Path) -> dict[str, float]:
    """The ``eval/…`` metrics of the first evaluation line of a run's ``metrics.jsonl`` (``{}`` without one)."""
    evals = _evals(run_dir)
    return evals[0][1] if evals else {}


def last_eval(run_dir: str | Path) -> dict[str, float]:
    """The ``eval/…`` metrics of the last evaluation line of a run's ``metrics.jsonl`` (``{}`` without one)."""
    evals = _evals(run_dir)
    return evals[-1][1] if evals else {}


def eval_logged_at(run_dir: str | Path, step: int) -> bool:
    """Whether a run's ``metrics.jsonl`` has an evaluation line at ``step``."""
    return any(s == step for s, _ in _evals(run_dir))


def truncate_jsonl(path: str | Path, max_step: int) -> int:
    """Drop the records of steps after ``max_step`` (a resumed run redoes them); returns how many were dropped.

    The file is rewritten through a temporary file and an atomic rename.
    """
    path = Path(path)
    records = read_jsonl(path)
    keep = [r for r in records if int(r.get("step", 0)) <= max_step]
    _write_jsonl(path, keep)
    return len(records) - len(keep)


def _write_jsonl(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    # Through a temporary file and a rename, so a run killed mid-write leaves the old file, never half of one.
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)

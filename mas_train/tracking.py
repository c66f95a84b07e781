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
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["RunLogger", "read_jsonl", "truncate_jsonl"]


class RunLogger:
    """Writes metrics to the sinks in ``report_to`` (``jsonl``, ``tensorboard``, ``wandb``, ``none``).

    Args:
        run_dir: the run folder; ``metrics.jsonl`` and ``tb/`` go there.
        report_to: sink names.
        run_name: the W&B run name.
        config: the run config as a dict (W&B config).

    The JSONL file is opened in append mode, so a resumed run continues the same file; each line is
    ``{"step": int, "time": float, <metric>: float, ...}`` (non-finite values written as ``null``).
    """

    def __init__(
        self,
        run_dir: str | Path,
        report_to: Sequence[str] = ("jsonl", "tensorboard"),
        *,
        run_name: str = "",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        sinks = set(report_to) - {"none"}
        self.jsonl_path = self.run_dir / "metrics.jsonl" if "jsonl" in sinks else None
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8") if self.jsonl_path else None
        self.tb_dir = None
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

    def log(self, step: int, metrics: Mapping[str, float], extra: Mapping[str, Any] | None = None) -> None:
        """Record ``metrics`` at ``step``; ``extra`` (JSON-able, e.g. task ids) goes to the JSONL line only."""
        clean = {
            k: (float(v) if v is not None and math.isfinite(float(v)) else None) for k, v in metrics.items()
        }
        if self._jsonl is not None:
            import time

            line = {"step": int(step), "time": time.time(), **clean, **dict(extra or {})}
            self._jsonl.write(json.dumps(line) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if v is not None}, step=step)

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


def truncate_jsonl(path: str | Path, max_step: int) -> int:
    """Drop the records of steps after ``max_step`` (a resumed run redoes them); returns how many were dropped.

    The file is rewritten through a temporary file and an atomic rename.
    """
    path = Path(path)
    records = read_jsonl(path)
    keep = [r for r in records if int(r.get("step", 0)) <= max_step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
    tmp.replace(path)
    return len(records) - len(keep)

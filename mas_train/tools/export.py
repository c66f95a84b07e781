"""``mas-export RUN_OR_CHECKPOINT --out DIR``: one plain Hugging Face model folder per agent, for serving.

For every model group of the checkpoint and every agent of that group, ``DIR/<agent>/`` gets:

* a LoRA group (``groups/<g>/adapter/``): the base model with the adapter merged in (PEFT's
  ``merge_and_unload``: ``W + (alpha / r) · B A`` written into each target weight), so no PEFT is needed to
  serve it;
* a fully fine-tuned group (``groups/<g>/model/``): a copy of that folder;
* a frozen group (only ``state.json``): its base model, the ``model`` it was configured with.

Each folder loads with ``AutoModelForCausalLM.from_pretrained`` (and vLLM / SGLang) and holds the tokenizer.
Folders are written as ``<agent>.tmp`` and renamed when complete; an existing non-empty ``DIR/<agent>`` is
refused rather than overwritten.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["export_checkpoint", "main"]


def _group_states(ckpt: Path) -> list[tuple[Path, dict]]:
    root = ckpt / "groups"
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint {ckpt} has no groups/ folder")
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (folder / "state.json").is_file():
            raise FileNotFoundError(f"checkpoint group {folder} lacks state.json")
        out.append((folder, json.loads((folder / "state.json").read_text())))
    return out


def _base_path(folder: Path, state: dict) -> str:
    model = state.get("model")
    if not model:
        raise FileNotFoundError(
            f"{folder / 'state.json'} does not name its base model (a checkpoint written before mas-export "
            "existed); re-save it with the current mas-train"
        )
    return str(model)


def _write_group(folder: Path, state: dict, dest: Path) -> str:
    """Write the group's servable model into ``dest``; returns what was written (for the summary line)."""
    from transformers import AutoModelForCausalLM

    from mas_train.models import hf_progress_bars_off, load_tokenizer

    if state.get("trainable", True) and (folder / "model").is_dir():
        shutil.copytree(folder / "model", dest)
        return "fine-tuned weights"
    with hf_progress_bars_off():
        if state.get("trainable", True) and (folder / "adapter").is_dir():
            from peft import PeftModel

            base = AutoModelForCausalLM.from_pretrained(_base_path(folder, state), dtype="auto")
            merged = PeftModel.from_pretrained(base, str(folder / "adapter")).merge_and_unload()
            merged.save_pretrained(dest)
            load_tokenizer(folder / "adapter").save_pretrained(dest)
            return "base + merged LoRA adapter"
        if state.get("trainable", True):
            raise FileNotFoundError(f"checkpoint group {folder} has neither model/ nor adapter/")
        base_path = _base_path(folder, state)
        AutoModelForCausalLM.from_pretrained(base_path, dtype="auto").save_pretrained(dest)
        load_tokenizer(base_path).save_pretrained(dest)
        return "frozen base model"


def export_checkpoint(
    spec: str | Path, out: str | Path, *, output_dir: str | Path = "runs"
) -> dict[str, Path]:
    """Export a checkpoint (a checkpoint folder, a run folder = its newest checkpoint, or ``latest``) as one
    Hugging Face model folder per agent under ``out``.

    Returns:
        ``{agent: folder}`` in checkpoint group order.

    Raises:
        FileNotFoundError: no such checkpoint, or a group folder missing its files.
        FileExistsError: ``out/<agent>`` exists and is not empty.
    """
    from mas_train.checkpoint import find_checkpoint

    ckpt = find_checkpoint(spec, output_dir, flag="checkpoint")  # mas-export's positional argument
    groups = _group_states(ckpt)
    out = Path(out)
    targets = [
        (folder, state, agent) for folder, state in groups for agent in state.get("agents") or [folder.name]
    ]
    for _, _, agent in targets:
        if (out / agent).exists() and any((out / agent).iterdir()):
            raise FileExistsError(f"{out / agent} exists and is not empty; pass a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for folder, state, agent in targets:
        tmp = out / f"{agent}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        what = _write_group(folder, state, tmp)
        final = out / agent
        if final.exists():
            final.rmdir()  # empty (checked above)
        tmp.rename(final)
        written[agent] = final
        print(f"mas-export: {agent} ({folder.name}: {what}) -> {final}")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``mas-export``: returns the exit code (2 with one error line for a user mistake)."""
    from mas_train.command import run_command

    parser = argparse.ArgumentParser(
        prog="mas-export",
        description="Write a merged Hugging Face model per agent of a checkpoint (LoRA adapters merged into "
        "their base) into OUT/<agent>/, for serving.",
    )
    parser.add_argument(
        "checkpoint", help="checkpoint folder, run folder (its newest checkpoint) or 'latest'"
    )
    parser.add_argument("--out", required=True, help="folder that receives one model folder per agent")
    parser.add_argument("--output_dir", default="runs", help="where 'latest' looks for runs (default: runs)")

    def body(args: list[str]) -> None:
        from mas_train.config import ConfigError

        ns = parser.parse_args(args)
        try:
            export_checkpoint(ns.checkpoint, ns.out, output_dir=ns.output_dir)
        except FileExistsError as err:
            raise ConfigError(str(err)) from None

    return run_command("mas-export", list(sys.argv[1:] if argv is None else argv), body)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

#!/usr/bin/env python3
"""Does ``mas-rl[<extras>]`` resolve for a platform and Python version other than this machine's?

For each combination of extras and Python version on Linux x86-64 (glibc 2.39, Ubuntu 24.04's, which the GPU
machines we target run), asks a resolver for the full set a user's ``pip install`` would get, from the package
index alone, and prints one line per combination::

    resolve mas-rl[train,gpu] cp312 manylinux_2_39 x86_64: ok (246 packages; torch 2.14.1, transformers 5.19.0, ...)

The resolver is uv's (``uv pip compile --python-platform --python-version``), not pip's: ``pip install --dry-run
--platform`` can only use wheels (``--only-binary=:all:``), while reasoning-gym needs two sdist-only packages
(``cellpylib``, ``pycosat``) that a user's pip builds on the target; uv reads their metadata from the sdists,
as the target would. uv also reads no pip configuration, so nothing of this machine (a local wheel folder, a
constraint file) enters the answer. It took 8 min with pip and a hand-built wheel folder, under a minute with uv.

Usage::

    python scripts/check_resolve.py                                   # all,gpu and train,gpu on 3.11 and 3.12
    python scripts/check_resolve.py --extras train,gpu --python 3.12

Exit status 0 when every combination resolves, 1 otherwise. Needs ``uv`` (the ``dev`` extra) and network access
to the package index.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = "x86_64-manylinux_2_39"
# Packages worth naming in the summary line: what a GPU install pins and what our code is tested against.
SHOWN = ("torch", "transformers", "trl", "peft", "accelerate", "sglang", "openai", "tokenizers", "datasets")
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)", re.M)


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).exists():
        raise SystemExit("error: uv is not installed: pip install uv (it is in the dev extra)")
    return found


def resolve(
    extras: str, python: str, out: Path, pyproject: Path = ROOT / "pyproject.toml"
) -> tuple[bool, str]:
    """Resolve ``mas-rl[extras]`` for Linux x86-64 and ``python``; return (ok, one-line summary).

    Args:
        extras: comma-separated extras of pyproject.toml, e.g. ``"train,gpu"``.
        python: the target Python version, e.g. ``"3.12"``.
        out: where the resolved requirements file is written.
        pyproject: the project file whose dependencies are resolved.
    """
    extra_args = [a for e in extras.split(",") for a in ("--extra", e)]
    cmd = [
        _uv(), "pip", "compile", str(pyproject), *extra_args, "--python-version", python,
        "--python-platform", PLATFORM, "--quiet", "--no-header", "--no-annotate", "-o", str(out),
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        return False, "does not resolve: " + " | ".join(lines[-8:])
    versions = {n.lower(): v for n, v in PIN.findall(out.read_text())}
    shown = ", ".join(f"{n} {versions[n]}" for n in SHOWN if n in versions)
    return True, f"ok ({len(versions)} packages; {shown})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument(
        "--extras",
        action="append",
        help="comma-separated extras; repeatable (default: all,gpu and train,gpu)",
    )
    ap.add_argument(
        "--python", action="append", help="target Python version; repeatable (default: 3.11 and 3.12)"
    )
    ap.add_argument(
        "--pyproject", type=Path, default=ROOT / "pyproject.toml", help="default: this checkout's"
    )
    args = ap.parse_args(argv)
    combos = [
        (e, p) for e in (args.extras or ["all,gpu", "train,gpu"]) for p in (args.python or ["3.11", "3.12"])
    ]
    with tempfile.TemporaryDirectory() as tmp:

        def one(combo: tuple[str, str]) -> tuple[bool, str]:
            extras, python = combo
            t0 = time.perf_counter()
            ok, summary = resolve(extras, python, Path(tmp) / f"{extras}-{python}.txt", args.pyproject)
            tag = f"cp{python.replace('.', '')} {PLATFORM.split('-', 1)[1]} x86_64"
            return ok, f"resolve mas-rl[{extras}] {tag}: {summary} [{time.perf_counter() - t0:.0f} s]"

        with ThreadPoolExecutor(max_workers=4) as pool:  # the resolves mostly wait on the index
            results = list(pool.map(one, combos))
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Does ``mas-rl[<extras>]`` resolve for a platform and Python version other than this machine's?

Asks pip's own resolver (``pip install --dry-run --report``) for each combination of extras and Python version on
Linux x86-64, exactly as ``pip install`` would on that machine, and prints one line per combination::

    resolve mas-rl[train,gpu] cp311 manylinux x86_64: ok (312 packages; torch 2.14.1, transformers 5.19.0, ...)

pip can only target another platform with wheels (``--only-binary=:all:``). A dependency published only as an
sdist (reasoning-gym's ``cellpylib`` and ``pycosat``) is built here into a wheel, once, and offered to the
resolver from a local folder; where that wheel is a platform wheel (pycosat's C extension) it is offered under a
``py3-none-any`` name as a metadata stand-in: a dry run reads only metadata, which an sdist's build does not
take from the platform, and the user's pip builds the same sdist on the target. The package itself is built
into a wheel first, so what is checked is the metadata a user installs.

Usage::

    python scripts/check_resolve.py                                  # the defaults below
    python scripts/check_resolve.py --extras train,gpu --python 3.12

Exit status 0 when every combination resolves, 1 otherwise. Needs network access to the package index.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every manylinux tag of glibc 2.17 .. 2.39 (pip matches platform tags exactly, one --platform per tag): 2.39
# is Ubuntu 24.04's glibc, which the GPU machines we target run.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
# Packages worth naming in the summary line: what a GPU install pins and what our code is tested against.
SHOWN = ("torch", "transformers", "trl", "peft", "accelerate", "sglang", "openai", "tokenizers", "datasets")
_HOUSE_LOCK = threading.Lock()
MISSING = re.compile(r"No matching distribution found for ([A-Za-z0-9_.\-]+)(\S*)")


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    # The resolver's view of a user's machine: no machine-wide constraint file of this host.
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env)


def build_own_wheel(out: Path) -> Path:
    """Build this checkout's wheel (no dependencies) into ``out``; return its path."""
    r = _pip("wheel", "--no-deps", "-q", str(ROOT), "-w", str(out))
    if r.returncode != 0:
        raise SystemExit(f"error: could not build the mas-rl wheel: {r.stderr.strip().splitlines()[-1:]}")
    return next(out.glob("mas_rl-*.whl"))


def build_sdist_wheel(name: str, spec: str, house: Path) -> None:
    """Build the newest ``name<spec>`` from its sdist into ``house``, as a ``py3-none-any`` stand-in if not pure."""
    with _HOUSE_LOCK:  # combinations resolve side by side; one build at a time into the house
        _build_sdist_wheel(name, spec, house)


def _build_sdist_wheel(name: str, spec: str, house: Path) -> None:
    before = set(house.iterdir())
    r = _pip("wheel", "--no-deps", "-q", f"{name}{spec}", "-w", str(house))
    built = sorted(set(house.iterdir()) - before)
    if r.returncode != 0 or not built:
        raise SystemExit(f"error: {name}{spec} has no wheel for the target and its sdist did not build here")
    if not built[-1].name.endswith("-py3-none-any.whl"):
        stem = built[-1].name.split("-")[:2]  # name, version
        built[-1].rename(house / ("-".join(stem) + "-py3-none-any.whl"))


def resolve(wheel: Path, extras: str, python: str, house: Path, work: Path) -> tuple[bool, str]:
    """Dry-run ``pip install <wheel>[extras]`` for Linux x86-64 and ``python``; return (ok, one-line summary)."""
    work.mkdir(parents=True, exist_ok=True)
    for _ in range(20):  # each round may add one sdist's wheel to the wheel house
        report = work / "report.json"
        platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
        r = _pip(
            "install", "--dry-run", "--ignore-installed", "--only-binary=:all:", *platform_args,
            "--python-version", python, "--implementation", "cp", "--target", str(work / "target"),
            "--find-links", str(house), "--report", str(report), "--quiet", f"{wheel}[{extras}]",
        )  # fmt: skip
        if r.returncode == 0:
            items = json.loads(report.read_text())["install"]
            versions = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}
            shown = ", ".join(f"{n} {versions[n]}" for n in SHOWN if n in versions)
            return True, f"ok ({len(items)} packages; {shown})"
        m = MISSING.search(r.stderr)
        if m is None:
            lines = [ln for ln in r.stderr.splitlines() if ln.startswith("ERROR") or "conflict" in ln.lower()]
            return False, "does not resolve: " + " | ".join(lines[-6:])
        build_sdist_wheel(m.group(1), m.group(2), house)
    return False, "does not resolve: too many sdist-only dependencies"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--extras",
        action="append",
        help="comma-separated extras; repeatable (default: all,gpu and train,gpu)",
    )
    ap.add_argument(
        "--python", action="append", help="target Python version; repeatable (default: 3.11 and 3.12)"
    )
    args = ap.parse_args(argv)
    combos = [
        (e, p) for e in (args.extras or ["all,gpu", "train,gpu"]) for p in (args.python or ["3.11", "3.12"])
    ]
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_own_wheel(Path(tmp) / "own")
        house = Path(tmp) / "house"  # shared: a stand-in is py3-none-any, good for every target Python
        house.mkdir()

        def one(combo: tuple[str, str]) -> bool:
            extras, python = combo
            t0 = time.perf_counter()
            ok, summary = resolve(wheel, extras, python, house, Path(tmp) / f"{extras}-{python}")
            took = time.perf_counter() - t0
            print(
                f"resolve mas-rl[{extras}] cp{python.replace('.', '')} manylinux x86_64: {summary} [{took:.0f} s]"
            )
            return ok

        # The first combination fills the wheel house with the sdists' wheels; the others then need one round
        # each and mostly wait on the index, so they run side by side.
        results = [one(combos[0])]
        with ThreadPoolExecutor(max_workers=4) as pool:
            results += list(pool.map(one, combos[1:]))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

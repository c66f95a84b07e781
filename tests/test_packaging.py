"""Issue 42: the package metadata declares ranges, constraints/cpu.txt holds CI's exact set, and the two agree."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra if not r.startswith("mas-rl[")]
    return reqs


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints" / "cpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_no_dependency_is_an_exact_pin():
    pinned = [str(r) for r in _requirements() if any(s.operator in ("==", "===") for s in r.specifier)]
    assert pinned == []


def test_every_dependency_but_the_open_ended_few_has_an_upper_bound():
    # open-ended on purpose: tools and libraries whose every release we have used without breakage, and sglang,
    # whose own pins decide a GPU install (scripts/check_resolve.py)
    open_ended = {"numpy", "pyyaml", "tensorboard", "rich", "tqdm", "jinja2", "fastapi", "uvicorn", "httpx",
                  "sglang", "pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "ruff", "mypy", "uv"}  # fmt: skip
    unbounded = [str(r) for r in _requirements() if not any(s.operator in ("<", "<=") for s in r.specifier)]
    assert sorted(r for r in unbounded if canonicalize_name(Requirement(r).name) not in open_ended) == []


def test_ci_constraints_pin_every_dependency_inside_its_range():
    pins = _constraints()
    for req in _requirements():
        name = canonicalize_name(req.name)
        # the GPU extra is resolved by scripts/check_resolve.py, not installed here
        if name in ("sglang", "faiss-gpu"):
            continue
        assert name in pins, f"{req.name} is not pinned in constraints/cpu.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {req}"
    assert pins["torch"] == "2.13.0" and pins["transformers"] == "5.24.0"

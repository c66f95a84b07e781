"""The `gpu` extra brings faiss-gpu instead of faiss-cpu (issue 9, item 11); it had sglang only."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement


def _extras() -> dict[str, dict[str, Requirement]]:
    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    return {
        name: {Requirement(r).name: Requirement(r) for r in reqs}
        for name, reqs in data["project"]["optional-dependencies"].items()
    }


def test_gpu_extra_has_faiss_gpu_and_the_rest_of_search_but_not_faiss_cpu():
    extras = _extras()
    gpu, search = extras["gpu"], extras["search"]
    assert "sglang" in gpu and gpu["faiss-gpu"].specifier.contains("1.15.1")
    assert "faiss-cpu" not in gpu  # same faiss/ module files: never both in one environment
    # the same faiss version on CPU and GPU, and everything else `search` needs
    assert str(search["faiss-cpu"].specifier) == str(gpu["faiss-gpu"].specifier)
    assert {n: str(r) for n, r in search.items() if n != "faiss-cpu"} == {
        n: str(r) for n, r in gpu.items() if n not in ("faiss-gpu", "sglang")
    }

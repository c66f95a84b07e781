"""The env examples run as a user would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(*args: str) -> str:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=True, timeout=300
    ).stdout


def test_custom_env_example():
    out = run(str(EXAMPLES / "custom_env.py"))
    assert "=== terminated: team reward 1, success True ===" in out
    assert "CheckReport(env_name='echo-2agent-v0', random_episodes=200" in out


def test_scripted_episode_example():
    out = run(str(EXAMPLES / "scripted_episode.py"), "--episodes", "1", "--seed", "0")
    assert "task gsm8k/test/1121" in out and "<verify>reject</verify>" in out
    assert "returns: {'solver': 1.0, 'verifier': 1.0}" in out

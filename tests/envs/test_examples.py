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


def _play_kuhn():
    import importlib.util

    spec = importlib.util.spec_from_file_location("play_kuhn", EXAMPLES / "play_kuhn.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_play_kuhn_scores_the_hands_exactly(capsys):
    play_kuhn = _play_kuhn()
    typed = iter(["raise", "c", "f"])  # an unknown word is asked again; "c" is call when facing a bet
    # seeds 0 and 1 deal K-Q and Q-J; the model (player_0) always bets: calling with Q loses 2, folding J loses 1
    total = play_kuhn.play(
        2, "player_1", lambda messages, legal: "<move>bet</move>", 0, read=lambda _: next(typed)
    )
    out = capsys.readouterr().out
    assert total == -3.0
    assert "your card is Q" in out and "your card is J" in out
    assert "not a legal move here; type one of ['fold', 'call']" in out
    assert "you won -2 chips (total -2)" in out and "you won -1 chips (total -3)" in out


def test_play_kuhn_against_a_checkpoint_adapter(tmp_path, tiny_qwen3_path, monkeypatch, capsys):
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    play_kuhn = _play_kuhn()
    ckpt = tmp_path / "step-000001"
    group = ckpt / "groups" / "player_0"
    group.mkdir(parents=True)
    (ckpt / "config.yaml").write_text(
        yaml.safe_dump({"model": tiny_qwen3_path, "sampling": {"temperature": 1.0}})
    )
    (group / "state.json").write_text('{"group": "player_0", "agents": ["player_0"]}')
    lm = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path)
    get_peft_model(lm, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(group / "adapter")
    monkeypatch.setattr("builtins.input", lambda _: "c")  # check or call: legal for player_1 at every turn
    assert play_kuhn.main(["--checkpoint", str(ckpt), "--seat", "player_1", "--hands", "2"]) == 0
    out = capsys.readouterr().out
    # the random tiny model rarely writes a legal move: either way both hands end with a score line
    assert out.count("; you won ") == 2 and "model: " in out
    # a checkpoint without an adapter for the model's seat is one clear error line
    assert play_kuhn.main(["--checkpoint", str(ckpt), "--seat", "player_0"]) == 2
    assert "no LoRA adapter trained for seat 'player_1'" in capsys.readouterr().err
    # a checkpoint config without its base model is one clear line too, unless --model names it
    (ckpt / "config.yaml").write_text(yaml.safe_dump({"sampling": {"temperature": 1.0}}))
    assert play_kuhn.main(["--checkpoint", str(ckpt), "--hands", "1"]) == 2
    assert "names no model: give --model" in capsys.readouterr().err
    args = ["--checkpoint", str(ckpt), "--model", tiny_qwen3_path, "--hands", "1"]
    assert play_kuhn.main(args) == 0 and "; you won " in capsys.readouterr().out


def test_play_kuhn_with_a_run_that_chose_among_legal_moves_plays_only_legal_moves(
    tmp_path, tiny_qwen3_path, monkeypatch, capsys
):
    """A checkpoint whose run trained with legal_moves_only (and move_hint choices): the random tiny model's every
    move is one of the legal move tags, so no hand ends in an illegal move."""
    import re

    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    play_kuhn = _play_kuhn()
    ckpt = tmp_path / "step-000001"
    group = ckpt / "groups" / "player_0"
    group.mkdir(parents=True)
    cfg = {"model": tiny_qwen3_path, "sampling": {"temperature": 1.0}, "legal_moves_only": True,
           "env_kwargs": {"move_hint": "choices"}}  # fmt: skip
    (ckpt / "config.yaml").write_text(yaml.safe_dump(cfg))
    (group / "state.json").write_text('{"group": "player_0", "agents": ["player_0"]}')
    lm = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path)
    get_peft_model(lm, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(group / "adapter")
    monkeypatch.setattr("builtins.input", lambda _: "c")
    assert play_kuhn.main(["--checkpoint", str(ckpt), "--seat", "player_1", "--hands", "3"]) == 0
    out = capsys.readouterr().out
    moves = re.findall(r"model: '(.*)'", out)
    assert len(moves) >= 3 and all(
        m in ("<move>check</move>", "<move>bet</move>", "<move>call</move>", "<move>fold</move>")
        for m in moves
    )
    assert out.count("; you won ") == 3

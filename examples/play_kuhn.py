"""Play Kuhn poker in the terminal against a trained checkpoint (or any model).

You take one seat; the model plays the other with the adapter its run trained for that seat (the checkpoint's
``groups/<group>/adapter``, PEFT format, on the run's base model), the run's sampling temperature and env
arguments (``move_hint``), and, when the run trained with ``legal_moves_only``, it picks its move among the legal
ones by its probability of each, as in training (``--legal-moves-only`` for a plain model). The model sees exactly
the prompt the env gives it in training; a reply that is no legal move is an in-game illegal move (the env's rule),
never a crash. After each hand the chips and the running total are printed::

    python examples/play_kuhn.py --checkpoint RUN/checkpoints/step-000014 --seat player_1 --hands 3
    python examples/play_kuhn.py --model smollm2-135m-instruct       # the untrained base model

Type a move (``check``, ``bet``, ``call``, ``fold``, or its first letter). Seats: ``player_0`` acts first.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import mas_envs

LETTERS = {"c": None, "b": "bet", "f": "fold", "k": "check"}  # "c" is check or call: whichever is legal


def ask_human(legal: list[str], read: Callable[[str], str] | None = None) -> str:
    """A legal move label from the person (asks again on anything else); ``read`` defaults to ``input``."""
    read = read or input
    while True:
        text = read(f"your move {legal}: ").strip().lower()
        if text in legal:
            return text
        if text[:1] in LETTERS:
            guess = LETTERS[text[:1]] or next((m for m in ("check", "call") if m in legal), "")
            if guess in legal:
                return guess
        print(f"  not a legal move here; type one of {legal}")


Policy = Callable[[list[dict], list[str]], str]


def load_model_policy(
    checkpoint: str | None, model: str | None, seat: str, legal_moves_only: bool | None = None
) -> tuple[Policy, dict]:
    """``(policy, env_kwargs)``: ``policy(messages, legal_moves) -> reply text`` for the model's seat (the
    checkpoint's adapter for that seat's agent, its run's base model, temperature and ``legal_moves_only``, or
    ``model`` with no adapter) and the run's env arguments.

    Raises:
        FileNotFoundError: the checkpoint has no ``config.yaml`` or no adapter for the seat's model group.
    """
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mas_train.models import resolve_model_path

    temperature = 0.7
    adapter = None
    env_kwargs: dict = {}
    only = bool(legal_moves_only)
    if checkpoint:
        ckpt = Path(checkpoint)
        cfg_path = ckpt / "config.yaml"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{cfg_path} not found: give a checkpoint folder RUN/checkpoints/step-N")
        cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
        if not isinstance(cfg, dict) or not (model or cfg.get("model")):
            raise FileNotFoundError(
                f"{cfg_path} names no model: give --model with the checkpoint's base model"
            )
        model = model or cfg["model"]
        temperature = float((cfg.get("sampling") or {}).get("temperature", temperature))
        env_kwargs = dict(cfg.get("env_kwargs") or {})
        only = bool(cfg.get("legal_moves_only", False)) if legal_moves_only is None else legal_moves_only
        # each saved group names the agents it trained (groups/<group>/state.json): find the seat's
        for state_path in sorted((ckpt / "groups").glob("*/state.json")):
            if seat in json.loads(state_path.read_text(encoding="utf-8")).get("agents", []):
                adapter = state_path.parent / "adapter"
                break
        if adapter is None or not (adapter / "adapter_config.json").is_file():
            raise FileNotFoundError(f"no LoRA adapter trained for seat {seat!r} in {ckpt}/groups")
    path = resolve_model_path(model or "smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        lm = PeftModel.from_pretrained(lm, str(adapter))
    lm.eval()

    from mas_train.backends.base import SamplingParams
    from mas_train.backends.hf import HFBackend
    from mas_train.move_choice import choose_moves
    from mas_train.prompts import render_prompt

    # as in training: the legal move texts scored by the model (the HF backend's teacher-forced score; no packed
    # weight copy, which only pays off when decoding)
    scorer = HFBackend(lm, tok, share_model=True, packed_linears=False) if only else None

    def choose(messages: list[dict], legal: list[str]) -> str:
        assert scorer is not None
        sp = SamplingParams(temperature=temperature, seed=int(torch.randint(2**31, ())))
        ((move, _),) = choose_moves(scorer.score, tok, [render_prompt(tok, messages)], [legal], [sp])
        return f"<move>{move}</move>"

    def policy(messages: list[dict], legal: list[str]) -> str:
        if only:
            return choose(messages, legal)
        enc = tok.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids = enc["input_ids"]
        with torch.no_grad():
            out = lm.generate(
                ids,
                attention_mask=enc["attention_mask"],
                max_new_tokens=32,
                do_sample=True,
                temperature=temperature,
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            )
        text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        return text.split("</move>")[0] + "</move>" if "</move>" in text else text  # the env's stop string

    return policy, env_kwargs


def play(
    hands: int,
    human_seat: str,
    policy: Policy,
    seed: int = 0,
    read: Callable[[str], str] | None = None,
    env_kwargs: dict | None = None,
) -> float:
    """Play ``hands`` hands (``env_kwargs``: the env's arguments, e.g. the run's ``move_hint``); returns the
    person's total chips."""
    env = mas_envs.make("kuhn-poker", **(env_kwargs or {}))
    total = 0.0
    for hand in range(hands):
        env.reset(seed=seed + hand)
        card = env.unwrapped.task["cards"][env.possible_agents.index(human_seat)]
        print(f"\nhand {hand + 1}: you are {human_seat}, your card is {card}")
        chips = dict.fromkeys(env.possible_agents, 0.0)
        for agent in env.agent_iter():
            _obs, reward, termination, truncation, info = env.last()
            chips[agent] += reward
            if termination or truncation:
                env.step(None)
                continue
            if agent == human_seat:
                move = ask_human(list(info["legal_moves"]), read)
                print(f"  you: {move}")
                env.step(f"<move>{move}</move>")
            else:
                reply = policy(info["messages"], list(info["legal_moves"]))
                print(f"  model: {reply.strip()!r}")
                env.step(reply)
        cards = dict(zip(env.possible_agents, env.unwrapped.task["cards"], strict=True))
        total += chips[human_seat]
        model_seat = next(a for a in env.possible_agents if a != human_seat)
        # an illegal reply ends the hand (the env's illegal_move rule): the model loses 1, the person gets 0
        print(
            f"  cards {cards}; you won {chips[human_seat]:+g} chips (total {total:+g}), the model "
            f"{chips[model_seat]:+g}"
        )
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a run's checkpoint folder (RUN/checkpoints/step-N)")
    ap.add_argument(
        "--model", help="a model (builtin alias, path or hub id); with --checkpoint, its base model"
    )
    ap.add_argument("--seat", default="player_1", choices=["player_0", "player_1"], help="your seat")
    ap.add_argument("--hands", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="seed of the first deal")
    ap.add_argument(
        "--legal-moves-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the model picks among the legal moves by its probability of each (default: as its run trained)",
    )
    args = ap.parse_args(argv)
    model_seat = "player_0" if args.seat == "player_1" else "player_1"
    try:
        policy, env_kwargs = load_model_policy(args.checkpoint, args.model, model_seat, args.legal_moves_only)
    except FileNotFoundError as e:
        print(f"play_kuhn: {e}", file=sys.stderr)
        return 2
    play(args.hands, args.seat, policy, args.seed, env_kwargs=env_kwargs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Can a LoRA adapter learn to play its Kuhn poker card? The exact policy gradient, no sampling, per prompt layout.

Usage: python scripts/kuhn_card_probe.py [--layout as_is|last|hold|hold_described] [--steps 10] [--lr 1e-4] [--targets q_proj,...] [--full]

The question behind issue 40's ≤ 0.15 bar: every trained Kuhn table so far is card-blind (the aggressive move's
probability equal for J, Q and K within 0.04). This asks whether that is the noise of sampled self-play or the
model. Each step computes each seat's policy table from the model's log-probabilities of the two legal move texts
at its 6 information sets (`mas_envs.games.kuhn.policy_from_logprobs`'s rule, kept differentiable), the seat's
exact expected chips against the uniform opponent (whose best response *is* card-dependent: fold J to a bet, bet
K), and takes one Adam step on minus their sum through the adapter (PEFT LoRA, `alpha = 2 r`), the objective's
gradient by the chain rule through each information set's log-probabilities (memory bounded: rows in chunks).
``--full`` trains every weight of the model instead (no adapter): whether the model, not its adapter, can learn it.

It prints how many weights it trains; per printed step: both seats' values against uniform, the largest
|p(K) - p(J)| over the 4 histories (the card gap; 0 = card-blind), the table's exploitability, and the table.
``--layout`` rewords the env's prompt (`_layout`): the card line last, right before the model's turn; or "You hold
K." before the reply line, with or without the card's rank described. With SmolLM2-135M and one thread: about 50 s
a step through the adapter on a 2-core AMD EPYC Zen 4 (`avx512_bf16`), about 220 s a step with ``--full`` on an
AVX2-only Zen 1 EPYC (docs/results.md).
"""

from __future__ import annotations

import argparse
import time

import torch

from mas_envs.games.kuhn import (
    _DEALS,
    INFO_SETS,
    _value0,
    action_texts,
    exploitability,
    info_set_messages,
    legal_actions,
)
from mas_train.models import load_model_and_tokenizer
from mas_train.move_choice import reply_ids

LAYOUTS = ("as_is", "last", "hold", "hold_described")
_DESCRIBED = {
    "J": "J (the lowest card: it loses to Q and K)",
    "Q": "Q (the middle card: it beats J and loses to K)",
    "K": "K (the highest card: it beats J and Q)",
}


def _layout(messages: list[dict[str, str]], card: str, layout: str) -> list[dict[str, str]]:
    """The env's prompt (``as_is``), its card line moved last (``last``), a "You hold K." before the reply line
    (``hold``), and that with the card line describing the card's rank (``hold_described``)."""
    user = messages[-1]["content"]
    if layout == "last":
        user = user.replace(f"Your card: {card}\n", "") + f"\nYour card: {card}"
    elif layout.startswith("hold"):
        if layout == "hold_described":
            user = user.replace(f"Your card: {card}\n", f"Your card: {_DESCRIBED[card]}\n")
        user = user.replace("\n\nReply with", f"\n\nYou hold {card}. Reply with")
    return [*messages[:-1], {"role": "user", "content": user}]


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--layout", choices=LAYOUTS, default="as_is", help="the prompt's wording (_layout)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj", help="LoRA target modules")
    ap.add_argument("--chunk", type=int, default=6, help="rows per forward/backward")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="train every weight (no LoRA adapter)")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    model, tok = load_model_and_tokenizer(args.model)
    if not args.full:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=args.rank,
                lora_alpha=2 * args.rank,
                target_modules=args.targets.split(","),
                task_type="CAUSAL_LM",
            ),
        )
    messages = info_set_messages(move_hint="choices")
    rows = []  # (info set, move, prompt ids, completion ids)
    for key in INFO_SETS:
        text = tok.apply_chat_template(
            _layout(messages[key], key[0], args.layout), tokenize=False, add_generation_prompt=True
        )
        prompt = tok(text, add_special_tokens=False).input_ids
        for move, completion in action_texts(key).items():
            rows.append((key, move, prompt, reply_ids(tok, completion)))  # the move as played: text + EOS
    width = max(len(p) + len(c) for *_, p, c in rows)
    ids = torch.full((len(rows), width), int(tok.pad_token_id or 0))
    attn = torch.zeros_like(ids)
    comp = torch.zeros(len(rows), width, dtype=torch.bool)  # positions of completion tokens
    for i, (*_, p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attn[i, : len(p) + len(c)] = 1
        comp[i, len(p) : len(p) + len(c)] = True

    def logps(idx: torch.Tensor) -> torch.Tensor:
        """Σ log p(completion | prompt) of rows ``idx``, (len(idx),) float32."""
        logits = model(input_ids=ids[idx], attention_mask=attn[idx]).logits[:, :-1]
        sel = comp[idx][:, 1:]
        tok_lp = logits[sel].log_softmax(-1).gather(-1, ids[idx][:, 1:][sel][:, None])[:, 0]
        return torch.zeros(len(idx)).index_add(0, sel.nonzero()[:, 0], tok_lp)

    chunks = [torch.arange(j, min(j + args.chunk, len(rows))) for j in range(0, len(rows), args.chunk)]
    trained = [p for p in model.parameters() if p.requires_grad]
    sizes = {
        "trainable_params": sum(p.numel() for p in trained),
        "params": sum(p.numel() for p in model.parameters()),
    }
    print(f"training {sizes['trainable_params']:,} of {sizes['params']:,} weights", flush=True)
    opt = torch.optim.Adam(trained, lr=args.lr)
    uniform = dict.fromkeys(INFO_SETS, 0.5)
    history, t0 = [], time.time()
    for step in range(args.steps + 1):
        with torch.no_grad():
            lp = torch.cat([logps(c) for c in chunks])
        lp.requires_grad_()
        by_key: dict[str, dict[str, torch.Tensor]] = {}
        for (key, move, *_), v in zip(rows, lp, strict=True):
            by_key.setdefault(key, {})[move] = v
        table = {}
        for key, moves in by_key.items():
            passive, aggressive = legal_actions(key[1:])
            table[key] = torch.softmax(torch.stack([moves[passive], moves[aggressive]]), 0)[1]
        v0 = sum(_value0(table, uniform, a, b) for a, b in _DEALS) / len(_DEALS)
        v1 = sum(-_value0(uniform, table, a, b) for a, b in _DEALS) / len(_DEALS)
        plain = {k: float(v.detach()) for k, v in table.items()}
        gap = max(abs(plain["K" + h] - plain["J" + h]) for h in ("", "pb", "p", "b"))
        row = {
            "step": step,
            "v0": float(v0.detach()),
            "v1": float(v1.detach()),
            "card_gap": gap,
            "exploitability": exploitability(plain),
            **sizes,
        }
        history.append(row)
        print(
            f"step {step:3d}  v0 {row['v0']:+.3f}  v1 {row['v1']:+.3f}  card gap {gap:.2f}  "
            f"exploitability {row['exploitability']:.3f}  ({time.time() - t0:.0f} s)  "
            + " ".join(f"{k}:{plain[k]:.2f}" for k in INFO_SETS),
            flush=True,
        )
        if step == args.steps:
            break
        (-(v0 + v1)).backward()
        grad = lp.grad.detach()
        opt.zero_grad()
        for (
            c
        ) in chunks:  # d objective / d weights = Σ_rows (d objective / d logp_row) · d logp_row / d weights
            (logps(c) * grad[c]).sum().backward()
        opt.step()
    return history


if __name__ == "__main__":
    main()

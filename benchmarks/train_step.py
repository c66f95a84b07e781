"""Per-group update time of ``GroupGRPOTrainer.update`` vs plain TRL ``GRPOTrainer`` on the same batch.

Both sides train the same model on the same pre-generated batch with the same ``loss_type``, one optimizer step
each: plain TRL runs its own inner step (``compute_loss`` → ``accelerator.backward`` → ``clip_grad_norm_`` →
``optimizer.step`` → ``lr_scheduler.step``) on TRL's padded input dict; ours runs ``update(samples,
advantages)`` (padding from samples, importance-sampling correction, micro-batching, optional per-agent
gradient norms). Repetitions alternate between the sides and the medians are compared. Goal: ratio <= 1.15.

    python benchmarks/train_step.py                          # SmolLM2-135M, 8 samples, dapo
    python benchmarks/train_step.py --model tiny-qwen3 --reps 5 --loss_type grpo
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", type=int, default=8, help="samples in the batch")
    p.add_argument("--prompt_len", type=int, default=96)
    p.add_argument("--completion_len", type=int, default=48)
    p.add_argument("--loss_type", default="dapo")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = p.parse_args()

    import torch
    from trl import GRPOTrainer

    from mas_train.models import load_model_and_tokenizer
    from mas_train.rollout import Sample
    from mas_train.trainer import GroupGRPOTrainer, _no_reward, grpo_args

    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok = load_model_and_tokenizer(a.model)
    g = torch.Generator().manual_seed(0)
    vocab = min(len(tok), 30000)
    samples, adv = [], []
    for i in range(a.batch):
        # lengths vary like real turns do, so padding costs the same on both sides
        pl, cl = a.prompt_len - (i % 4) * 4, a.completion_len - (i % 3) * 4
        prompt = torch.randint(0, vocab, (pl,), generator=g).tolist()
        comp = torch.randint(0, vocab, (cl,), generator=g).tolist()
        samples.append(
            Sample(
                "t", f"r{i}", "ab"[i % 2], "g", 0, prompt, comp, [0.0] * cl, False, 0, False, 0, "stop", "x"
            )
        )
        adv.append(1.0 if i % 2 else -1.0)

    tmp = tempfile.mkdtemp()
    kw = dict(
        max_steps=100, learning_rate=1e-6, loss_type=a.loss_type, max_completion_length=a.completion_len
    )
    ours = GroupGRPOTrainer(
        copy.deepcopy(model), tok, grpo_args(tmp + "/ours", **kw), micro_batch_size=a.batch
    )
    # on-policy sampling logprobs, so the IS correction keeps every sequence (as with a real backend)
    inputs = ours.build_inputs(samples, adv)
    true = ours._policy_logps(inputs)
    samples = [
        Sample(**{**s.__dict__, "sampling_logprobs": true[i, : len(s.completion_ids)].tolist()})
        for i, s in enumerate(samples)
    ]
    ds = __import__("datasets").Dataset.from_dict({"prompt": ["x"]})
    plain = GRPOTrainer(
        model=copy.deepcopy(model),
        reward_funcs=[_no_reward],
        args=grpo_args(tmp + "/plain", **kw),
        train_dataset=ds,
        processing_class=tok,
    )
    plain.create_optimizer_and_scheduler(num_training_steps=100)
    trl_inputs = {k: v for k, v in ours.build_inputs(samples, adv).items() if k != "sampling_per_token_logps"}

    def plain_step():
        m = plain.model
        m.train()
        plain.current_gradient_accumulation_steps = 1
        with plain.compute_loss_context_manager():
            loss = plain.compute_loss(m, dict(trl_inputs))
        plain.accelerator.backward(loss)
        plain.accelerator.clip_grad_norm_(m.parameters(), plain.args.max_grad_norm)
        plain.optimizer.step()
        plain.lr_scheduler.step()
        plain.optimizer.zero_grad(set_to_none=True)

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    variants = {
        "plain TRL": plain_step,
        "ours": lambda: ours.update(samples, adv),
        "ours + per-agent grad norms": lambda: ours.update(samples, adv, agent_grad_norms=True),
    }
    for fn in variants.values():  # warm-up (allocator, first optimizer state)
        fn()
    times = {k: [] for k in variants}
    for _ in range(a.reps):
        for k, fn in variants.items():
            times[k].append(timed(fn))
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    print(
        f"model {a.model} | batch {a.batch} samples, {tokens} tokens | loss_type {a.loss_type} | "
        f"threads {torch.get_num_threads()} | {a.reps} reps (median)"
    )
    base = statistics.median(times["plain TRL"])
    for k, ts in times.items():
        med = statistics.median(ts)
        print(
            f"  {k:<30} {med:7.3f} s   ratio {med / base:5.2f}   (all: {', '.join(f'{t:.3f}' for t in ts)})"
        )


if __name__ == "__main__":
    main()

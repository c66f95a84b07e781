"""Per-group update time of ``GroupGRPOTrainer.update`` vs plain TRL ``GRPOTrainer`` on the same batch.

Both sides train the same model on the same pre-generated batch with the same ``loss_type``, one optimizer step
each: plain TRL runs its own inner step (``compute_loss`` → ``accelerator.backward`` → ``clip_grad_norm_`` →
``optimizer.step`` → ``lr_scheduler.step``) on TRL's padded input dict; ours runs ``update(samples,
advantages)`` (padding from samples, importance-sampling correction, micro-batching, optional per-agent
gradient norms). Repetitions alternate between the sides and the medians are compared; the fp32 GEMM roof is
measured in the same run and the update's FLOP/s (``6 * N`` per prompt + completion token) is printed as a
fraction of it. Goal: ``ratio_vs_trl <= 1.0``.

``--shared_prefix N`` starts every prompt of an agent with the same N tokens (as the few-shot prompts do: 244 of
the verifier's ~265 tokens) and also times ours with the shared-prefix forward switched off
(``mas_train.grpo.prefix``): ``ratio_shared_prefix`` = ours / ours-without-it, same batch, same gradient.

    python benchmarks/train_step.py --threads 2              # SmolLM2-135M, 8 samples, dapo
    python benchmarks/train_step.py --shared_prefix 200 --prompt_len 240 --completion_len 20 --batch 16
    python benchmarks/train_step.py --model tiny-qwen3 --reps 5 --loss_type grpo
    python benchmarks/train_step.py --tiny --json            # tiny-qwen3, 2 short samples, 1 rep (CI)

JSON keys: ``ratio_vs_trl`` (ours / plain TRL, medians), ``ratio_agent_norms_vs_trl``, ``ratio_shared_prefix``
(with ``--shared_prefix``), ``ours_s``, ``trl_s``, ``update_roof_frac`` (ours; FLOPs of the full prompts, so above
1 when the shared prefix saves work).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

from _common import emit, gemm_flops, set_threads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", type=int, default=8, help="samples in the batch")
    p.add_argument("--prompt_len", type=int, default=96)
    p.add_argument("--completion_len", type=int, default=48)
    p.add_argument("--shared_prefix", type=int, default=0, help="tokens every prompt of an agent starts with")
    p.add_argument("--loss_type", default="dapo")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--tiny", action="store_true", help="tiny-qwen3, 2 samples of 12 + 6 tokens, 1 rep (CI)")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    a = p.parse_args()
    if a.tiny:
        a.model, a.batch, a.prompt_len, a.completion_len, a.reps = "tiny-qwen3", 4, 36, 12, 1
        a.shared_prefix = 20

    import torch
    from trl import GRPOTrainer

    from mas_train.grpo.trl_adapter import grpo_args, no_reward
    from mas_train.grpo.update import GroupGRPOTrainer
    from mas_train.models import load_model_and_tokenizer
    from mas_train.rollout import Sample

    threads = set_threads(a.threads)
    model, tok = load_model_and_tokenizer(a.model)
    g = torch.Generator().manual_seed(0)
    vocab = min(len(tok), 30000)
    samples, adv = [], []
    heads = {k: torch.randint(0, vocab, (a.shared_prefix,), generator=g).tolist() for k in "ab"}
    for i in range(a.batch):
        # lengths vary like real turns do, so padding costs the same on both sides
        pl, cl = a.prompt_len - (i % 4) * 4, a.completion_len - (i % 3) * 4
        head = heads["ab"[i % 2]]
        prompt = head + torch.randint(0, vocab, (pl - len(head),), generator=g).tolist()
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
    unshared = GroupGRPOTrainer(
        copy.deepcopy(model),
        tok,
        grpo_args(tmp + "/unshared", **kw),
        micro_batch_size=a.batch,
        share_prefix=False,
    )
    # on-policy sampling logprobs, so the IS correction keeps every sequence (as with a real backend)
    inputs = ours.build_inputs(samples, adv)
    true = ours.completion_logps(ours.model, inputs)
    samples = [
        Sample(**{**s.__dict__, "sampling_logprobs": true[i, : len(s.completion_ids)].tolist()})
        for i, s in enumerate(samples)
    ]
    ds = __import__("datasets").Dataset.from_dict({"prompt": ["x"]})
    plain = GRPOTrainer(
        model=copy.deepcopy(model),
        reward_funcs=[no_reward],
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
    if a.shared_prefix:
        variants["ours, no shared-prefix forward"] = lambda: unshared.update(samples, adv)
    for fn in variants.values():  # warm-up (allocator, first optimizer state)
        fn()
    times = {k: [] for k in variants}
    for _ in range(a.reps):
        for k, fn in variants.items():
            times[k].append(timed(fn))
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    print(
        f"model {a.model} | batch {a.batch} samples, {tokens} tokens ({a.shared_prefix} shared per agent) | "
        f"loss_type {a.loss_type} | "
        f"threads {threads} | {a.reps} reps (median)"
    )
    gemm = gemm_flops()
    flop = 6 * sum(p.numel() for p in model.parameters() if p.requires_grad) * tokens
    base = statistics.median(times["plain TRL"])
    meds = {k: statistics.median(ts) for k, ts in times.items()}
    print(f"  fp32 GEMM roof {gemm / 1e9:.1f} GFLOP/s; one update = {flop / 1e9:.1f} GFLOP (6N per token)")
    for k, ts in times.items():
        med = meds[k]
        print(
            f"  {k:<30} {med:7.3f} s   ratio {med / base:5.2f}   {flop / med / gemm:5.2f} of GEMM roof   "
            f"(all: {', '.join(f'{t:.3f}' for t in ts)})"
        )
    extra = {}
    if a.shared_prefix:
        extra["ratio_shared_prefix"] = meds["ours"] / meds["ours, no shared-prefix forward"]
    emit(
        {
            **extra,
            "model": a.model,
            "threads": threads,
            "tokens": tokens,
            "trl_s": base,
            "ours_s": meds["ours"],
            "ratio_vs_trl": meds["ours"] / base,
            "ratio_agent_norms_vs_trl": meds["ours + per-agent grad norms"] / base,
            "update_roof_frac": flop / meds["ours"] / gemm,
            "gemm_gflop_s": gemm / 1e9,
        },
        a.json,
    )


if __name__ == "__main__":
    main()

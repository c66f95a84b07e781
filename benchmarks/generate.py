"""Decode throughput of ``HFBackend`` vs plain ``transformers`` ``generate`` and vs the decode roof, batch B.

    python benchmarks/generate.py --threads 2                 # SmolLM2-135M, batch 8, 64 new tokens
    python benchmarks/generate.py --tiny --json               # tiny-qwen3, smallest settings (CI)

Both sides sample B completions of the same chat prompt at temperature 1 with EOS disabled, so every row
generates exactly ``--new_tokens`` tokens; repetitions alternate between the sides and medians are compared.
The decode roof is measured in the same run: a decode step must read every weight once, so at memory bandwidth
``bw`` (``dst.copy_(src)``, read + write bytes) a step takes at least ``weight_bytes / bw`` and B rows give
``B * bw / weight_bytes`` tokens/s. The fp32 GEMM roof is printed alongside (at batch 8 a SmolLM2 step also
needs ``2 * N * B`` FLOP, about as long as the weight read on 2 cores). Prefill is included in both timings
(the prompt is short). Goal: ``roof_frac >= 0.4`` at batch 8 with SmolLM2-135M.
"""

from __future__ import annotations

import argparse

from _common import copy_bandwidth, emit, gemm_flops, median_time, set_threads, weight_bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--tiny", action="store_true", help="tiny-qwen3, batch 2, 4 tokens, 1 rep (CI)")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    a = p.parse_args()
    if a.tiny:
        a.model, a.batch, a.new_tokens, a.reps = "tiny-qwen3", 2, 4, 1

    import torch

    from mas_train.backends.base import SamplingParams
    from mas_train.backends.hf import HFBackend
    from mas_train.models import load_model_and_tokenizer

    threads = set_threads(a.threads)
    model, tok = load_model_and_tokenizer(a.model)
    model.eval()
    text = "What is 12 times 7? Think step by step, then give the answer."
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tok(prompt)["input_ids"]
    backend = HFBackend(model, tok, share_model=True, eos_token_ids=())
    sps = [SamplingParams(max_new_tokens=a.new_tokens, temperature=1.0, seed=i) for i in range(a.batch)]
    batch = torch.tensor([prompt_ids] * a.batch)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def ours():
        outs = backend.generate([prompt_ids] * a.batch, sps)
        assert all(len(o.completion_ids) == a.new_tokens for o in outs)

    def plain():
        with torch.inference_mode():
            out = model.generate(
                batch,
                attention_mask=torch.ones_like(batch),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=a.new_tokens,
                min_new_tokens=a.new_tokens,
                pad_token_id=pad,
            )
        assert out.shape[1] == batch.shape[1] + a.new_tokens

    ours()
    plain()  # warm-up
    t_ours, t_plain, bws = [], [], []
    for _ in range(a.reps):
        bws.append(copy_bandwidth(reps=3))
        t_ours.append(median_time(ours, 1)[0])
        t_plain.append(median_time(plain, 1)[0])
    gemm = gemm_flops()
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    bw, wb = med(bws), weight_bytes(model)
    tokens = a.batch * a.new_tokens
    ours_tps, plain_tps = tokens / med(t_ours), tokens / med(t_plain)
    roof_tps = a.batch * bw / wb
    step_flop = 2 * sum(p.numel() for p in model.parameters()) * a.batch
    gemm_tps = a.batch * gemm / step_flop
    print(
        f"model {a.model} | batch {a.batch} | {a.new_tokens} new tokens | prompt {len(prompt_ids)} tokens | "
        f"threads {threads} | {a.reps} reps (median)"
    )
    print(
        f"  weights {wb / 1e9:.3f} GB | copy bandwidth {bw / 1e9:.1f} GB/s | fp32 GEMM {gemm / 1e9:.1f} GFLOP/s"
    )
    print(f"  {'':<26}{'tok/s':>9}{'of roof':>9}")
    print(f"  {'decode roof (bandwidth)':<26}{roof_tps:9.1f}{1:9.2f}")
    print(f"  {'decode roof (GEMM)':<26}{gemm_tps:9.1f}{gemm_tps / roof_tps:9.2f}")
    print(f"  {'HFBackend':<26}{ours_tps:9.1f}{ours_tps / roof_tps:9.2f}")
    print(f"  {'transformers generate':<26}{plain_tps:9.1f}{plain_tps / roof_tps:9.2f}")
    print(f"  HFBackend / generate: {ours_tps / plain_tps:.2f}x")
    emit(
        {
            "model": a.model,
            "batch": a.batch,
            "threads": threads,
            "tok_s": ours_tps,
            "generate_tok_s": plain_tps,
            "roof_tok_s": roof_tps,
            "gemm_roof_tok_s": gemm_tps,
            "roof_frac": ours_tps / roof_tps,
            "ratio_vs_generate": ours_tps / plain_tps,
            "bandwidth_gb_s": bw / 1e9,
            "gemm_gflop_s": gemm / 1e9,
        },
        a.json,
    )


if __name__ == "__main__":
    main()

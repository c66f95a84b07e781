"""Batched rollout collection vs one env at a time, at G = 8.

The same G episodes of one task are collected twice: by the lock-step collector (all pending turns of all G
envs in one ``generate`` call per tick) and by stepping the G envs one after another (one prompt per call).
Prints both wall times, generated tokens and their ratio. Goal: batched >= 3x faster.

    python benchmarks/rollout.py                           # SmolLM2-135M on math-2agent
    python benchmarks/rollout.py --model tiny-qwen3 --max_new_tokens 64
    python benchmarks/rollout.py --tiny --json             # tiny-qwen3, G=2, 4 new tokens (CI)

JSON keys: ``speedup`` (wall, one-at-a-time / batched), ``speedup_tokens_per_s``, ``batched_s``, ``single_s``.
"""

from __future__ import annotations

import argparse
import time

from _common import emit, set_threads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--env", default="math-2agent")
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max_new_tokens", type=int, default=48)
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--tiny", action="store_true", help="tiny-qwen3, G=2, 4 new tokens (CI)")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    a = p.parse_args()
    if a.tiny:
        a.model, a.G, a.max_new_tokens = "tiny-qwen3", 2, 4

    import mas_envs
    from mas_train.backends.base import SamplingParams
    from mas_train.backends.hf import HFBackend
    from mas_train.models import load_model_and_tokenizer
    from mas_train.rollout import RolloutCollector

    threads = set_threads(a.threads)
    model, tok = load_model_and_tokenizer(a.model)
    backend = HFBackend(model, tok, share_model=True)
    env0 = mas_envs.make(a.env)
    agents = list(env0.possible_agents)
    task = env0.unwrapped.tasks[a.task_index]
    sp = SamplingParams(max_new_tokens=a.max_new_tokens, temperature=1.0)
    col = RolloutCollector(
        lambda: mas_envs.make(a.env),
        {"g": backend},
        {"g": tok},
        {ag: "g" for ag in agents},
        {ag: sp for ag in agents},
        seed=0,
    )
    col.collect([task], 2)  # warm-up

    t0 = time.perf_counter()
    batched = col.collect([task], a.G, step=1)
    t_batched = time.perf_counter() - t0

    t0 = time.perf_counter()
    single = [col.collect([task], 1, step=100 + i) for i in range(a.G)]
    t_single = time.perf_counter() - t0

    tok_b = sum(len(s.completion_ids) for s in batched.samples)
    tok_s = sum(len(s.completion_ids) for b in single for s in b.samples)
    print(f"model {a.model} | env {a.env} | G={a.G} | max_new_tokens {a.max_new_tokens} | threads {threads}")
    print(
        f"  batched collector : {t_batched:7.2f} s, {tok_b} tokens, {sum(batched.generate_calls.values())} calls"
    )
    print(
        f"  one env at a time : {t_single:7.2f} s, {tok_s} tokens, {sum(sum(b.generate_calls.values()) for b in single)} calls"
    )
    print(f"  speed-up (wall)   : {t_single / t_batched:5.2f}x")
    print(f"  speed-up (tokens/s): {(tok_b / t_batched) / (tok_s / t_single):5.2f}x")
    emit(
        {
            "model": a.model,
            "G": a.G,
            "threads": threads,
            "batched_s": t_batched,
            "single_s": t_single,
            "speedup": t_single / t_batched,
            "speedup_tokens_per_s": (tok_b / t_batched) / (tok_s / t_single),
        },
        a.json,
    )


if __name__ == "__main__":
    main()

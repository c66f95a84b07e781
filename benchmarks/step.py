"""Default training steps: generation tok/s vs the decode roof, update FLOP/s vs the GEMM roof, peak RSS.

    python benchmarks/step.py --threads 2                      # mas-train --env math-2agent defaults, 1 step
    python benchmarks/step.py --steps 3 -- --num_generations 8  # flags after -- go to mas-train
    python benchmarks/step.py --tiny --json                      # tiny-qwen3, G=2, 8 new tokens (CI)
    python benchmarks/step.py --threads 2 --profile 12           # + where each dtype's update time goes

Builds the trainer exactly as ``mas-train`` does (``parse_args`` + ``assemble_trainer``) and runs ``--steps``
training steps (no evaluation, no checkpoint), reading each step's own timers (``time/generate``,
``time/update``). Roofs are measured in the same process before the first step:

* decode roof: ``rows * bandwidth / weight_bytes`` tokens/s, where ``rows`` is the rows a tick generates
  (``tasks_per_step * num_generations``) and ``bandwidth`` is ``dst.copy_(src)`` (read + write bytes). Generation
  time includes prefill, env stepping excluded, so ``gen_roof_frac`` is conservative;
* GEMM roof: 1024^2 GEMM FLOP/s, fp32 and bf16 (``update_roof_frac`` is against the roof of the precision the
  run as configured computes in; ``update_roof_frac_bf16`` / ``_fp32`` against each one's own). The update does
  ``6 * N * tokens`` FLOP for a fully trained model (forward 2N, backward 4N per token; N = all of the model's
  parameters; prompt + completion tokens of the step's samples) and ``4 * N * tokens`` for a LoRA group (its
  frozen base gets no weight gradients: forward 2N, the input gradients 2N), so ``update_roof_frac`` is that over
  update time and the roof. Work the update avoids (the shared-prefix forward, zero-advantage samples) still
  counts, so a step can exceed 1; ``update_done_roof_frac`` counts only the work done (below).

Peak RSS is this process's ``ru_maxrss`` (model load included), the figure ``/usr/bin/time -v`` reports.

bf16 side by side: after the steps as configured, the same steps run again in the same process in the other
precision (``mas_train.precision``): fp32 (``--dtype float32``) where ``dtype: auto`` picked bf16, else the bf16
rule of a CPU with native bf16, forced (on a CPU without it, e.g. AVX2 only, bf16 then runs emulated and slower).
``bf16_update_speedup`` is the bf16 run's update FLOP/s of work done over the fp32 run's: FLOP/s, since the two
runs sample different completions, and of the work done (the token positions the update ran through the model,
``charts/num_forward_tokens/<group>``: padding counted, each shared prefix once, left-out zero-advantage samples
not at all), since how many samples have advantage 0 depends on the rewards each run happened to sample (the
batch's FLOP over-counts by that; in the default math step often 2-4x); ``native_bf16`` is what the CPU reported (:func:`mas_train.precision.cpu_native_bf16`).

``--profile N`` runs every update under ``torch.profiler`` (CPU activities, ``with_flops``) in both runs and
prints, per dtype, the update's self CPU time by kind of op (GEMM ``mm``/``addmm``/``bmm``, attention, log-softmax,
casts and copies, optimizer, the rest), the GFLOP/s the GEMM kernels themselves reach (the profiler's FLOP count
over their self time) against the GEMM roof, and the top ``N`` ops. The profiler adds overhead to every op, so
the timings and ``bf16_update_speedup`` of a profiled run are not the unprofiled ones: profile and measure in
separate runs. The JSON gains ``profile_bf16`` / ``profile_fp32`` (share of self time per kind, GEMM GFLOP/s).

JSON keys: ``gen_roof_frac``, ``update_roof_frac``, ``peak_rss_gb``, ``step_s`` (median over steps),
``update_done_roof_frac`` (work done over the roof), ``native_bf16`` (+ ``native_bf16_reason``),
``bf16_update_speedup`` and the raw numbers they come from.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from _common import copy_bandwidth, emit, gemm_flops, peak_rss_gb, set_threads, weight_bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="math-2agent")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--micro_batch_size",
        type=int,
        default=None,
        help="samples per forward/backward (default: the config's)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile every update (torch.profiler) and print the top N ops per dtype; 0: off",
    )
    p.add_argument("--tiny", action="store_true", help="tiny-qwen3, G=2, 8 new tokens, 1 step (CI)")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    p.add_argument("mas_train_args", nargs="*", help="extra mas-train flags (after --)")
    a = p.parse_args()
    extra = list(a.mas_train_args)
    if a.tiny:
        a.steps = 1
        extra = ["--model", "tiny-qwen3", "--num_generations", "2", "--sampling.max_new_tokens", "8", *extra]

    from mas_train.command import quiet_libraries
    from mas_train.config import parse_args
    from mas_train.precision import cpu_native_bf16

    threads = set_threads(a.threads)
    quiet_libraries()
    argv = ["--env", a.env, "--max_steps", str(a.steps), "--eval_steps", "0", "--save_steps", "0"]
    if a.micro_batch_size is not None:
        argv += ["--micro_batch_size", str(a.micro_batch_size)]
    native, native_why = cpu_native_bf16()
    cfg = parse_args([*argv, "--output_dir", tempfile.mkdtemp(prefix="mas-bench-step-"), *extra])
    bw, gemm, gemm16 = copy_bandwidth(), gemm_flops(), gemm_flops(dtype="bfloat16")
    rows = cfg.tasks_per_step * cfg.num_generations
    rep, resolved, w_bytes, plan, prof = _run(cfg, a.steps, rows, force_bf16=False, profile=a.profile > 0)
    rss = peak_rss_gb()  # of the run as configured; the other dtype's run below may add to it
    # the same step in the other precision, in this process: bf16 (dtype auto's CPU rule, forced where the CPU
    # has no native bf16, so it runs emulated) against fp32 (--dtype float32)
    bf16_is_default = any(not p.computes_fp32 for p in plan.values())
    other = parse_args(
        [*argv, "--output_dir", tempfile.mkdtemp(prefix="mas-bench-step-"), *extra]
        + ["--dtype", "float32" if bf16_is_default else "auto"]
    )
    rep_other, _, _, plan_other, prof_other = _run(
        other, a.steps, rows, force_bf16=not bf16_is_default, profile=a.profile > 0
    )
    rep_bf16, rep_fp32 = (rep, rep_other) if bf16_is_default else (rep_other, rep)
    prof_bf16, prof_fp32 = (prof, prof_other) if bf16_is_default else (prof_other, prof)
    med = {k: statistics.median(r[k] for r in rep) for k in rep[0]}
    flops_bf16, flops_fp32 = (
        statistics.median(r["done_flop"] / r["update_s"] for r in rr if r["update_s"] > 0)
        for rr in (rep_bf16, rep_fp32)
    )
    wb = max(w_bytes.values())
    roof_tps = rows * bw / wb
    gen_tps = med["gen_tokens"] / med["gen_s"]
    upd_flops = med["update_flop"] / med["update_s"] if med["update_s"] > 0 else 0.0
    done_flops = med["done_flop"] / med["update_s"] if med["update_s"] > 0 else 0.0
    roof = gemm16 if bf16_is_default else gemm  # the roof of the precision the run as configured computes in
    print(
        f"env {cfg.env} | {a.steps} step(s) | G={cfg.num_generations} x {cfg.tasks_per_step} task(s) | "
        f"micro-batch {cfg.micro_batch_size} | threads {threads} | medians over steps"
    )
    print(
        f"  weights {wb / 1e9:.3f} GB | copy bandwidth {bw / 1e9:.1f} GB/s | fp32 GEMM {gemm / 1e9:.1f} GFLOP/s | "
        f"bf16 GEMM {gemm16 / 1e9:.1f} GFLOP/s"
    )
    print(
        f"  step {med['step_s']:.1f} s = generate {med['gen_s']:.1f} s + update {med['update_s']:.1f} s + rest"
    )
    print(
        f"  generation {gen_tps:7.1f} tok/s  roof {roof_tps:7.1f} tok/s at {rows} rows  "
        f"-> {gen_tps / roof_tps:.3f} of roof"
    )
    print(
        f"  update     {upd_flops / 1e9:7.1f} GFLOP/s (4N/6N per token)  roof {roof / 1e9:.1f} "
        f"({'bf16' if bf16_is_default else 'fp32'})  -> {upd_flops / roof:.3f} of roof"
    )
    print(
        f"  update     {done_flops / 1e9:7.1f} GFLOP/s of work done (positions it ran: {med['done_flop'] / 1e12:.2f} "
        f"of {med['update_flop'] / 1e12:.2f} TFLOP)  -> {done_flops / roof:.3f} of roof"
    )
    print(f"  peak RSS   {rss:.2f} GB")
    print(f"  native bf16: {native} ({native_why})")
    for g, p in plan.items():
        print(f"  model group {g!r}: {p.reason}")
    for g, p in (plan_other if not bf16_is_default else {}).items():
        print(f"  model group {g!r} in the bf16 run: {p.reason}")
    print(
        f"  update (work done) bf16 {flops_bf16 / 1e9:.1f} GFLOP/s vs fp32 {flops_fp32 / 1e9:.1f} GFLOP/s "
        f"-> bf16_update_speedup {flops_bf16 / flops_fp32:.2f}; of their roofs: bf16 {flops_bf16 / gemm16:.3f}, "
        f"fp32 {flops_fp32 / gemm:.3f}"
    )
    profiles = {}
    if a.profile:
        for name, ops, roof_d in (("bf16", prof_bf16, gemm16), ("fp32", prof_fp32, gemm)):
            profiles[f"profile_{name}"] = _print_profile(name, ops, roof_d, a.profile)
    emit(
        {
            "env": cfg.env,
            "threads": threads,
            "rows": rows,
            "step_s": med["step_s"],
            "gen_s": med["gen_s"],
            "update_s": med["update_s"],
            "gen_tok_s": gen_tps,
            "gen_roof_tok_s": roof_tps,
            "gen_roof_frac": gen_tps / roof_tps,
            "update_gflop_s": upd_flops / 1e9,
            "gemm_gflop_s": gemm / 1e9,
            "gemm_bf16_gflop_s": gemm16 / 1e9,
            "update_roof_frac": upd_flops / roof,
            "update_done_gflop_s": done_flops / 1e9,
            "update_done_roof_frac": done_flops / roof,
            "update_roof_frac_bf16": flops_bf16 / gemm16,
            "update_roof_frac_fp32": flops_fp32 / gemm,
            "bandwidth_gb_s": bw / 1e9,
            "peak_rss_gb": rss,
            "native_bf16": native,
            "native_bf16_reason": native_why,
            "bf16_update_gflop_s": flops_bf16 / 1e9,
            "fp32_update_gflop_s": flops_fp32 / 1e9,
            "bf16_update_speedup": flops_bf16 / flops_fp32,
            **profiles,
        },
        a.json,
    )


# kinds of op, first match wins: (kind, substrings of the aten op name)
_KINDS = (
    ("gemm", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn_", "onednn")),
    ("attention", ("attention", "aten::_efficient", "aten::_flash")),
    ("log_softmax", ("softmax",)),
    ("cast_copy", ("aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous")),
    ("optimizer", ("adam", "_foreach", "Optimizer")),
)


def _kind(op: str) -> str:
    for kind, keys in _KINDS:
        if any(op == k or op.startswith(k) or (not k.startswith("aten::") and k in op) for k in keys):
            return kind
    return "other"


def _print_profile(name: str, ops: dict[str, list[float]], roof: float, top: int) -> dict[str, float]:
    """Print one dtype's update profile (``ops``: op -> [self CPU us, calls, FLOP]); return its summary."""
    total = sum(v[0] for v in ops.values()) or 1.0
    by_kind: dict[str, float] = {}
    for op, (us, _, _) in ops.items():
        by_kind[_kind(op)] = by_kind.get(_kind(op), 0.0) + us
    gemm_us = sum(v[0] for op, v in ops.items() if _kind(op) == "gemm")
    gemm_flop = sum(v[2] for op, v in ops.items() if _kind(op) == "gemm")
    gemm_gflops = gemm_flop / gemm_us / 1e3 if gemm_us else 0.0
    print(
        f"  profile {name}: update self CPU {total / 1e6:.1f} s | "
        + " | ".join(f"{k} {v / total:.0%}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    )
    print(
        f"    GEMM kernels {gemm_gflops:.1f} GFLOP/s (profiler FLOP / self time) = {gemm_gflops * 1e9 / roof:.2f} of roof"
    )
    for op, (us, calls, flop) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]:
        rate = f"  {flop / us / 1e3:6.1f} GFLOP/s" if flop else ""
        print(f"    {us / total:6.1%}  {us / 1e6:7.2f} s  {int(calls):6d} calls  {op}{rate}")
    return {
        **{f"share_{k}": v / total for k, v in by_kind.items()},
        "gemm_gflop_s": gemm_gflops,
        "self_cpu_s": total / 1e6,
    }


def _profiled(update, ops: dict[str, list[float]]):
    """``update`` run under ``torch.profiler`` (CPU, FLOP counts); its ops' self time added into ``ops``."""
    import functools

    from torch.profiler import ProfilerActivity, profile

    @functools.wraps(update)
    def run(*args, **kwargs):
        with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
            out = update(*args, **kwargs)
        for ev in prof.key_averages():
            acc = ops.setdefault(ev.key, [0.0, 0.0, 0.0])
            acc[0] += ev.self_cpu_time_total
            acc[1] += ev.count
            acc[2] += ev.flops or 0
        return out

    return run


def _run(cfg, n_steps: int, rows: int, *, force_bf16: bool, profile: bool = False):
    """``n_steps`` training steps of ``cfg``, built as ``mas-train`` builds them: per step ``step_s``,
    ``gen_s``, ``update_s``, ``gen_tokens``, ``update_flop``; the resolved config; each group's weight bytes and
    :class:`~mas_train.precision.Precision`; the update profile (op -> [self CPU us, calls, FLOP], empty unless
    ``profile``). ``force_bf16``: as if the CPU had native bf16 (dtype auto's rule)."""
    import mas_envs
    import mas_train.precision as precision
    from mas_train.assemble import assemble_trainer
    from mas_train.models import resolve_device

    detect = precision.cpu_native_bf16
    if force_bf16:
        precision.cpu_native_bf16 = lambda: (True, "forced by the benchmark")
    try:
        agents = list(mas_envs.make(cfg.env, **cfg.env_make_kwargs()).possible_agents)
        resolved = cfg.resolve(agents)
        plan = {
            g: precision.resolve_precision(rg.dtype, resolve_device(cfg.device), lora=rg.lora is not None)
            for g, rg in resolved.model_groups.items()
        }
        trainer = assemble_trainer(resolved)
        # FLOP per trained token: every weight of the model is read (N counts the frozen base of a LoRA group too)
        flop_per_token = {}
        for g in trainer.groups:
            w = trainer.pool.worker(g)
            n = sum(p.numel() for p in w.model.parameters()) if w.model is not None else 0
            flop_per_token[g] = (4 if getattr(w, "peft_model", None) is not None else 6) * n
        w_bytes = {g: weight_bytes(trainer.pool.worker(g).model) for g in trainer.groups}
        ops: dict[str, list[float]] = {}
        if profile:
            for g in trainer.groups:
                w = trainer.pool.worker(g)
                w.update = _profiled(w.update, ops)
        steps = []
        try:
            for _ in range(n_steps):
                m, _ = trainer.train_step()
                gen_tokens = sum(m.get(f"charts/num_tokens/{g}", 0.0) for g in trainer.groups)
                steps.append((m, gen_tokens))
        finally:
            trainer.close()
    finally:
        precision.cpu_native_bf16 = detect
    # trained tokens (prompt + completion) from the per-agent means: turns per trajectory x trajectories
    rep = []
    for m, gen_tokens in steps:
        trained = 0.0
        for g in trainer.groups:
            for ag in resolved.model_groups[g].agents:
                turns = m.get(f"charts/turns/{ag}", 0.0) * rows
                trained += (
                    flop_per_token[g]
                    * turns
                    * (m.get(f"charts/tokens/{ag}", 0.0) + m.get(f"charts/prompt_tokens/{ag}", 0.0))
                )
        rep.append(
            {
                "step_s": m["time/step"],
                "gen_s": m["time/generate"],
                "update_s": m["time/update"],
                "gen_tokens": gen_tokens,
                "update_flop": trained,
                # the work the update did: the positions it ran through the model (left-out zero-advantage
                # samples and a shared prefix's repeats not counted, padding counted)
                "done_flop": sum(
                    flop_per_token[g] * m.get(f"charts/num_forward_tokens/{g}", 0.0) for g in trainer.groups
                ),
            }
        )
    return rep, resolved, w_bytes, plan, ops


if __name__ == "__main__":
    main()

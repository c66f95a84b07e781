"""Shared helpers of the benchmark scripts: roofs measured in the same run, thread setup, output.

Every benchmark compares against a roof or a baseline measured by the same process right before or between
its own repetitions, so a number never depends on a figure written down on another day or machine:

* memory bandwidth: ``dst.copy_(src)`` over two buffers far larger than the caches, bytes read + written per
  second (the ``memcpy`` convention);
* GEMM roof: fp32 ``(n, n) @ (n, n)`` FLOP/s (``2 n^3`` FLOP per product).

Medians of ``reps`` repetitions are reported because other jobs share the CPU.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (``None``: leave torch's default); returns the count in use."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def median_time(fn: Callable[[], object], reps: int) -> tuple[float, list[float]]:
    """``(median seconds, all seconds)`` of ``reps`` calls of ``fn``."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def copy_bandwidth(mib: int = 256, reps: int = 5) -> float:
    """Memory bandwidth in bytes/s: ``dst.copy_(src)`` of ``mib`` MiB fp32, (read + write bytes) / median time.

    The buffers are filled (``torch.rand``), not ``torch.empty``: untouched pages all map to one zero page
    and would read at cache speed.
    """
    import torch

    n = mib * 2**20 // 4
    src, dst = torch.rand(n), torch.rand(n)
    dst.copy_(src)
    t, _ = median_time(lambda: dst.copy_(src), reps)
    return 2 * n * 4 / t


def gemm_flops(n: int = 1024, reps: int = 5, dtype: str = "float32") -> float:
    """GEMM roof in FLOP/s: ``2 n^3`` / median time of ``(n, n) @ (n, n)`` in ``dtype`` ("float32" or
    "bfloat16"; a bf16 product accumulates in fp32 inside oneDNN, as the model's linears do)."""
    import torch

    dt = getattr(torch, dtype)
    a, b = torch.rand(n, n, dtype=dt), torch.rand(n, n, dtype=dt)
    a @ b
    t, _ = median_time(lambda: a @ b, reps)
    return 2 * n**3 / t


def peak_rss_gb() -> float:
    """This process's peak resident set size so far, in GB (10^9 bytes; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def weight_bytes(model) -> int:
    """Bytes of a model's parameters (tied weights counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def emit(result: dict, as_json: bool) -> None:
    """With ``--json``, print ``result`` as one JSON object on the last line of stdout."""
    if as_json:
        sys.stdout.flush()
        print(json.dumps(result, sort_keys=True))


def cores_spec(threads: int) -> str:
    """The CPU list ``0-(threads-1)`` (``"0"`` for one) that binds a server's OpenMP threads to as many cores as
    the in-process side uses (vLLM's ``VLLM_CPU_OMP_THREADS_BIND``)."""
    return "0" if threads <= 1 else f"0-{threads - 1}"

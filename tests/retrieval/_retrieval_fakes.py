"""Test doubles for retrieval tests: a cheap deterministic encoder and a tiny corpus."""

from __future__ import annotations

import re
import zlib

import numpy as np

from retrieval_index.encoder import Encoder


class HashEncoder(Encoder):
    """Bag of words hashed into `dim` buckets, L2-normalised: texts sharing words get high cosine.

    `fail_after` makes the encoder raise after that many passage calls (to simulate a killed build);
    `calls` counts passages embedded.
    """

    def __init__(self, dim: int = 64, name: str = "test-hash-encoder", fail_after: int | None = None):
        self.dim = dim
        self.name = name
        self.fail_after = fail_after
        self.passage_calls = 0
        self.passages_embedded = 0

    def _encode(self, texts, is_query):
        if not is_query:
            if self.fail_after is not None and self.passage_calls >= self.fail_after:
                raise KeyboardInterrupt("simulated kill")
            self.passage_calls += 1
            self.passages_embedded += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[i, zlib.crc32(word.encode()) % self.dim] += 1.0
            out[i] /= max(np.linalg.norm(out[i]), 1e-12)
        return out


CORPUS = [
    {"id": "d0", "title": "Ulaanbaatar", "text": "Ulaanbaatar is the capital of Mongolia."},
    {"id": "d1", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "d2", "title": "Animal Farm", "text": "Animal Farm is a novel by George Orwell."},
    {"id": "d3", "title": "Green Day", "text": "Green Day released the album Dookie in 1994."},
    {"id": "d4", "title": "Mount Everest", "text": "Mount Everest is the highest mountain above sea level."},
    {"id": "d5", "title": "Python", "text": "Python is a programming language created by Guido van Rossum."},
    {"id": "d6", "title": "Nile", "text": "The Nile is a river in northeastern Africa."},
]


class LiveServer:
    """Run the FastAPI app with uvicorn on a free loopback port in a background thread."""

    def __init__(self, app):
        import socket
        import threading

        import uvicorn

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/retrieve"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        import time

        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __exit__(self, *exc):
        self.stop()

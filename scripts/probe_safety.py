"""Re-run the probes of the safety and robustness sweep (issue 27) and print what each one measures.

    python scripts/probe_safety.py server      # the retrieval server: big bodies, a long request, bad fields
    python scripts/probe_safety.py http        # trickling / hanging / garbage / closing peers vs the clients
    python scripts/probe_safety.py grader      # concurrent hanging grades, a killed parent, digits, tiny values
    python scripts/probe_safety.py config      # ${oc.env:...} in a flag
    python scripts/probe_safety.py checkpoint  # planted pickles on --resume, kill -9 during a re-save

Every server it talks to is on 127.0.0.1. Numbers depend on the machine; name the CPU beside them.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _PeakRSS:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, _rss_mb(pid), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> _PeakRSS:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def probe_server() -> None:
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}/retrieve"
    proc = subprocess.Popen(
        [sys.executable, "-m", "retrieval_index", "serve", "--bundled", "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url.replace("/retrieve", "/health"), timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("server did not start")
            time.sleep(0.5)
        httpx.post(url, json={"query": "warm up"}, timeout=60)
        print(f"server idle RSS {_rss_mb(proc.pid):.0f} MB")

        def big_body():  # 200 MB, streamed without Content-Length
            chunk = b'"' + b"a" * (1 << 20) + b'",'
            yield b'{"queries": ['
            for _ in range(200):
                yield chunk
            yield b'"a"]}'

        for name, size in [
            ("200 MB body (Content-Length)", 200 << 20),
            ("52 M tiny queries", 4 * 52_000_001 + 13),
        ]:
            with _PeakRSS(proc.pid) as peak, socket.create_connection(("127.0.0.1", port)) as sock:
                t0 = time.monotonic()
                head = "POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                sock.sendall(
                    (head + f"Content-Length: {size}\r\n\r\n").encode() + b'{"queries": [' + b'"a",' * 1000
                )
                status = sock.recv(200).split(b"\r\n", 1)[0].decode()
                took = time.monotonic() - t0
            print(
                f"{name} (headers + 4 kB sent): {status!r} after {took:.3f} s, server peak RSS {peak.peak:.0f} MB"
            )
        for name, kw in [("200 MB body (streamed, no Content-Length)", {"content": big_body()})]:
            with _PeakRSS(proc.pid) as peak:
                t0 = time.monotonic()
                try:
                    r = httpx.post(url, headers={"content-type": "application/json"}, timeout=120, **kw)
                    status = r.status_code
                except httpx.HTTPError as err:  # the server may close before the client finished sending
                    status = f"{type(err).__name__}"
                took = time.monotonic() - t0
            print(f"{name}: {status} in {took:.2f} s, server peak RSS {peak.peak:.0f} MB")
            kw.clear()

        for body in (
            b'{"query": "x", "topk": "3"}',
            b'{"query": "x", "topk": true}',
            b'{"query": ""}',
            b'{"query": "a\\ud800b"}',
        ):
            r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
            print(f"{body.decode()}: {r.status_code} {r.json()['detail'] if r.status_code != 200 else ''}")

        long = {"queries": [("what is the capital city of the country " * 25)[:1000]] * 64}
        took: dict[str, float] = {}

        def run(name: str, body: dict) -> None:
            t0 = time.monotonic()
            r = httpx.post(url, json=body, timeout=600)
            took[name] = time.monotonic() - t0
            assert r.status_code == 200, r.text[:200]

        t0 = time.monotonic()
        run("alone", {"query": "Nile"})
        print(f"a one-word query alone: {took['alone']:.2f} s")
        th = threading.Thread(target=run, args=("long", long))
        th.start()
        time.sleep(1.0)
        run("short", {"query": "Nile"})
        th.join()
        print(
            f"64 x 1000-char request: {took['long']:.1f} s; a one-word query sent 1 s after it: "
            f"{took['short']:.2f} s"
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


class _Peer:
    """A 127.0.0.1 server: ``trickle`` (1 byte/s of a 30-byte body), ``endless`` (1 byte/s forever),
    ``hang``, ``garbage``, ``close``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            time.sleep(0.05)
            try:
                conn.setblocking(False)
                conn.recv(1 << 20)
            except OSError:
                pass
            conn.setblocking(True)
            if self.mode in ("trickle", "endless"):
                n = 30 if self.mode == "trickle" else 10**9
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % n
                )
                for _ in range(min(n, 600)):
                    if self.stop.is_set():
                        break
                    conn.sendall(b" ")
                    time.sleep(1.0)
            elif self.mode == "hang":
                while not self.stop.is_set():
                    time.sleep(0.1)
            elif self.mode == "garbage":
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{garbage}"
                )
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _time(fn) -> tuple[float, str]:
    t0 = time.monotonic()
    try:
        fn()
        out = "returned"
    except Exception as err:  # noqa: BLE001 - printed
        out = f"{type(err).__name__}: {str(err)[:230]}"
    return time.monotonic() - t0, out


def probe_http(openai_default: bool) -> None:
    from mas_train.backends.base import SamplingParams
    from mas_train.backends.openai import OpenAIBackend, OpenAIOptions
    from mas_train.backends.sglang.http import SGLangHTTPBackend
    from mas_train.backends.vllm.http import VLLMHTTPBackend
    from retrieval_index.client import RemoteRetriever

    sp = SamplingParams(max_new_tokens=1)
    cases = [
        (
            "trickle",
            "vllm timeout=5",
            lambda u: VLLMHTTPBackend(u, timeout=5, served_model="m").generate([[1]], sp),
        ),
        ("endless", "sglang timeout=3", lambda u: SGLangHTTPBackend(u, timeout=3).generate([[1]], sp)),
        (
            "endless",
            "retriever timeout=3",
            lambda u: RemoteRetriever(u, timeout=3, max_retries=0).search(["q"]),
        ),
        ("garbage", "vllm", lambda u: VLLMHTTPBackend(u, timeout=5, served_model="m").generate([[1]], sp)),
        ("garbage", "sglang", lambda u: SGLangHTTPBackend(u, timeout=5).generate([[1]], sp)),
        ("close", "vllm", lambda u: VLLMHTTPBackend(u, timeout=5, served_model="m").generate([[1]], sp)),
        ("close", "sglang", lambda u: SGLangHTTPBackend(u, timeout=5).generate([[1]], sp)),
        ("hang", "retriever defaults", lambda u: RemoteRetriever(u).search(["q"])),
    ]
    if openai_default:
        cases.append(
            (
                "hang",
                "openai defaults",
                lambda u: OpenAIBackend(OpenAIOptions(base_url=u + "/v1", model="m"), None).generate_messages(
                    [[{"role": "user", "content": "hi"}]], sp
                ),
            )
        )
    VLLMHTTPBackend("http://127.0.0.1:1", served_model="m").close()  # imports outside the timings
    SGLangHTTPBackend("http://127.0.0.1:1").close()
    for mode, who, fn in cases:
        peer = _Peer(mode)
        try:
            took, out = _time(lambda fn=fn, peer=peer: fn(peer.url))
        finally:
            peer.close()
        print(f"{mode:8s} {who:22s} {took:6.2f} s  {out}")


def probe_grader() -> None:
    from mas_envs.rewards import _worker
    from mas_envs.rewards.math_grade import grade_math

    hang = r"\boxed{9^{9^{9^{9}}}}"
    warm = [threading.Thread(target=grade_math, args=(r"\boxed{1}", "2")) for _ in range(_worker.MAX_WORKERS)]
    for t in warm:
        t.start()
    for t in warm:
        t.join()
    took: dict[str, tuple[float, bool]] = {}

    def grade(name: str, r: str, g: str) -> None:
        t0 = time.monotonic()
        v = grade_math(r, g)
        took[name] = (time.monotonic() - t0, v)

    threads = [threading.Thread(target=grade, args=(f"hang{i}", hang, "5")) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    grade("benign", r"\boxed{\frac12}", "0.5")
    for t in threads:
        t.join()
    worst = max(v[0] for k, v in took.items() if k.startswith("hang"))
    print(f"MAX_WORKERS {_worker.MAX_WORKERS}; 8 threads grading hanging answers: worst call {worst:.2f} s")
    print(f"\\frac12 sent behind them: {took['benign'][0]:.2f} s, graded {took['benign'][1]}")
    t0 = time.monotonic()
    again = grade_math(r"\boxed{\frac12}", "0.5")
    print(f"\\frac12 right after: {again} in {time.monotonic() - t0:.2f} s")

    script = textwrap.dedent(
        f"""
        from mas_envs.rewards import _worker
        w = _worker._borrow(); w.wait_ready(); print(w.proc.pid, flush=True)
        w.ask({hang!r}, ["5"], 600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    pid = int(parent.stdout.readline())
    time.sleep(2)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    t0 = time.monotonic()
    while Path(f"/proc/{pid}").exists() and time.monotonic() - t0 < 30:
        time.sleep(0.01)
    gone = not Path(f"/proc/{pid}").exists()
    print(
        f"parent killed mid-grade: worker {'gone' if gone else 'STILL RUNNING'} after {time.monotonic() - t0:.2f} s"
    )
    for r, g in [("\\boxed{٤٢}", "42"), ("\\boxed{４２}", "42"), (r"\boxed{10^{-3000}}", r"2\cdot 10^{-3000}"),
                 (r"\boxed{\frac{1}{1000!}}", r"\frac{1}{1000!+1}"), (r"\boxed{10^{-3000}}", r"\frac{1}{10^{3000}}")]:  # fmt: skip
        print(f"grade_math({r!r}, {g!r}) = {grade_math(r, g)}")


TRAIN = [
    "--env", "math-2agent", "--model", "tiny-qwen3", "--num_generations", "2", "--tasks_per_step", "1",
    "--sampling.max_new_tokens", "4", "--eval_steps", "0", "--report_to", "jsonl", "--save_steps", "1",
]  # fmt: skip


def _mas_train(*args: str, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mas_train.cli", *TRAIN, *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, **kw)


def probe_checkpoint(kills: int, planted: bool = True) -> None:
    import random
    import shutil
    import tempfile

    import torch

    from mas_train.checkpoint import list_checkpoints

    class Planted:
        def __init__(self, path: str) -> None:
            self.path = path

        def __reduce__(self):
            return (os.system, (f"touch {self.path}",))

    work = Path(tempfile.mkdtemp(prefix="probe-ckpt-"))
    r = _mas_train("--max_steps", "2", "--output_dir", str(work), "--run_name", "a")
    assert r.returncode == 0, r.stderr[-2000:]
    run = work / "a"
    print(f"trained: {[p.name for p in list_checkpoints(run)]}")
    for name in ("trainer_state.pt", "groups/shared/optimizer.pt") if planted else ():
        copy = work / f"planted-{name.replace('/', '-')}"
        shutil.copytree(run, copy / "a")
        ckpt = list_checkpoints(copy / "a")[-1]
        sentinel = copy / "PWNED"
        torch.save({"step": 2, "x": Planted(str(sentinel))}, ckpt / name)
        from mas_train.checkpoint import write_manifest  # an attacker keeps the manifest consistent

        write_manifest(ckpt)
        t0 = time.monotonic()
        r = _mas_train("--max_steps", "3", "--resume", str(copy / "a"))
        errors = [x for x in r.stderr.splitlines() if "error:" in x]
        print(
            f"planted {name}: exit {r.returncode} in {time.monotonic() - t0:.1f} s, {len(errors)} error line(s), "
            f"code ran: {sentinel.exists()}; {errors[0][:160] if errors else r.stderr[-300:]}"
        )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for k in range(kills):
        copy = work / f"kill{k}"
        shutil.copytree(run, copy / "a")
        root = copy / "a" / "checkpoints"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mas_train.cli",
                *TRAIN,
                "--max_steps",
                "2",
                "--resume",
                str(root / "step-000001"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        seen = None
        while proc.poll() is None and seen is None:
            seen = next((p.name for p in root.iterdir() if p.name.startswith("step-000002.")), None)
            time.sleep(0.002)
        time.sleep(random.uniform(0, 0.3))
        stage = sorted(p.name for p in root.iterdir())
        proc.kill()
        proc.wait()
        r = _mas_train("--max_steps", "3", "--resume", str(copy / "a"))
        resumed = next((x for x in r.stdout.splitlines() if "resumed from" in x), "")
        left = [p.name for p in root.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
        print(
            f"kill -9 during the re-save of step 2 (folders then: {stage}): resume exit {r.returncode}, "
            f"{resumed.strip()[:120]!r}, leftovers after: {left}"
        )
    shutil.rmtree(work, ignore_errors=True)


def probe_config() -> None:
    os.environ["MAS_PROBE_SECRET"] = "hunter2"
    from mas_train.config import ConfigError, parse_args

    try:
        cfg = parse_args(["--env", "math-2agent", "--run_name", "x-${oc.env:MAS_PROBE_SECRET}"])
        print(f"run_name resolved to {cfg.run_name!r}")
    except ConfigError as err:
        print(f"refused: {err}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("probe", choices=["server", "http", "grader", "config", "checkpoint"])
    p.add_argument("--kills", type=int, default=3, help="checkpoint: re-saves killed with SIGKILL")
    p.add_argument(
        "--openai-default", action="store_true", help="http: also time the OpenAI defaults (~3 min)"
    )
    args = p.parse_args()
    if args.probe == "server":
        probe_server()
    elif args.probe == "http":
        probe_http(args.openai_default)
    elif args.probe == "grader":
        probe_grader()
    elif args.probe == "checkpoint":
        probe_checkpoint(args.kills)
    else:
        probe_config()


if __name__ == "__main__":
    main()

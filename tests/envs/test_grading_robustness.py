"""The grader under load and at its edges: the deadline holds per call with many concurrent callers, the
worker process dies with its parent, digits of any script grade, and exact values far below 1 compare
exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mas_envs.rewards.math_grade import GRADE_TIMEOUT_S, grade_math

ROOT = Path(__file__).resolve().parents[2]
HANG = r"\boxed{9^{9^{9^{9}}}}"  # SymPy would compute a 370-million-digit power


@pytest.mark.parametrize(
    "response, gold",
    [(r"\boxed{٤٢}", "42"), (r"\boxed{４２}", 42), (r"\boxed{42}", "٤٢"), (r"\boxed{\frac{١}{٢}}", "0.5"),
     (r"\boxed{۳.۵}", "3.5"), (r"\boxed{४२}", "42"), (r"\boxed{４２．５}", "42.5")],
)  # fmt: skip
def test_digits_of_any_script_grade(response, gold):
    assert grade_math(response, gold) is True


def test_ascii_digits_keeps_superscripts_and_letters():
    from mas_envs.rewards.math_grade import ascii_digits

    assert ascii_digits("x² + ٣") == "x² + 3"
    assert ascii_digits("４２ｘ") == "42x"
    assert grade_math(r"\boxed{٤٣}", "42") is False


@pytest.mark.parametrize(
    "response, gold, want",
    [
        (r"\boxed{10^{-3000}}", r"2\cdot 10^{-3000}", False),
        (r"\boxed{10^{-3000}}", r"\frac{1}{10^{3000}}", True),
        (r"\boxed{\frac{1}{1000!}}", r"\frac{1}{1000! + 1}", False),
        (r"\boxed{\frac{1}{1000!}}", r"\frac{2}{1000!}", False),
        (r"\boxed{\frac{3}{10^{2500}}}", r"3\cdot 10^{-2500}", True),
        (r"\boxed{10^{-2500} + 10^{-2600}}", r"10^{-2500}", False),
    ],
)
def test_tiny_exact_values_of_any_magnitude_compare_exactly(response, gold, want):
    assert grade_math(response, gold) is want


def test_the_deadline_holds_per_call_under_concurrent_callers():
    from mas_envs.rewards import _worker

    # a full pool of warm workers: a call that finds room and starts one is not charged its start-up
    def fill_pool() -> None:
        # `prestart` adds a worker only when none is idle, so it cannot fill a pool that has one idle worker
        # (a warm-up call that timed out under load leaves exactly that): start the missing ones directly
        with _worker._cond:
            for w in [w for w in _worker._idle if w.dead()]:
                _worker._idle.remove(w)
                _worker._live -= 1
                w.kill()
            while _worker._live < _worker.MAX_WORKERS:
                _worker._idle.append(_worker._start())
        for w in list(_worker._idle):
            w.wait_ready()

    fill_pool()
    warm = [threading.Thread(target=grade_math, args=(r"\boxed{1}", "2")) for _ in range(_worker.MAX_WORKERS)]
    for t in warm:
        t.start()
    for t in warm:
        t.join(60)
    fill_pool()
    took: dict[str, float] = {}

    def grade(name: str, response: str, gold: str) -> None:
        t0 = time.monotonic()
        grade_math(response, gold)
        took[name] = time.monotonic() - t0

    threads = [threading.Thread(target=grade, args=(f"hang{i}", HANG, "5")) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    benign = threading.Thread(target=grade, args=("benign", r"\boxed{\frac12}", "0.5"))
    benign.start()
    for t in [*threads, benign]:
        t.join(60)
    # GRADE_TIMEOUT_S per call, never the 4 s of each call queued ahead (22.7 s and 10.7 s before); the
    # benign call may time out behind them (graded False), as the docs say
    assert max(took.values()) < GRADE_TIMEOUT_S + 1.0, took
    assert grade_math(r"\boxed{\frac12}", "0.5") is True  # the pool recovers


def test_the_worker_dies_with_its_parent(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from mas_envs.rewards import _worker
        w = _worker._borrow()
        assert w.wait_ready()
        print(w.proc.pid, flush=True)
        w.ask({HANG!r}, ["5"], 600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        worker = int(parent.stdout.readline())
        time.sleep(1.0)  # the worker is now deep in SymPy's C arithmetic
        assert _alive(worker)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the grading worker outlived its parent"
    finally:
        parent.kill()
        try:
            os.kill(worker, signal.SIGKILL)
        except (ProcessLookupError, NameError, UnboundLocalError):
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False

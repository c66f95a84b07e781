"""Bounded math-verify comparisons in worker processes (used by `mas_envs.rewards.math_grade.grade_math`).

Why a process: SymPy's big-integer arithmetic (e.g. `9^{9^{9^9}}`) runs in C while holding the GIL, so
neither math-verify's `signal.alarm` timeout (main thread only) nor a worker thread can stop it; killing a
process can. Each worker is this file run as a script (`python -u _worker.py`; its folder, first on the
worker's `sys.path`, holds no module named like a standard one: the math grader is `math_grade.py`), so it
needs no import of `mas_envs` and works however the parent was started. Protocol: one JSON line per request
`{"pred": str, "golds": [str, ...]}` on stdin, one JSON line `{"ok": bool}` on stdout.

The parent keeps a pool of at most `MAX_WORKERS` workers (one per usable CPU, 2 to 8), shared by all threads;
a thread that finds none idle waits for one, since more SymPy processes than cores only slow every call down
(twelve threads that each started a worker took ~15 s a call on two cores). That wait is part of the call's
deadline: with more hanging comparisons in flight than workers, a call still waiting at its deadline counts
as not equivalent rather than queueing behind them. A worker that misses the deadline
is killed and the comparison counts as not equivalent; a request still unanswered after `_SPARE_AFTER_S`
starts a spare worker, so the call after a timeout finds one ready instead of paying a start-up. A worker's
start-up (about 1 s to import SymPy) is not part of the deadline: `prestart()` starts one ahead of time.

A worker dies with the process that started it: on Linux it asks for SIGKILL when its parent goes
(`prctl(PR_SET_PDEATHSIG)`; workers are started from one long-lived thread, since the signal follows the
thread that forked), and on every system a watchdog thread in the worker exits when its parent pid changes
(that thread runs only between SymPy's C calls, so the signal is what stops a worker stuck in one), and an
idle worker exits at the end of its stdin.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import select
import subprocess
import sys
import threading
import time
import warnings
from typing import IO

_START_TIMEOUT_S = 60.0
# A request not answered by then may well time out: start its replacement now, while it still runs.
_SPARE_AFTER_S = 0.5
# A call that waited longer than this for a free worker is charged the start-up of the worker it then starts.
_QUEUED_S = 0.05


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


MAX_WORKERS = max(2, min(8, _usable_cpus()))


# Workers are forked from this one thread, which lives as long as the process: PR_SET_PDEATHSIG fires when
# the *thread* that forked a child exits, and a grading thread (a pool's) may end long before the process.
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mas-grader-spawn")


class _Worker:
    def __init__(self) -> None:
        self.proc = _spawner.submit(self._popen).result()
        # both are set: the process was opened with stdin=PIPE, stdout=PIPE
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[str] = self.proc.stdin
        self.stdout: IO[str] = self.proc.stdout
        self.ready = False

    @staticmethod
    def _popen() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-u", os.path.abspath(__file__), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            errors="replace",
        )

    def _readline(self, timeout: float) -> str | None:
        r, _, _ = select.select([self.stdout], [], [], max(timeout, 0.0))
        if not r:
            return None
        line = self.stdout.readline()
        return line or None

    def wait_ready(self, timeout: float = _START_TIMEOUT_S) -> bool | None:
        """`True` once started, `False` when it failed to start, `None` still starting after `timeout`."""
        if not self.ready:
            line = self._readline(timeout)
            if line is None and timeout < _START_TIMEOUT_S and self.proc.poll() is None:
                return None
            self.ready = line == "ready\n"
        return self.ready

    def ask(self, pred: str, golds: list[str], timeout: float) -> bool | None:
        """`True`/`False`, or `None` when the worker missed the deadline or died (then it is unusable)."""
        try:
            self.stdin.write(json.dumps({"pred": pred, "golds": golds}) + "\n")
            self.stdin.flush()
            line = self._readline(min(timeout, _SPARE_AFTER_S))
            if line is None and timeout > _SPARE_AFTER_S and self.proc.poll() is None:
                try:
                    prestart()  # this one may be killed soon: have the next call's worker warm by then
                except OSError:
                    pass  # best effort; the next call starts one (or falls back) itself
                line = self._readline(timeout - _SPARE_AFTER_S)
            return None if line is None else bool(json.loads(line)["ok"])
        except (OSError, ValueError, KeyError):
            return None

    def dead(self) -> bool:
        return self.proc.poll() is not None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001  (best effort: the process may already be gone)
            pass
        for f in (self.stdin, self.stdout):
            try:
                f.close()
            except OSError:
                pass


_idle: list[_Worker] = []
_live = 0  # workers started and not yet discarded: idle, busy or starting
_cond = threading.Condition()
_inherited: list[_Worker] = []


def _forget_parent_workers() -> None:
    # A forked child (DataLoader, multiprocessing) must not talk to its parent's workers through the shared
    # pipes; it keeps references only so their Popen objects are never collected (and waited on) here.
    global _cond, _live, _spawner
    _inherited.extend(_idle)
    _idle.clear()
    _live = 0
    _cond = threading.Condition()
    _spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mas-grader-spawn")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_workers)


@atexit.register
def _shutdown() -> None:
    with _cond:
        workers, _idle[:] = list(_idle), []
    for w in workers:
        w.kill()


def _start() -> _Worker:
    # caller holds _cond
    global _live
    w = _Worker()
    _live += 1
    return w


def prestart() -> None:
    """Start one worker in the background if none is idle and the pool has room (cheap: fork and exec)."""
    with _cond:
        if not _idle and _live < MAX_WORKERS:
            _idle.append(_start())


def _borrow(deadline: float | None = None) -> _Worker | None:
    """An idle worker, a new one while the pool has room, else wait for one; `None` at `deadline`."""
    with _cond:
        while not _idle and _live >= MAX_WORKERS:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            _cond.wait(left)
        return _idle.pop() if _idle else _start()


def _give_back(w: _Worker) -> None:
    with _cond:
        _idle.append(w)
        _cond.notify()


def _discard(w: _Worker) -> None:
    global _live
    w.kill()
    with _cond:
        _live -= 1
        _cond.notify()


_processes_ok = os.name == "posix"  # the pool reads replies with select() on pipes


def equivalent(pred: str, golds: list[str], timeout: float) -> bool:
    """Whether math-verify finds `pred` equivalent to any of `golds`, decided within `timeout` seconds.

    Returns `False` on a timeout or when the worker dies on the request. An idle worker found dead (killed
    from outside) is replaced first. Waiting for a free worker while `MAX_WORKERS` threads are grading counts
    against `timeout` (the call returns `False` when none is free by then); waiting for a new worker to
    start (about 1 s, several on a loaded box) does not, unless the call had queued for a free slot first.
    So a call returns within `timeout`, plus one worker start-up when it found the pool with room. Where worker processes are unavailable (not POSIX, or one failed
    to start) the comparison runs in a daemon thread with the same deadline, which bounds the caller's wait
    but cannot stop C-level work.
    """
    if not _processes_ok:
        return _in_thread(pred, golds, timeout)
    t_call = time.monotonic()
    deadline = t_call + timeout
    try:
        w = _borrow(deadline)
        for _ in range(MAX_WORKERS + 1):  # skip idle workers that died (OOM killer, a stray kill)
            if w is None or not w.dead():
                break
            _discard(w)
            w = _borrow(deadline)
        if w is None:  # every worker busy until the deadline
            return False
    except OSError as err:  # cannot spawn at all: no usable sys.executable, out of file descriptors, ...
        return _fall_back(pred, golds, timeout, f"could not be started ({err})")
    started = w.ready
    t_ready = time.monotonic()
    # A worker's start-up is not charged to a call that found the pool with room; one that queued for a free
    # slot has used its deadline already and waits for the start-up only as long as that deadline allows.
    charged = not started and t_ready - t_call >= _QUEUED_S
    state = w.wait_ready(max(0.0, deadline - t_ready)) if charged else w.wait_ready()
    if state is None:  # still starting at the deadline: the next call finds it ready
        _give_back(w)
        return False
    if not state:
        _discard(w)
        return _fall_back(pred, golds, timeout, "did not start")
    if not started and not charged:
        deadline += time.monotonic() - t_ready
    left = deadline - time.monotonic()
    if left <= 0:
        _give_back(w)
        return False
    ok = w.ask(pred, golds, left)
    if ok is None:
        _discard(w)
        try:  # start the replacement now, so the next call is less likely to wait for a start-up
            prestart()
        except OSError:
            pass
        return False
    _give_back(w)
    return ok


def _fall_back(pred: str, golds: list[str], timeout: float, why: str) -> bool:
    global _processes_ok
    _processes_ok = False
    warnings.warn(
        f"mas_envs: the math grading worker process {why}; grading falls back to threads, "
        "which cannot stop a runaway SymPy computation",
        RuntimeWarning,
        stacklevel=4,
    )
    return _in_thread(pred, golds, timeout)


def _in_thread(pred: str, golds: list[str], timeout: float) -> bool:
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(_compare(pred, golds)), daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])


# math-verify's defaults: floats are compared rounded to 6 decimal places, other numbers by evaluating their
# difference to 15 digits with `chop=True`, which zeroes anything below about 1e-15 *absolutely*. Both are
# absolute tolerances: 1e-7 and 2e-7, or 10^{-30} and 2*10^{-30}, come out equal. `_precision` keeps these
# defaults at the scale of 1 and moves both by the magnitude of the smallest number in the comparison.
FLOAT_ROUNDING = 6
NUMERIC_PRECISION = 15
# Beyond this many extra digits a tolerance comparison would cost more than the deadline allows: values that
# small are compared exactly (`_exact_verdict`) or not called equal.
_MAX_EXTRA_DIGITS = 2000
_MAX_NODES = 400  # numeric subterms looked at for their magnitude (a 400-character answer has fewer)


def _precision(exprs: list) -> tuple[int, int]:
    """`(float_rounding, numeric_precision)` for math-verify's `verify`, fit to the magnitudes in `exprs`.

    With `m = floor(log10 |v|)` for the smallest non-zero number-valued subterm `v` of any expression (an
    atom such as `1e-7`, or a term such as `10^{-30}`, so `1 - 10^{-30}` counts at `1e-30`), both
    defaults grow by `max(0, -m - 1)` digits: a float then agrees with a value when they agree to 6
    *significant* digits below 0.1 (6 decimal places, as math-verify has it, at and above 0.1), and an
    exact difference is zeroed only below 15 significant digits of that smallest term. Large values need
    nothing: 6 decimal places of 10^{20} and an unchopped difference of 1 are already exact.
    """
    import mpmath
    from sympy import Basic, MatrixBase, preorder_traversal

    smallest = None
    seen = 0
    for expr in exprs:
        if not isinstance(expr, (Basic, MatrixBase)):
            continue
        for node in preorder_traversal(expr):
            seen += 1
            if seen > _MAX_NODES:
                break
            if not isinstance(node, Basic) or not getattr(node, "is_number", False) or node.is_Boolean:
                continue
            try:
                v = abs(node.evalf(5))
                if not v.is_Float or v == 0 or not v.is_finite:
                    continue
                m = int(mpmath.floor(mpmath.log10(mpmath.mpf(v._mpf_))))
            except Exception:  # noqa: BLE001  (a term that will not evaluate says nothing of magnitude)
                continue
            smallest = m if smallest is None else min(smallest, m)
    extra = 0 if smallest is None else max(0, -smallest - 1)
    if extra > _MAX_EXTRA_DIGITS:
        raise _BeyondPrecision
    return FLOAT_ROUNDING + extra, NUMERIC_PRECISION + extra


class _BeyondPrecision(Exception):
    """A value too small for a tolerance at a precision the deadline affords (below ~10^-2000)."""


def _exact_verdict(gold: list, target: list) -> bool:
    r"""Equality of values below :func:`_precision`'s reach: exact only, never through a tolerance.

    True when some gold and some target parse to the same exact rational (SymPy ``Rational`` equality:
    ``10^{-3000} == \frac{1}{10^{3000}}``, ``\frac{1}{2000!}`` against itself); anything else, including
    two different exact values and inexact forms, is refused (not equivalent).
    """
    from sympy import Basic

    def exact(exprs: list) -> list:
        out = []
        for e in exprs:
            if isinstance(e, Basic) and e.is_number and e.is_rational:  # latex2sympy leaves 10^{-3000} a Pow
                v = e.doit()
                if v.is_Rational:
                    out.append(v)
        return out

    exact_t = exact(target)
    return any(g == t for g in exact(gold) for t in exact_t)


def _exact_scientific(expr):
    r"""`expr` with each `a \times 10^{k}` (a float times a power of ten) made the exact decimal it writes.

    latex2sympy reads `6.02` as a binary float, so `6.02\times10^{23}` is `601999999999999957...` and
    differs from `602000000000000000000000` by about 4e7. A bare float keeps math-verify's rounding rule
    (`0.333333` is `1/3`); only the mantissa of scientific notation is made exact.
    """
    from sympy import Float, Integer, Mul, Pow, Rational

    def is_scientific(m) -> bool:
        return (
            isinstance(m, Mul)
            and any(isinstance(a, Float) for a in m.args)
            and any(isinstance(a, Pow) and a.base == Integer(10) and a.exp.is_Integer for a in m.args)
        )

    try:
        return expr.replace(
            is_scientific,
            lambda m: Mul(*(Rational(str(a)) if isinstance(a, Float) else a for a in m.args)),
        )
    except Exception:  # noqa: BLE001  (not an expression that has terms: leave it as parsed)
        return expr


def _compare(pred: str, golds: list[str]) -> bool:
    """math-verify equivalence of `pred` with any gold, all parsed as LaTeX math; no timeout of its own.

    The float rounding and evaluation precision passed to `verify` follow the magnitudes involved
    (`_precision`), so tiny and huge exact values are not called equal by an absolute tolerance.
    """
    import logging

    from math_verify import parse, verify

    # math-verify warns once that its own (signal-based) timeout is off: the caller's deadline replaces it.
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    def as_latex(s: str) -> list:
        parsed = parse(f"${s}$", parsing_timeout=None) or parse(s, parsing_timeout=None)
        return [_exact_scientific(e) for e in parsed]

    try:
        target = as_latex(pred)
        if not target:
            return False
        for g in golds:
            gold = as_latex(g)
            if not gold:
                continue
            try:
                rounding, precision = _precision([*gold, *target])
            except _BeyondPrecision:
                if _exact_verdict(gold, target):
                    return True
                continue
            if verify(
                gold,
                target,
                float_rounding=rounding,
                numeric_precision=precision,
                timeout_seconds=None,
            ):
                return True
    except Exception:  # noqa: BLE001  (any parse/compare failure means "not shown equivalent")
        return False
    return False


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the parent goes (Linux), and a watchdog that exits when the parent pid changes."""
    import signal
    import time as _time

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still covers an idle or Python-level worker
    if os.getppid() != parent:  # the parent died before the request above took effect
        os._exit(0)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            _time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def _serve() -> None:
    if len(sys.argv) > 1:
        _die_with_parent(int(sys.argv[1]))
    import math_verify  # noqa: F401  (import before "ready", so start-up is not charged to a request)

    print("ready", flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ok = _compare(req["pred"], req["golds"])
        except Exception:  # noqa: BLE001  (a malformed request is answered, never fatal)
            ok = False
        print(json.dumps({"ok": ok}), flush=True)


if __name__ == "__main__":
    _serve()

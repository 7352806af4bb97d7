"""The init ledger: what the trainer's main thread was doing in the init phase "other".

JAX times its traces, lowerings and compiles, jaxwarm its own waits; the rest of a start
(model and optimizer construction, a checkpoint restore, a data pipeline, imports after
jax's) is the trainer's own Python, which nothing times. A sampling thread reads the main
thread's stack (at once, every `INTERVAL_S` then, later further apart: `spacing`) and names
who it is in (`owner`): the innermost frame's
package that is not the plumbing every stack goes through (the standard library, jax,
jaxlib, numpy), e.g. `orbax.checkpoint`, `flax.linen`, or the trainer's own module;
`import X` while a module is being imported. Each sample stands for the time to the next
one. The init phases (`jaxwarm.job.record.phases`) give those spans the
lowest precedence, so they split only what no timer covers: "other" comes out by owner,
and what remains unnamed is what no sample saw (shorter than an interval).

How it reads the stack: the sampling thread only keeps time; the main thread walks its
own stack (`frames_of`), between two of its bytecodes, as a pending call
(`Py_AddPendingCall`, the way CPython runs a Python signal handler, without a signal). No
thread walks another's frames: `sys._current_frames()` and `f_back` from the sampling
thread, as this did first, and faulthandler's walk in C, tried next, both crashed ranks on
CPython 3.11.7 with SIGSEGV (in `PyFrame_GetBack`, `_PyFrame_MakeAndSetFrameObject`,
`dump_traceback`: the main thread's frames changing under the walk; about one rank per
64-rank launch, docs/scale.md). A main thread inside a long native call takes no sample
until it is back in Python: that time goes to the sample before, most often taken in the
frame that made the call.

Cost: one stack walk per sample on the main thread (with the garbage collector paused for
it), a wake-up on the sampling thread; the report states the CPU time of both
(`Sampling.cost_s`).
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from jaxwarm.core.records import Sampling

# 50 samples a second at first: a phase of 0.1 s is seen, and a stack walk of some 20 us
# costs the process about 0.1% of a core.
INTERVAL_S = 0.02
# Then one sample per SPACING of the time sampled so far, at most MAX_INTERVAL_S apart: a
# span is named to within about 0.5% of the start's length, and a long start takes some
# hundreds of samples, not 50 a second. The cost that matters is not the walks but the
# wake-ups: at 32 ranks on 2 cores, where a start took 45 s, 50 a second per rank were
# 72,000 wake-ups, each a context switch and a pass of the GIL, and made every rank slower.
SPACING = 0.005
MAX_INTERVAL_S = 0.5
# At most this many spans are kept (a run of samples with one owner is one span): a few MB.
MAX_SPANS = 100_000
# Packages every stack passes through: a sample is the innermost frame outside them.
PLUMBING = frozenset({"jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum",
                      "typing_extensions", *sys.stdlib_module_names})
# jaxwarm's own code is named "jaxwarm", but the reference trainer is a trainer: its package
# is named as any trainer's is.
WORKLOAD = "jaxwarm.workload"


def spacing(base_s: float, elapsed_s: float) -> float:
    """The wait before the next look of a thread that looks every `base_s` at first and has
    looked for `elapsed_s`: later looks SPACING of the time so far apart, at most
    MAX_INTERVAL_S (the ledger's samples, a first-step watcher's polls): what it sees is
    as exact, relative to how long it has looked, and a long look costs some hundreds of
    wake-ups, not a fixed number a second."""
    return max(base_s, min(MAX_INTERVAL_S, SPACING * elapsed_s))


def package_of(module: str, filename: str) -> str:
    """A frame's module as the ledger names it: the first two parts of a dotted module name
    (`orbax.checkpoint`, `flax.linen`; one where the second is private), `jaxwarm` for
    jaxwarm's own, a script run as __main__ by its file name."""
    if module == "__main__":
        return Path(filename).name
    parts = module.split(".")
    if parts[0] == "jaxwarm" and top_of(module) != WORKLOAD:
        return "jaxwarm"
    if len(parts) > 1 and not parts[1].startswith("_"):
        return ".".join(parts[:2])
    return parts[0]


def top_of(module: str) -> str:
    """A module's package as an import names it: its first part, jaxwarm's two (jaxwarm's own
    code is one thing, the reference trainer in `jaxwarm.workload` another)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "jaxwarm" else parts[0]


# One frame of a stack: its module's name, its file and its function.
Frame = tuple[str, str, str]


def frames_of(frame: FrameType | None) -> list[Frame]:
    """The stack ending in `frame`, innermost first; `frame` of the calling thread (see the
    module docstring)."""
    stack = []
    while frame is not None:
        stack.append((str(frame.f_globals.get("__name__", "")), frame.f_code.co_filename,
                      frame.f_code.co_name))
        frame = frame.f_back
    return stack


def owner(stack: list[Frame]) -> str | None:
    """Who `stack` (innermost first) works for (see the module docstring)."""
    importing: str | None = None
    found: str | None = None
    for index, (module, filename, function) in enumerate(stack):
        top = top_of(module)
        if found is None and top and top not in PLUMBING:
            found = package_of(module, filename)
        caller = stack[index + 1] if index + 1 < len(stack) else None
        if function == "<module>" and caller is not None \
                and caller[1].startswith("<frozen importlib"):
            importing = top  # the outermost import wins: `import flax` runs flax.linen's
    if importing is not None:
        return f"import {importing}"
    return found or (top_of(stack[0][0]) if stack else None)


# Py_AddPendingCall: a C function the main thread calls between two of its bytecodes, with
# the GIL, as it runs a Python signal handler. ctypes.pythonapi holds the GIL for the call.
_PENDING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_add_pending_call = ctypes.pythonapi.Py_AddPendingCall
_add_pending_call.argtypes = [_PENDING, ctypes.c_void_p]
_add_pending_call.restype = ctypes.c_int


class Ledger:
    """Samples the main thread until `stop`; `spans()` are (start, end, owner) runs.

    Only the main thread writes the samples, in `_on_main`, which can run between any two
    of its bytecodes, this class's own included: so no lock (the main thread would wait for
    itself), and a reader (any thread) copies what is there."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self._runs: list[tuple[float, float, str]] = []
        self._current: tuple[float, str] | None = None
        self._stopped = threading.Event()
        self._samples = 0
        self._main_cpu_s = 0.0  # the samples' CPU time on the main thread
        self._cpu_s = 0.0  # the timer thread's own CPU time so far
        self._queued = False  # a sample waits for the main thread
        self._callback = _PENDING(self._on_main)  # kept alive while a call may be queued
        self._thread = threading.Thread(target=self._run, name="jaxwarm-ledger", daemon=True)

    def start(self) -> Ledger:
        self._thread.start()
        return self

    def _run(self) -> None:
        """At once, then every interval, ask the main thread for one sample (one at a time:
        a main thread inside a long native call takes it when it is back in Python)."""
        start = time.monotonic()
        while threading.main_thread().is_alive():
            self._cpu_s = time.thread_time()
            if not self._queued:
                self._queued = True
                if _add_pending_call(self._callback, None) != 0:  # the queue is full: later
                    self._queued = False
            if self._stopped.wait(spacing(self.interval_s, time.monotonic() - start)):
                return

    def _on_main(self, _: int | None) -> int:
        """One sample, run by the main thread between two of its bytecodes: the stack it was
        in, below this call, walked by its own thread. Never raises into the trainer."""
        collecting = gc.isenabled()
        try:
            if not self._stopped.is_set():
                # The walk's few allocations must not set off the collection the trainer's
                # next ones would (40 ms of a jax process's heap, seen counted as a sample's).
                gc.disable()
                start = time.thread_time()
                self._sample(owner(frames_of(sys._getframe(1))))
                self._main_cpu_s += time.thread_time() - start
        except Exception:  # noqa: BLE001, S110 (a lost sample, never the trainer's error)
            pass
        finally:
            if collecting:
                gc.enable()
            self._queued = False
        return 0

    def _sample(self, name: str | None) -> None:
        now = time.time()
        self._samples += 1
        if self._current is not None and self._current[1] != name:
            self._close(now)
        if self._current is None and name is not None:
            self._current = (now, name)

    def _close(self, now: float) -> None:
        current = self._current
        assert current is not None
        if len(self._runs) < MAX_SPANS:
            self._runs.append((current[0], now, current[1]))
        self._current = None

    def spans(self) -> list[tuple[float, float, str]]:
        """The runs so far, the one in progress up to now."""
        current = self._current
        return [*self._runs, *([(current[0], time.time(), current[1])] if current else [])]

    def stop(self) -> None:
        self._stopped.set()

    def sampling(self) -> Sampling:
        return Sampling(interval_s=self.interval_s, samples=self._samples,
                        cost_s=round(self._cpu_s + self._main_cpu_s, 6))

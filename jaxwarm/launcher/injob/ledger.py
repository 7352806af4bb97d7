"""The init ledger: what the trainer's main thread was doing in the init phase "other".

JAX times its traces, lowerings and compiles, jaxwarm its own waits; the rest of a start
(model and optimizer construction, a checkpoint restore, a data pipeline, imports after
jax's) is the trainer's own Python, which nothing times. A sampling thread reads the main
thread's stack (`sys._current_frames()`) every `INTERVAL_S` and names who it is in
(`owner`): the innermost frame's package that is not the plumbing every stack goes through
(the standard library, jax, jaxlib, numpy), e.g. `orbax.checkpoint`, `flax.linen`, or the
trainer's own module; `import X` while a module is being imported. Each sample stands for
the time to the next one. The init phases (`jaxwarm.launcher.injob.phases`) give those spans the
lowest precedence, so they split only what no timer covers: "other" comes out by owner,
and what remains unnamed is what no sample saw (shorter than an interval).

Cost: one stack walk per sample on a thread of its own; the report states the sampler's
own CPU time (`Sampling.cost_s`).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import FrameType

from jaxwarm.launcher.records import Sampling

# 50 samples a second: a phase of 0.1 s is seen, and a stack walk of some 20 us costs the
# process about 0.1% of a core.
INTERVAL_S = 0.02
# At most this many spans are kept (a run of samples with one owner is one span): a few MB.
MAX_SPANS = 100_000
# Packages every stack passes through: a sample is the innermost frame outside them.
PLUMBING = frozenset({"jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum",
                      "typing_extensions", *sys.stdlib_module_names})
# jaxwarm's own code (the reference trainer, jaxwarm.prewarm.workload, aside) is named as such.
JAXWARM = "jaxwarm.launcher"


def package_of(module: str, filename: str) -> str:
    """A frame's module as the ledger names it: the first two parts of a dotted module name
    (`orbax.checkpoint`, `flax.linen`; one where the second is private), `jaxwarm` for
    jaxwarm's own, a script run as __main__ by its file name."""
    if module == "__main__":
        return Path(filename).name
    parts = module.split(".")
    if top_of(module) == JAXWARM:
        return "jaxwarm"
    if len(parts) > 1 and not parts[1].startswith("_"):
        return ".".join(parts[:2])
    return parts[0]


def top_of(module: str) -> str:
    """A module's package as an import names it: its first part, jaxwarm's two (the launcher
    is jaxwarm's own code, the prewarm package holds the reference trainer)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "jaxwarm" else parts[0]


def owner(frame: FrameType | None) -> str | None:
    """Who the stack ending in `frame` works for (see the module docstring)."""
    importing: str | None = None
    found: str | None = None
    innermost: str | None = None
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        top = top_of(module)
        if innermost is None:
            innermost = top
        if found is None and top and top not in PLUMBING:
            found = package_of(module, frame.f_code.co_filename)
        caller = frame.f_back
        if frame.f_code.co_name == "<module>" and caller is not None \
                and caller.f_code.co_filename.startswith("<frozen importlib"):
            importing = top  # the outermost import wins: `import flax` runs flax.linen's
        frame = caller
    if importing is not None:
        return f"import {importing}"
    return found or innermost


class Ledger:
    """Samples the main thread until `stop`; `spans()` are (start, end, owner) runs."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self._target = threading.main_thread().ident or 0
        self._runs: list[tuple[float, float, str]] = []
        self._current: tuple[float, str] | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._samples = 0
        self._cpu_s = 0.0  # the sampler thread's own CPU time so far
        self._thread = threading.Thread(target=self._run, name="jaxwarm-ledger", daemon=True)

    def start(self) -> Ledger:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            frame = sys._current_frames().get(self._target)  # noqa: SLF001 (the sampler)
            name = owner(frame) if frame is not None else None
            del frame
            now = time.time()
            with self._lock:
                self._samples += 1
                if self._current is not None and self._current[1] != name:
                    self._close(now)
                if self._current is None and name is not None:
                    self._current = (now, name)
                self._cpu_s = time.thread_time()
            if name is None and not threading.main_thread().is_alive():
                return

    def _close(self, now: float) -> None:
        assert self._current is not None
        if len(self._runs) < MAX_SPANS:
            self._runs.append((self._current[0], now, self._current[1]))
        self._current = None

    def spans(self) -> list[tuple[float, float, str]]:
        """The runs so far, the one in progress up to now."""
        with self._lock:
            current = [(self._current[0], time.time(), self._current[1])] \
                if self._current is not None else []
            return [*self._runs, *current]

    def stop(self) -> None:
        self._stopped.set()

    def sampling(self) -> Sampling:
        with self._lock:
            return Sampling(interval_s=self.interval_s, samples=self._samples,
                            cost_s=round(self._cpu_s, 6))

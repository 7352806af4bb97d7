"""Where a process's init time went, from process start to its first step: the init phases.

Measured, not guessed: JAX times each trace, lowering and backend compile (or cache load)
itself and hands the time span to `jax.monitoring`'s time-span listeners (the events in
`jaxwarm.jaxkey.logs`, the same on every tested jax); jaxwarm times what JAX does not:
`jax.distributed` initialisation (`timed_join`), the process's start (`/proc`, the
recorder's `start_time`), when the hook was installed, and the first step.

Spans overlap (a small eager compile inside a trace, the distributed join inside the start
before a hook installed late), so every instant between process start and the first step
is given to exactly one phase: the most specific span covering it (`PRECEDENCE`), within a
phase the outermost one (the target whose trace contains a nested one). What no span covers
is `other` (split by owner where the init ledger sampled it). The phases therefore add up
to the time to first step, by construction, and nothing is hidden in a gap.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from jaxwarm.core.records import (
    COMPILE,
    DISTRIBUTED,
    FIRST_STEP,
    IMPORTS,
    LOAD,
    LOWER,
    ORDER,
    OTHER,
    PREDICT,
    RANKS_WAIT,
    TRACE,
    InitPhase,
)
from jaxwarm.job.record.ledger import Ledger

# The most specific first: an instant covered by several spans counts for the first. The
# init ledger's samples of the main thread (`jaxwarm.job.record.ledger`) are `other` spans named
# by their owner: they split only what no timer covers.
PRECEDENCE = (RANKS_WAIT, COMPILE, LOAD, PREDICT, LOWER, TRACE, DISTRIBUTED, FIRST_STEP,
              IMPORTS, OTHER)


@dataclass(frozen=True)
class Span:
    phase: str
    start: float
    end: float
    function: str | None = None


# jax.distributed joins of this process: jaxwarm's `initialize()` runs before a prewarm or
# verify job's recorder exists, so the span is kept here until the recorder reads it.
_joins: list[Span] = []
# Told after a join succeeded that the backend may start now (the books' `joined`: the
# prefetch); set once, by the in-job start (`jaxwarm.job.start.hook`).
_after_join: Callable[[], None] | None = None


# Where `jax.distributed.initialize` takes initialization_timeout among its positional
# arguments (coordinator_address, num_processes, process_id, local_device_ids,
# cluster_detection_method, initialization_timeout).
TIMEOUT_ARG = 5
# Bounds a trainer's own join as jaxwarm's own is, yielding JAX's initialization_timeout
# (`jaxwarm.job.start.distributed.bounded_join`); set by the in-job start.
_join_bound: Callable[[], AbstractContextManager[int]] | None = None


def bound_joins(bound: Callable[[], AbstractContextManager[int]]) -> None:
    """Each later `jax.distributed.initialize()` of this process runs inside `bound()`."""
    global _join_bound
    _join_bound = bound


def call_after_join(joined: Callable[[], None]) -> None:
    """`joined` runs after each successful `jax.distributed` join of this process."""
    global _after_join
    _after_join = joined


@contextmanager
def timed_join() -> Iterator[None]:
    """Time a `jax.distributed` initialisation (wall clock, as JAX times its own spans)."""
    start = time.time()
    try:
        yield
    finally:
        _joins.append(Span(DISTRIBUTED, start, time.time()))
    if _after_join is not None:
        _after_join()


def wrap_distributed_initialize() -> None:
    """Time a trainer's own `jax.distributed.initialize()` too: JAX emits no event for it.
    Installed with the recorder, right after jax's import, so a trainer's
    `from jax.distributed import initialize` gets the timed one."""
    import jax.distributed

    original = jax.distributed.initialize
    if getattr(original, "_jaxwarm_timed", False):
        return

    def initialize(*args: Any, **kwargs: Any) -> None:
        with timed_join():
            if _join_bound is None:
                original(*args, **kwargs)
                return
            with _join_bound() as timeout_s:
                if len(args) <= TIMEOUT_ARG:  # JAX's own deadline after jaxwarm's bound
                    kwargs["initialization_timeout"] = max(
                        int(kwargs.get("initialization_timeout") or 0), timeout_s)
                original(*args, **kwargs)

    initialize.__doc__ = original.__doc__
    initialize.__wrapped__ = original  # type: ignore[attr-defined]
    initialize._jaxwarm_timed = True  # type: ignore[attr-defined]
    jax.distributed.initialize = initialize


class PhaseClock:
    """Collects one process's spans until its first step, then splits that time in phases.

    Spans after the first step are not kept (a long run compiles for hours; only init is
    asked about), so memory stays bounded by what init did."""

    def __init__(self, start_time: float):
        self.start_time = start_time
        self.hook_time = time.time()
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        # The init ledger sampling the main thread, where one runs (training jobs).
        self.ledger: Ledger | None = None
        self.done = False
        # Where the step's first execution began, once finished: its compile or load ended,
        # and the ranks' meeting after it (waiting for ranks still compiling) too.
        self.first_step_start: float | None = None

    def add(self, span: Span) -> None:
        with self._lock:
            if not self.done:
                self._spans.append(span)

    def spans(self) -> list[Span]:
        sampled = [Span(OTHER, start, end, owner) for start, end, owner in
                   (self.ledger.spans() if self.ledger is not None else [])]
        with self._lock:
            return [Span(IMPORTS, self.start_time, self.hook_time), *_joins, *self._spans,
                    *sampled]

    def step_end(self, before: float, functions: set[str]) -> float | None:
        """When the compile or load of the step ended: the last backend span of one of
        `functions` (all functions when empty) that ended before `before`."""
        ends = [s.end for s in self.spans() if s.phase in (COMPILE, LOAD)
                and s.end <= before and (not functions or s.function in functions)]
        return max(ends, default=None)

    def finish(self, end: float, step_functions: set[str] | None,
               final: bool = True) -> list[InitPhase]:
        """The phases from process start to `end` (the first step's end). With
        `step_functions` (a training job), the time from the end of the step's compile or
        load to `end` is the first step (a wait at the ranks' meeting inside it counts as
        that wait), and `first_step_start` is where its first execution began: after that
        compile or load and after the meeting. Spans stop being collected, unless not
        `final` (a guessed first step, which a later one may replace: `stop` ends them then)."""
        spans = self.spans()
        if step_functions is not None:
            # A step the manifest names but this process never compiled: its last compile.
            step_end = self.step_end(end, step_functions) or self.step_end(end, set())
            if step_end is not None:
                spans.append(Span(FIRST_STEP, step_end, end))
                step_end = max([step_end, *(s.end for s in spans if s.phase == RANKS_WAIT
                                            and step_end < s.end <= end)])
            self.first_step_start = step_end
        if final:
            self.stop()
        return partition(spans, self.start_time, end)

    def stop(self) -> None:
        """Collect no more spans: init is over."""
        with self._lock:
            self.done = True
        if self.ledger is not None:
            self.ledger.stop()


def partition(spans: list[Span], start: float, end: float) -> list[InitPhase]:
    """Split [start, end] among the spans: each instant goes to the covering span of the
    highest precedence (then the earliest start: the outermost), none to `other`. Phases
    come out in `ORDER`, functions by time spent; their seconds add up to end - start."""
    rank = {phase: index for index, phase in enumerate(PRECEDENCE)}
    clipped = [s for s in spans if s.end > start and s.start < end and s.end > s.start]
    events = sorted({start, end, *(max(s.start, start) for s in clipped),
                     *(min(s.end, end) for s in clipped)})
    by_start = sorted(range(len(clipped)), key=lambda i: clipped[i].start)
    active: list[tuple[int, float, int]] = []  # (rank, start, index): a heap
    totals: dict[tuple[str, str | None], float] = {}
    next_span = 0
    for left, right in zip(events, events[1:], strict=False):
        while next_span < len(by_start) and clipped[by_start[next_span]].start <= left:
            index = by_start[next_span]
            heapq.heappush(active, (rank[clipped[index].phase], clipped[index].start, index))
            next_span += 1
        while active and clipped[active[0][2]].end <= left:
            heapq.heappop(active)  # ended; ended ones deeper down sink out when they surface
        owner = clipped[active[0][2]] if active else None
        key = (OTHER, None) if owner is None else (owner.phase, owner.function)
        totals[key] = totals.get(key, 0.0) + (right - left)
    order = {phase: index for index, phase in enumerate(ORDER)}
    return [InitPhase(phase, round(seconds, 6), function)
            for (phase, function), seconds in sorted(
                totals.items(), key=lambda item: (order[item[0][0]], -item[1]))]


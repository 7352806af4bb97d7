"""`cache.prefetch`: a training job loads its run's prewarmed executables on background
threads while the trainer goes on with its own init, and JAX's lookup gets them.

A warm start still pays for loading each executable (XLA rebuilds the program as it
deserializes; on an H100 a 128-layer step took 28 s to load, a quarter of its compile).
The executables a run needs are known before the trainer asks: its prewarm recorded them
(the manifest's newest entry per function of the run, on this process layout, with what
loading it takes: `jaxwarm.jaxkey.entryload`). So, as soon as the process has
its backend (right after `jax.distributed.initialize()`, or at its first lowering without
one), one thread reads and decompresses them in load order (the step first, then the
largest), and each is deserialized on a thread of its own, up to `WORKERS` side by side.
The trainer's lookup of that very key (JAX's key from the trainer's own lowering), with the
same compile options and devices, gets it, waiting while it still loads; anything else
takes JAX's normal path, and a prefetched key asked for under other options is reported.
Once init is over (the first step), what was never asked for is released and named in the
report.

At most `cache.prefetch_max_size` serialized bytes are held at once: the executables are
admitted in load order while the bytes of those admitted so far (each one's file, then its
serialized executable) stay within it, and a release does not admit another, so what is
loaded depends on the sizes alone, never on how the loads and the trainer's lookups
interleave (one that is not admitted is not loaded, and the report says so).

On CPU only process 0's keys are the prewarm's (every other process hashes its own
devices), so only process 0 prefetches there.

The loads never take a core the trainer wants (docs/cache.md, "Below the trainer"):
- an executable's load starts only once a core this process may run on has been idle
  (`cpu_ticks`, from /proc/stat, after 1 s, then at doubling intervals up to 8 s while no
  core is idle); until then the reader waits, and a lookup that comes first takes JAX's
  own path, as without prefetch (the report says so).
  On a node whose cores other jobs keep busy, nothing is loaded ahead: measured on 2 cores
  with another job beside it, loads at idle priority but started anyway slowed the trainer's
  own init from 60 s to 118 s, since XLA:CPU deserializes on its own threads, at the
  trainer's priority;
- the thread that calls XLA's deserialization lowers itself to Linux's SCHED_IDLE (per
  thread; else nice 19) right before the call, which releases the GIL, and not before: a
  thread at idle priority that holds the GIL when a busy node preempts it stops the
  trainer's Python until the node has a core to spare for it. Reading and decompressing
  (short, GIL-bound) run at the trainer's priority. Once the trainer waits for a load,
  that load is all it waits for: it goes back to the normal policy where the process may
  (`unyield`), else it finishes at idle priority.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from jaxwarm.core.records import NOT_LOADED, OVER_CAP, UNUSED, USED, Prefetched, PrefetchReport
from jaxwarm.jaxkey.entryformat import TIME_BYTES, PayloadTooBig, read_payload
from jaxwarm.jaxkey.entryload import (
    Asked,
    Loaded,
    LoadSpec,
    deserialize,
    serve_lookups,
)
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.manifest import ManifestEntry

log = logging.getLogger(__name__)

# Loads side by side: a run's train step, init and eval functions.
WORKERS = 4
# A load starts once this much of a core has been idle over a sample (a load keeps about
# one core busy). The first sample lasts SAMPLE_S; each that finds no core idle doubles the
# next, up to SAMPLE_MAX_S: every sample wakes the reader, which then takes the GIL from the
# trainer's thread, on a busy node after waiting for a core (measured loaded, one sample a
# second: an 87 s start 1% slower with prefetch, which loaded nothing, than without). A
# load begins at most SAMPLE_MAX_S after a core goes idle.
IDLE_CORE = 0.8
SAMPLE_S = 1.0
SAMPLE_MAX_S = 8.0
# The outcome of an executable whose lookup came before any core was idle for its load.
NO_IDLE_CORE = f"{NOT_LOADED}: no core was idle before its lookup, JAX loaded it"
# At exit, how long loads still running may take to end.
JOIN_S = 120.0
# What the prefetch threads were lowered to, once said in the job log.
_yielded: list[str] = []


def yield_cpu() -> None:
    """Lower the calling thread below the trainer: SCHED_IDLE, else nice 19 (both are per
    thread on Linux); where neither is allowed it keeps its priority. Said once at debug."""
    how = "its normal priority (neither SCHED_IDLE nor nice 19 allowed)"
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        how = "SCHED_IDLE"
    except (AttributeError, OSError):  # not Linux, or a seccomp/policy refusal
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            how = "nice 19"
        except (AttributeError, OSError):
            pass
    if not _yielded:
        _yielded.append(how)
        log.debug("jaxwarm: prefetch threads run at %s", how)


def cpu_ticks() -> dict[bytes, tuple[int, int]] | None:
    """(idle + iowait, all) ticks of each core this process may run on (its affinity), from
    /proc/stat's per-core lines, read in one call and nothing past them (its `intr` line
    can hold thousands of numbers); None where they cannot be read."""
    try:
        allowed = {b"cpu%d" % core for core in os.sched_getaffinity(0)}
        with open("/proc/stat", "rb") as stat_file:
            head = stat_file.read(1 << 16)
    except (AttributeError, OSError):
        return None
    ticks = {}
    for line in head.split(b"\n"):
        name, _, rest = line.partition(b" ")
        if name in allowed:
            try:
                fields = [int(x) for x in rest.split()[:8]]
                ticks[name] = (fields[3] + fields[4], sum(fields))
            except (ValueError, IndexError):  # not the format Linux has had since 2.6.33
                return None
    return ticks or None


def sample_intervals() -> Iterator[float]:
    """The lengths of the idle-core samples before a load: SAMPLE_S, doubling after each
    that found no core idle, up to SAMPLE_MAX_S (a sample that finds one ends the wait)."""
    interval = SAMPLE_S
    while True:
        yield interval
        interval = min(2 * interval, SAMPLE_MAX_S)


def idle_cores(before: dict[bytes, tuple[int, int]],
               after: dict[bytes, tuple[int, int]]) -> float:
    """How many cores were idle, on average, between two `cpu_ticks` samples."""
    idle = 0.0
    for name, (idle_after, total_after) in after.items():
        idle_before, total_before = before.get(name, (idle_after, total_after))
        if total_after > total_before:
            idle += (idle_after - idle_before) / (total_after - total_before)
    return idle


def unyield(native_ids: list[int]) -> None:
    """Give the threads `native_ids` the normal policy back (the trainer now waits for
    them). Leaving SCHED_IDLE or lowering a nice value needs CAP_SYS_NICE or RLIMIT_NICE;
    refused, they finish where they are."""
    for tid in native_ids:
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)
        except (AttributeError, OSError):  # ended meanwhile, or not permitted
            pass


@dataclass
class _Item:
    spec: LoadSpec
    record: Prefetched
    done: threading.Event = field(default_factory=threading.Event)
    loaded: Loaded | None = None
    # The bytes admitted for it (and held until it is taken or released).
    held: int = 0
    asked: bool = False
    # Nobody will take it (init ended, or its lookup took JAX's path): the load drops it.
    dropped: bool = False
    # Its load has begun (a core was idle before its lookup).
    started: bool = False


def mismatch(prefetched: LoadSpec, asked: Asked, cache_dir: str) -> str | None:
    """Why the trainer's lookup must not get the executable prefetched under its key; None
    when it may (it is what JAX itself would have deserialized)."""
    if asked.host_callbacks:
        return "the trainer's call has host callbacks"
    if asked.cache_dir != cache_dir:
        return f"JAX reads another cache dir ({asked.cache_dir}), not {cache_dir}"
    if asked.spec.device_ids != prefetched.device_ids:
        return (f"the trainer's call runs on devices {list(asked.spec.device_ids)}, the "
                f"prewarm's on {list(prefetched.device_ids)}")
    if asked.spec.compile_options != prefetched.compile_options:
        return "the trainer's compile options differ from those the prewarm recorded"
    return None


class Prefetch:
    """The loads of one process, and what became of each (`report`)."""

    def __init__(self, entries: list[ManifestEntry], store: CacheStore, max_size: int,
                 started_s: float, capped: bool = False, wait_for_core: bool = True):
        self.store = store
        # `cache.prefetch: auto`: each load waits for an idle core (true: it does not).
        self.wait_for_core = wait_for_core
        # A size-capped cache (cache.max_size): a used entry's atime is renewed as JAX would.
        self.capped = capped
        self.report = PrefetchReport(started_s=round(started_s, 6), max_size=max_size)
        self._lock = threading.Lock()
        self._held = 0
        self._admitted = 0  # every admitted item's bytes, released or not
        self._slots = threading.Semaphore(WORKERS)
        self._items: dict[str, _Item] = {}
        self._threads: list[threading.Thread] = []
        self._native_ids: list[int] = []  # the loading threads', for `unyield`
        self._waited = False  # the trainer has waited for a load: none yields any more
        self._stopping = threading.Event()  # the process exits: no core is waited for
        # The idle-core samples' lengths, doubling over the items while no core is idle.
        self._intervals = sample_intervals()
        # Load order, which admission follows: the step first (the trainer needs it last,
        # but it takes longest), then the largest.
        for entry in sorted(entries, key=lambda e: (not e.is_step, -(e.size or 0))):
            assert entry.compile_options is not None
            record = Prefetched(entry.function, entry.key, outcome="loading")
            self._items[entry.key] = _Item(
                LoadSpec(entry.compile_options, tuple(entry.device_ids)), record)
            self.report.executables.append(record)

    def start(self) -> None:
        reader = threading.Thread(target=self._read_all, daemon=True,
                                  name="jaxwarm-prefetch-read")
        self._threads.append(reader)
        reader.start()

    def join(self) -> None:
        """At exit: let loads still inside XLA end (a thread in native code when the
        interpreter finalizes can abort the process), for at most JOIN_S."""
        self._stopping.set()
        deadline = time.monotonic() + JOIN_S
        # The reader first: once it has ended, every load it started is in the list.
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _admit(self, item: _Item, size: int) -> bool:
        """Admit `size` bytes for `item` (in place of what it had) if everything admitted
        so far stays within the cap; else take back what it had. Called in load order, from
        the reader alone, so the answer depends on the sizes and the order only."""
        with self._lock:
            if self._admitted - item.held + size > self.report.max_size:
                self._admitted -= item.held
                self._held -= item.held
                item.held = 0
                return False
            self._admitted += size - item.held
            self._held += size - item.held
            item.held = size
            self.report.peak_bytes = max(self.report.peak_bytes, self._held)
            return True

    def _release(self, item: _Item) -> None:
        with self._lock:
            self._held -= item.held
            item.held = 0
            item.loaded = None

    def _drop(self, item: _Item, outcome: str) -> None:
        """Nobody takes `item`: released now, or by its load once that ends."""
        with self._lock:
            item.dropped = True
            item.record.outcome = outcome
            loading = not item.done.is_set()
        if not loading:
            self._release(item)

    def _lower(self) -> None:
        """Right before XLA's deserialization (which releases the GIL): this thread below
        the trainer, unless the trainer already waits for a load. Its id is in the list
        `unyield` acts on until the thread's load is over (the kernel reuses ids)."""
        with self._lock:
            if self._waited:
                return
            self._native_ids.append(threading.get_native_id())
        yield_cpu()

    def _core_free(self, item: _Item) -> bool:
        """Wait until a core is idle for `item`'s load; False when its lookup, the end of
        init or the process's exit came first (then it is not loaded)."""
        before = cpu_ticks() if self.wait_for_core else None
        while True:
            with self._lock:
                if item.asked or item.dropped or self._stopping.is_set():
                    return False
                # Not asked to wait, or the trainer waits for a load: it wants no core now.
                if before is None or self._waited:
                    item.started = True
                    return True
            if self._stopping.wait(next(self._intervals)):  # an exit ends the wait at once
                return False
            after = cpu_ticks()
            with self._lock:
                if item.asked or item.dropped:
                    return False
                if after is None or idle_cores(before, after) >= IDLE_CORE:
                    item.started = True
                    self._intervals = sample_intervals()  # the next load: 1 s again
                    return True
            before = after

    def _read_all(self) -> None:
        """Each item in load order, once a core is idle for it: read and decompress it
        within the cap, then deserialize it on a thread of its own (at most WORKERS at
        once). One nobody will take any more is not read."""
        for item in self._items.values():
            if not self._core_free(item):
                item.done.set()
                continue
            start = time.perf_counter()
            try:
                read = None if item.dropped else self._read(item)
            except Exception as exc:  # a load that fails leaves JAX's own path to the trainer
                self._failed(item, exc)
                read = None
            if read is None:
                self._done(item, None, start)
                continue
            self._slots.acquire()
            thread = threading.Thread(target=self._deserialize, args=(item, *read, start),
                                      daemon=True, name=f"jaxwarm-prefetch-{item.record.key}")
            self._threads.append(thread)
            thread.start()

    def _read(self, item: _Item) -> tuple[bytes, int] | None:
        """The serialized executable and its compile time; None (outcome OVER_CAP) when the
        cap does not admit its file or its serialized bytes. The cap bounds the inflation
        itself: it stops at the first block past what the cap could still admit."""
        data = self.store.read_entry(item.record.key, lambda size: self._admit(item, size))
        if data is None:
            item.record.outcome = OVER_CAP
            return None
        room = self._room(item)
        try:
            serialized, compile_time = read_payload(io.BytesIO(data), room + TIME_BYTES)
            size = len(serialized)
        except PayloadTooBig:
            serialized, compile_time = b"", 0
            size = room + 1  # past the cap: `_admit` refuses it, and takes back the file's
        del data
        if not self._admit(item, size):
            item.record.outcome = OVER_CAP
            return None
        return serialized, compile_time

    def _room(self, item: _Item) -> int:
        """The most bytes `_admit` could admit for `item` now."""
        with self._lock:
            return self.report.max_size - (self._admitted - item.held)

    def _deserialize(self, item: _Item, serialized: bytes, compile_time: int,
                     start: float) -> None:
        loaded = None
        try:
            loaded = deserialize(serialized, compile_time, item.spec, before=self._lower)
            item.record.size = loaded.size
        except Exception as exc:  # as in _read_all
            self._failed(item, exc)
        finally:
            with self._lock:
                native_id = threading.get_native_id()
                if native_id in self._native_ids:
                    self._native_ids.remove(native_id)
            self._slots.release()
            self._done(item, loaded, start)

    def _failed(self, item: _Item, exc: Exception) -> None:
        item.record.outcome = f"{NOT_LOADED}: {type(exc).__name__}: {exc}"
        log.warning("jaxwarm: prefetch of %s: %s; JAX loads it at the trainer's call",
                    item.record.function, item.record.outcome)

    def _done(self, item: _Item, loaded: Loaded | None, start: float) -> None:
        """`item`'s load is over: kept for its lookup, or released."""
        item.record.load_s = round(time.perf_counter() - start, 6)
        with self._lock:
            item.loaded = loaded
            item.done.set()
            keep = loaded is not None and not item.dropped
        if not keep:
            self._release(item)

    def prefetched(self, key: str) -> bool:
        return key in self._items

    def take(self, asked: Asked) -> Loaded | None:
        """The trainer's lookup of a prefetched key: its executable, or None (JAX's path)."""
        item = self._items[asked.key]
        with self._lock:
            first, item.asked = not item.asked, True
            started = item.started
        if not first:
            return None  # a second lookup of one key (JAX handed the first its executable)
        if not started:  # no core was idle for it in time: JAX's own path, as without
            self._drop(item, NO_IDLE_CORE)
            return None
        why = mismatch(item.spec, asked, self.store.dir)
        if why is not None:
            self._drop(item, f"not used: {why}")
            log.warning("jaxwarm: %s was prefetched under key %s but not used: %s; JAX "
                        "loads it itself", item.record.function, asked.key, why)
            return None
        start = time.perf_counter()
        if not item.done.is_set():
            with self._lock:
                self._waited = True
                native_ids = list(self._native_ids)
            unyield(native_ids)
        item.done.wait()
        item.record.waited_s = round(time.perf_counter() - start, 6)
        with self._lock:
            loaded = item.loaded
        self._release(item)
        if loaded is not None:
            item.record.outcome = USED
            if self.capped:
                try:
                    self.store.mark_used(asked.key)
                except OSError as exc:  # bookkeeping never stops a load
                    log.warning("jaxwarm: %s: its atime file: %s", asked.key, exc)
        return loaded

    def finish(self) -> None:
        """Init is over: release what was never asked for, and name it."""
        with self._lock:
            unasked = [item for item in self._items.values() if not item.asked]
            for item in unasked:
                item.asked = True  # a lookup after init takes JAX's path
        for item in unasked:
            failed = item.done.is_set() and item.loaded is None
            self._drop(item, item.record.outcome if failed else UNUSED)
        if unasked:
            log.info("jaxwarm: prefetched but never asked for by the first step, released: %s",
                     ", ".join(item.record.function for item in unasked))


_started: list[Prefetch] = []


def start_prefetch(entries: list[ManifestEntry], store: CacheStore, max_size: int,
                   started_s: float, capped: bool, wait_for_core: bool) -> Prefetch | None:
    """Start loading `entries` (those recorded with what loading takes, whose file is in
    `store`, the dir JAX reads), each once a core is idle where `wait_for_core`, and serve
    JAX's lookups of them; once per process. None when there is nothing to load."""
    if _started:
        return None
    loadable = [e for e in entries if e.compile_options is not None and store.has_entry(e.key)]
    if not loadable:
        return None
    prefetch = Prefetch(loadable, store, max_size, started_s, capped, wait_for_core)
    serve_lookups(prefetch.prefetched, prefetch.take)
    _started.append(prefetch)
    prefetch.start()
    atexit.register(prefetch.join)
    log.info("jaxwarm: prefetching %s", ", ".join(e.function for e in loadable))
    return prefetch

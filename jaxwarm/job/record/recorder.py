"""Records what the persistent cache did during a job's init, and writes the init report.

Two sources, both public: `jax.monitoring` events (lookups, hits, durations) and the log
lines JAX always emits at DEBUG (function name and key of each hit or miss, and the hash of
each key component). The log records are caught by a filter on JAX's own loggers that lets
through only what would have been shown anyway, so recording adds no output.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxwarm.core.files import atomic_write, lock_waits, make_dirs
from jaxwarm.core.inputdiff import input_differences
from jaxwarm.core.jsonio import dumps
from jaxwarm.core.records import (
    COMPILE,
    LOAD,
    LOWER,
    OPTIONS_DIFFER,
    PREDICT,
    RANKS_WAIT,
    RECOMPILED,
    TRACE,
    TRAIN,
    FunctionRecord,
    InitReport,
    InputSignature,
    ReportWarning,
)
from jaxwarm.jaxkey.components import explain
from jaxwarm.jaxkey.globalopts import differences, options_line
from jaxwarm.jaxkey.globalopts import snapshot as global_options
from jaxwarm.jaxkey.inputs import module_inputs, watch_inputs
from jaxwarm.jaxkey.logs import (
    CACHE_KEY_LOGGER,
    COMPILER_LOGGER,
    COMPONENT,
    EVENT_BACKEND_COMPILE,
    EVENT_HIT,
    EVENT_LOOKUP,
    EVENT_LOWERED,
    EVENT_RETRIEVAL,
    EVENT_SAVED,
    EVENT_TRACED,
    HIT_OR_MISS,
    LOWERING,
    LOWERING_LOGGER,
    NOT_WRITTEN,
    input_elements,
    is_hit,
)
from jaxwarm.jaxkey.pgle import pgle_components, watch_pgle_keys
from jaxwarm.jaxkey.predict import in_probe
from jaxwarm.job.record.firststep import FirstStepFinder, Found
from jaxwarm.job.record.phases import PhaseClock, Span, wrap_distributed_initialize

if TYPE_CHECKING:
    from jaxwarm.job.start.books import Books

log = logging.getLogger(__name__)



def module_name(label: str) -> str:
    """JAX's module name for a function label such as `jit(step)` or `jit(<lambda>)`
    (`jit_step`, `jit__lambda`): what its cache key and log lines start with."""
    if "(" not in label:
        label = f"jit({label})"
    return re.sub(r"[^\w.-]", "_", label).rstrip("_")


def signature_of(avals: str) -> str:
    """A short stable id of a function's abstract input types, as JAX prints them."""
    return hashlib.sha256(avals.encode()).hexdigest()[:12]


def process_start_time() -> float:
    """Wall-clock time this process started, so that init time includes the Python imports.

    On Linux: the start in clock ticks since boot (`/proc/self/stat`, field 22) against the
    time since boot now (CLOCK_BOOTTIME, the clock those ticks count on, suspend included),
    taken from the wall clock now: exact to one tick (10 ms at the usual 100 ticks/s; the
    middle of the tick is taken, so within 5 ms). `/proc/stat`'s btime, which psutil uses
    too, is whole seconds and put the start up to 1 s early. Elsewhere: psutil's start time
    where it is installed, else now (the imports before it then go uncounted)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19]) + 0.5
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil
        return float(psutil.Process().create_time())
    except Exception:  # not installed, or no start time on this system
        log.debug("no process start time on this system: timing from now")
        return time.time()


@dataclass(frozen=True)
class Prewarmed:
    """What a training job knows of one function a prewarm compiled (the manifest's entry a
    lookup of the name is compared with: `jaxwarm.store.manifest.Manifest.compared`):
    the abstract signature and inputs it was lowered with (None: not recorded), whether it
    is a step, the run whose prewarm compiled it, and its key."""

    signature: str | None
    inputs: InputSignature | None
    is_step: bool
    run: str
    key: str


class _CaptureFilter(logging.Filter):
    """Hands every record of a JAX logger to the recorder, then lets through only those the
    logger would have passed at its previous level."""

    def __init__(self, recorder: InitRecorder, passing_level: int):
        super().__init__()
        self.recorder = recorder
        self.passing_level = passing_level

    def filter(self, record: logging.LogRecord) -> bool:
        self.recorder.on_log(record.getMessage())
        return record.levelno >= self.passing_level


class InitRecorder:
    """Collects cache events for one process and writes its init report as JSON.

    It can be installed before the trainer's own code runs (`jaxwarm.job.start.call`), when the
    process does not know its place in `jax.distributed` yet and must not touch a device
    (that would break the trainer's `jax.distributed.initialize()`). It then binds itself
    at the first lowering, when the backend exists: process index and report path. `path`
    is the report's path, or a function of the process index that gives it. What the rest
    of the job adds at each moment (the cache guard, the dir checks, the ranks, the ledger,
    process 0's records) is in its `books` (`jaxwarm.job.start.books`); a recorder without
    books records JAX's events alone.
    """

    def __init__(self, report: InitReport, path: Path | Callable[[int], Path],
                 recompile_warn_s: float = 1.0, books: Books | None = None):
        self.report = report
        # Only compiles at least this long count as a wasteful double compile: small helpers
        # (e.g. allgathers) legitimately compile once per input shape.
        self.recompile_warn_s = recompile_warn_s
        self._path_for = path if callable(path) else None
        self.path: Path | None = None if callable(path) else path
        self.books = books
        self.start_time = process_start_time()
        # The init phases: JAX's compile time spans and jaxwarm's own timers.
        self.clock = PhaseClock(self.start_time)
        self._lock = threading.Lock()
        self._components: dict[str, str] = {}
        self._signatures: dict[str, str] = {}
        self._pending: FunctionRecord | None = None
        self._warned: set[str] = set()
        self._options: dict[str, str] = {}
        # The global JAX settings each prewarmed function (by name) was lowered under: a miss
        # of one of them under other settings is said as the settings that differ.
        self.prewarmed_options: dict[str, dict[str, str]] = {}
        # The prewarmed functions, by name (this run's, else another run's): a lookup of one
        # is marked prewarmed, and a miss of one says how its inputs differ
        # (`_compare_with_prewarm`).
        self.prewarmed: dict[str, Prewarmed] = {}
        self._matched: set[str] = set()  # names looked up with the prewarmed signature
        # The functions whose inputs are read at their compile (None: all, as the prewarm
        # and verify jobs do; a training job: its run's prewarmed functions).
        self.inputs_of: set[str] | None = None
        self._avals: dict[str, str] = {}
        # The module of each wanted function's latest compile, read into its inputs only
        # when asked (a miss, the prewarm's record): a hit costs nothing.
        self._modules: dict[str, Any] = {}
        self._inputs: dict[str, InputSignature] = {}
        # When the trainer never calls mark_first_step(), jaxwarm finds its first step.
        self.first_step = FirstStepFinder(self)
        self._init_ended = False

    # -- wiring ---------------------------------------------------------------------------

    def install(self) -> InitRecorder:
        import jax.monitoring as monitoring
        monitoring.register_event_listener(self.on_event)
        monitoring.register_event_duration_secs_listener(self.on_duration)
        monitoring.register_event_time_span_listener(self.on_span)
        wrap_distributed_initialize()
        watch_pgle_keys()
        watch_inputs(self.on_compile)
        for name in (COMPILER_LOGGER, CACHE_KEY_LOGGER, LOWERING_LOGGER):
            logger = logging.getLogger(name)
            logger.addFilter(_CaptureFilter(self, logger.getEffectiveLevel()))
            logger.setLevel(logging.DEBUG)
        return self

    def bind(self) -> None:
        """Learn this process's place in the job; safe only once the backend may start."""
        if self.path is not None:
            return
        import jax

        self.report.process_index = jax.process_index()
        self.report.process_count = jax.process_count()
        assert self._path_for is not None
        self.path = self._path_for(self.report.process_index)
        if self.books is not None:
            self.books.bound(self)

    def expect_prewarmed(self, prewarmed: dict[str, Prewarmed],
                         options: dict[str, dict[str, str]], run_prewarmed: int) -> None:
        """What a training job takes from the prewarm manifest, before its first lookup: the
        prewarmed functions by name (a lookup of one is marked prewarmed, a miss of one is
        compared with it), the global JAX settings each was lowered under (`options`), and
        how many of the entries are this run's own (`run_prewarmed`). Only those functions'
        inputs are read at their compile."""
        with self._lock:
            self.prewarmed = dict(prewarmed)
            self.prewarmed_options = {name: opts for name, opts in options.items() if opts}
            self.inputs_of = {name for name, known in prewarmed.items()
                              if known.inputs is not None}
            self.report.run_prewarmed = run_prewarmed

    def add_warning(self, warning: ReportWarning, quiet: bool = False) -> None:
        """Into the report, and (unless `quiet`: already said) the job log."""
        with self._lock:
            self.report.warnings.append(warning)
        if not quiet:
            log.warning("jaxwarm: %s", warning.text)

    @contextmanager
    def waiting_for_ranks(self, function: str) -> Iterator[None]:
        """The calling thread waits at the ranks' meeting after compiling `function`: the
        wait goes into the report and its phases, and a first-step watcher of a program this
        thread compiled pauses meanwhile (`FirstStepFinder.meeting`)."""
        start = time.time()
        try:
            with self.first_step.meeting():
                yield
        finally:
            end = time.time()
            with self._lock:
                self.report.ranks_wait_s += end - start
            self.clock.add(Span(RANKS_WAIT, start, end, function))

    def signature(self, module_name: str) -> str | None:
        """The abstract signature `module_name` (e.g. jit_train_step) was last lowered for."""
        with self._lock:
            return self._signatures.get(module_name)

    def inputs(self, module_name: str) -> InputSignature | None:
        """The inputs `module_name` was last compiled (or looked up) with, when wanted
        (`inputs_of`)."""
        with self._lock:
            return self._read_inputs(module_name)

    def _read_inputs(self, name: str) -> InputSignature | None:
        """`inputs`, the lock held: the module read once (about 30 us per input)."""
        module = self._modules.pop(name, None)
        if module is not None:
            self._inputs[name] = module_inputs(module, self._avals.get(name))
        return self._inputs.get(name)

    def lowered_inputs(self, module_name: str, lowered: Any) -> InputSignature:
        """The inputs of a function lowered and not compiled (a verify or prewarm target,
        whose key is predicted), with the weak types of its lowering line."""
        with self._lock:
            avals = self._avals.get(module_name)
        return module_inputs(lowered.compiler_ir("stablehlo"), avals)

    # -- callbacks from JAX -----------------------------------------------------------------

    def on_event(self, event: str, **kwargs: Any) -> None:
        if in_probe():  # a key prediction, not a compile
            return
        with self._lock:
            if event == EVENT_LOOKUP:
                if not self.report.lookups:
                    self._opened_cache()
                self.report.lookups += 1
            elif event == EVENT_HIT:
                self.report.hits += 1

    def on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        if in_probe():
            return
        if event == EVENT_LOWERED:
            # The end of a lowering comes right before JAX computes the key and looks it up.
            if self.books is not None:
                self.books.lowered(self)
            self.bind()
            options = global_options()
            with self._lock:
                self._options = options
            if self.books is not None:
                self.books.before_lookup(self)
            return
        with self._lock:
            if event == EVENT_RETRIEVAL:
                self.report.retrieval_s += duration
            elif event == EVENT_SAVED:
                self.report.compile_time_saved_s += duration
            elif event == EVENT_BACKEND_COMPILE:
                record = self._finish_function(str(kwargs.get("fun_name", "?")), duration)
        if event == EVENT_BACKEND_COMPILE:
            self.first_step.watch(record)

    def on_span(self, event: str, start: float, end: float, **kwargs: Any) -> None:
        """JAX's time span of a trace, lowering or backend compile (or cache load): what
        the init phases are made of. A backend span ends right after its duration event,
        so the function's record already says hit or miss."""
        name = module_name(str(kwargs.get("fun_name", "?")))
        if event == EVENT_BACKEND_COMPILE:
            if in_probe():
                phase = PREDICT
            else:
                with self._lock:
                    last = self.report.functions[-1] if self.report.functions else None
                phase = LOAD if last is not None and last.name == name and last.hit \
                    else COMPILE
        elif event in (EVENT_TRACED, EVENT_LOWERED) and not in_probe():
            phase = TRACE if event == EVENT_TRACED else LOWER
        else:
            return
        self.clock.add(Span(phase, start, end, name))

    def on_compile(self, name: str, module: Any) -> None:
        """A compile or lookup is about to start: keep the module of a function whose
        inputs are wanted (`inputs_of`), to read if asked."""
        if self.inputs_of is not None and name not in self.inputs_of:
            return
        with self._lock:
            self._modules[name] = module
            self._inputs.pop(name, None)

    def on_log(self, message: str) -> None:
        with self._lock:
            if match := COMPONENT.match(message):
                self._components[match["component"]] = match["hash"]
            elif match := HIT_OR_MISS.match(message):
                pgle = pgle_components(match["key"])
                self._pending = FunctionRecord(
                    name=match["name"], key=match["key"], hit=is_hit(match),
                    components=self._components if pgle is None else pgle,
                    signature=self._signatures.get(match["name"]),
                    global_options=self._options, pgle_optimized=pgle is not None)
                self._components = {}
            elif (match := NOT_WRITTEN.match(message)) and self._pending is not None:
                self._pending.not_stored = match["why"]
            elif match := LOWERING.match(message):
                name = module_name(match["name"])
                self._signatures[name] = signature_of(match["avals"])
                self._avals[name] = match["avals"]
                self.first_step.input_elements[name] = input_elements(match["avals"])

    def _opened_cache(self) -> None:
        """At the first lookup JAX opens its cache dir, and keeps it for the process: that
        dir (the config's, or under cache.enforce off one the trainer set) is the one the
        report names, and what a miss is explained against."""
        import jax

        self.report.cache_dir = str(jax.config.jax_compilation_cache_dir)

    def _finish_function(self, fun_name: str, duration: float) -> FunctionRecord:
        # JAX's backend-compile duration wraps the whole lookup: the retrieval on a hit,
        # the compile on a miss. Without a pending lookup the cache was not consulted.
        name = module_name(fun_name)
        record = self._pending or FunctionRecord(name=name, key=None, hit=False,
                                                 signature=self._signatures.get(name))
        self._pending = None
        record.seconds = duration
        if not record.hit:
            self.report.backend_compile_s += duration
        self._compare_with_prewarm(record)
        self._check_recompile(record)
        self._check_global_options(record)
        self.report.functions.append(record)
        return record

    def _compare_with_prewarm(self, record: FunctionRecord) -> None:
        """Mark a lookup of a function a prewarm compiled (`prewarmed`), with the prewarm it
        is compared with, and say how the inputs of one that missed differ from the
        prewarm's (none: the program does).

        Which lookup of the name is the prewarmed function: the one with the prewarmed
        signature; until one has come, the first with other inputs (the step called with
        other shapes, the drift this is for). Other signatures besides are other
        functions of the same name (an eval step named like the train step), and a
        lookup with the prewarmed signature after a first guess takes its place."""
        prewarmed = self.prewarmed.get(record.name)
        if record.key is None or prewarmed is None:
            return
        name = record.name
        if prewarmed.signature in (None, record.signature):
            if name not in self._matched:
                self._matched.add(name)
                for earlier in self.report.functions:
                    if earlier.name == name and earlier.prewarmed:
                        earlier.prewarmed, earlier.input_changes = False, None
                        earlier.compared_with = None
        elif name in self._matched or any(earlier.name == name and earlier.prewarmed
                                          for earlier in self.report.functions):
            return
        record.prewarmed, record.compared_with = True, prewarmed.key
        if record.hit or prewarmed.inputs is None:
            return
        now = self._read_inputs(name)
        if now is not None:
            record.input_changes = input_differences(prewarmed.inputs, now)

    def _check_global_options(self, record: FunctionRecord) -> None:
        """Say once which global JAX settings differ when a prewarmed function misses."""
        prewarmed = self.prewarmed_options.get(record.name)
        if record.hit or record.key is None or not prewarmed or \
                f"options:{record.name}" in self._warned:
            return
        lines = differences(prewarmed, record.global_options)
        if lines:
            self._warned.add(f"options:{record.name}")
            warning = ReportWarning(OPTIONS_DIFFER, options_line(record.name, lines))
            self.report.warnings.append(warning)
            log.warning("jaxwarm: %s", warning.text)

    def _check_recompile(self, record: FunctionRecord) -> None:
        """Warn once when one function is compiled again under another key: the
        double-compile pattern (AOT from a dummy batch, then again at step 0). PGLE's
        profile-guided compile is another key by design, not that."""
        if record.key is None or record.pgle_optimized or record.name in self._warned or \
                record.seconds < self.recompile_warn_s:
            return
        for earlier in self.report.functions:
            if earlier.name == record.name and earlier.key not in (None, record.key) and \
                    earlier.signature == record.signature and \
                    earlier.seconds >= self.recompile_warn_s:
                reasons = explain(earlier.components, record.components) or \
                    ["the key components were not recorded"]
                message = (f"'{record.name}' was compiled twice in this process under "
                           f"different cache keys (e.g. an AOT compile from a dummy input, "
                           f"then the real call): " + "; ".join(reasons))
                self.report.warnings.append(ReportWarning(RECOMPILED, message))
                self._warned.add(record.name)
                log.warning("%s", message)
                return

    # -- milestones ---------------------------------------------------------------------------

    def mark_first_step(self) -> None:
        """Call once the first train step has finished (after block_until_ready).

        The trainer's own call wins over the time jaxwarm detected, whichever came first.
        """
        self.first_step.mark(Found.TRAINER, "trainer")

    def first_step_found(self, now: float, source: str, steps: set[str], *,
                         final: bool) -> None:
        """The first step ended at `now` (`FirstStepFinder.mark`), after the compile or load
        of `steps` (every function when empty): into the report, its phases and the books."""
        with self._lock:
            self.report.time_to_first_step_s = now - self.start_time
            self.report.first_step_from = source
        # A job that runs no step (prewarm, verify) has no first step to end its phases.
        phases = self.clock.finish(now, steps if self.report.job == TRAIN else None,
                                   final=final)
        with self._lock:
            self.report.phases = phases
        self.write()
        if self.books is not None:
            self.books.first_step(self)

    def end_init(self) -> None:
        """Init is over: the books' `init_over` runs, once. After a guessed first step it
        waits for a better-founded one, or the end of the process (`close`): a later
        function with larger inputs would still replace the guess."""
        with self._lock:
            if self._init_ended or self.report.time_to_first_step_s is None:
                return
            self._init_ended = True
        self.clock.stop()
        if self.books is not None:
            self.books.init_over(self)

    def close(self) -> Path | None:
        """At the end of the process: stop waiting for first executions (a watcher still
        inside JAX when the interpreter ends would abort the process), end init if only a
        guess found the first step, and write the report."""
        self.first_step.close()
        self.end_init()
        return self.write()

    def write(self) -> Path | None:
        """Write the report; not before the process knows its index (a wrapped trainer that
        stopped before its first lowering): a guessed index would overwrite another
        process's report, and the launcher says when a training job wrote none."""
        if self.path is None:
            return None
        with self._lock:
            self.report.lock_wait_s = lock_waits()
            text = dumps(self.report, indent=1) + "\n"
        make_dirs(self.path.parent)
        return atomic_write(self.path, text)

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.files import atomic_write, lock_waits
from launcher.injob.guard import CacheGuard
from launcher.injob.phases import (
    COMPILE,
    LOAD,
    LOWER,
    PREDICT,
    RANKS_WAIT,
    TRACE,
    PhaseClock,
    Span,
    wrap_distributed_initialize,
)
from launcher.jaxkey.components import explain
from launcher.jaxkey.globalopts import differences, options_line
from launcher.jaxkey.globalopts import snapshot as global_options
from launcher.jaxkey.logs import (
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
    is_hit,
)
from launcher.jaxkey.predict import in_probe
from launcher.records import (
    OPTIONS_DIFFER,
    RECOMPILED,
    SETTING_CHANGED,
    FunctionRecord,
    InitReport,
    ReportWarning,
    dumps,
)
from launcher.rundir import TRAIN

log = logging.getLogger("jaxwarm.recorder")

FIRST_STEP_POLL_S = 0.005


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
    """Wall-clock time this process started, so init time includes the Python imports."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


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

    It can be installed before the trainer's own code runs (`launcher.injob.call`), when the
    process does not know its place in `jax.distributed` yet and must not touch a device
    (that would break the trainer's `jax.distributed.initialize()`). It then binds itself
    at the first lowering, when the backend exists: process index, report path, and the
    `on_bind` callbacks (cache dir checks). `path` is the report's path, or a function of
    the process index that gives it.
    """

    def __init__(self, report: InitReport, path: Path | Callable[[int], Path],
                 recompile_warn_s: float = 1.0, guard: CacheGuard | None = None):
        self.report = report
        # Only compiles at least this long count as a wasteful double compile: small helpers
        # (e.g. allgathers) legitimately compile once per input shape.
        self.recompile_warn_s = recompile_warn_s
        self._path_for = path if callable(path) else None
        self.path: Path | None = None if callable(path) else path
        self.guard = guard
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
        # Called once the process knows its index (e.g. the cache dir's safety checks).
        self.on_bind: list[Callable[[InitRecorder], None]] = []
        # (name, abstract signature) of the functions whose first execution ends the first
        # step when the trainer never says.
        self.step_functions: set[tuple[str, str | None]] = set()
        self._watching = False
        # Called with the report once the first step is done (e.g. the cache's usage log).
        self.after_first_step: list[Callable[[InitReport], None]] = []
        # Called at the end of each lowering, right before JAX computes the key and looks it
        # up (e.g. the cache dir re-check); an exception stops that compile.
        self.before_lookup: list[Callable[[], None]] = []

    # -- wiring ---------------------------------------------------------------------------

    def install(self) -> InitRecorder:
        import jax.monitoring as monitoring
        monitoring.register_event_listener(self.on_event)
        monitoring.register_event_duration_secs_listener(self.on_duration)
        monitoring.register_event_time_span_listener(self.on_span)
        wrap_distributed_initialize()
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
        for callback in self.on_bind:
            callback(self)

    def add_warning(self, warning: ReportWarning, quiet: bool = False) -> None:
        """Into the report, and (unless `quiet`: already said) the job log."""
        with self._lock:
            self.report.warnings.append(warning)
        if not quiet:
            log.warning("jaxwarm: %s", warning.text)

    def add_rank_wait(self, start: float, end: float, function: str) -> None:
        """A wait at the ranks' meeting (wall-clock times): in the report and its phases."""
        with self._lock:
            self.report.ranks_wait_s += end - start
        self.clock.add(Span(RANKS_WAIT, start, end, function))

    def signature(self, module_name: str) -> str | None:
        """The abstract signature `module_name` (e.g. jit_train_step) was last lowered for."""
        with self._lock:
            return self._signatures.get(module_name)

    # -- callbacks from JAX -----------------------------------------------------------------

    def on_event(self, event: str, **kwargs: Any) -> None:
        if in_probe():  # a key prediction, not a compile
            return
        with self._lock:
            if event == EVENT_LOOKUP:
                self.report.lookups += 1
            elif event == EVENT_HIT:
                self.report.hits += 1

    def on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        if in_probe():
            return
        if event == EVENT_LOWERED:
            self._check_settings()
            self.bind()
            options = global_options()
            with self._lock:
                self._options = options
            for check in self.before_lookup:
                check()
            return
        with self._lock:
            if event == EVENT_RETRIEVAL:
                self.report.retrieval_s += duration
            elif event == EVENT_SAVED:
                self.report.compile_time_saved_s += duration
            elif event == EVENT_BACKEND_COMPILE:
                record = self._finish_function(str(kwargs.get("fun_name", "?")), duration)
        if event == EVENT_BACKEND_COMPILE:
            self._maybe_watch_first_step(record)

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

    def on_log(self, message: str) -> None:
        with self._lock:
            if match := COMPONENT.match(message):
                self._components[match["component"]] = match["hash"]
            elif match := HIT_OR_MISS.match(message):
                self._pending = FunctionRecord(
                    name=match["name"], key=match["key"], hit=is_hit(match),
                    components=self._components, signature=self._signatures.get(match["name"]),
                    global_options=self._options)
                self._components = {}
            elif match := LOWERING.match(message):
                self._signatures[module_name(match["name"])] = signature_of(match["avals"])

    def _check_settings(self) -> None:
        if self.guard is None:
            return
        lines = self.guard.check(looked_up=self.report.lookups > 0)
        if lines:
            import jax
            with self._lock:
                self.report.warnings.extend(ReportWarning(SETTING_CHANGED, line)
                                            for line in lines)
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
        self._check_recompile(record)
        self._check_global_options(record)
        self.report.functions.append(record)
        return record

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
        double-compile pattern (AOT from a dummy batch, then again at step 0)."""
        if record.key is None or record.name in self._warned or \
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

    def _maybe_watch_first_step(self, record: FunctionRecord) -> None:
        """Start waiting for the first execution of a prewarmed step, once per process.

        A trainer that never calls mark_first_step() still gets a time to first step: the
        compile just finished returns to a call that executes the step at once, so the
        arrays that appear after it are that step's outputs (or the transfers of its inputs,
        then its outputs); the step has ended when they are ready.
        """
        if self._watching or (record.name, record.signature) not in self.step_functions or \
                self.report.time_to_first_step_s is not None:
            return
        import jax

        self._watching = True
        before = {id(array) for array in jax.live_arrays()}
        threading.Thread(target=self._wait_first_execution, args=(record.name, before),
                         name="jaxwarm-first-step", daemon=True).start()

    def _wait_first_execution(self, name: str, before: set[int]) -> None:
        import jax

        fresh: list[Any] = []
        while not fresh:
            if self.report.time_to_first_step_s is not None:
                return  # the trainer said it first
            time.sleep(FIRST_STEP_POLL_S)
            fresh = [a for a in jax.live_arrays() if id(a) not in before]
        # One more look: the call may transfer uncommitted inputs just before it dispatches.
        time.sleep(FIRST_STEP_POLL_S)
        before.update(id(array) for array in fresh)
        fresh += [a for a in jax.live_arrays() if id(a) not in before]
        jax.block_until_ready(fresh)
        self.mark_first_step(source=f"the first execution of {name}")

    def mark_first_step(self, source: str = "trainer") -> None:
        """Call once the first train step has finished (after block_until_ready).

        The trainer's own call wins over the time jaxwarm detected, whichever came first.
        """
        with self._lock:
            detected = self.report.first_step_from not in (None, "trainer")
            if self.report.time_to_first_step_s is not None and \
                    not (detected and source == "trainer"):
                return
            first = self.report.time_to_first_step_s is None
            now = time.time()
            self.report.time_to_first_step_s = now - self.start_time
            self.report.first_step_from = source
            steps = {name for name, _ in self.step_functions}
        phases = self.clock.finish(now, self.first_step_of(source, steps))
        with self._lock:
            self.report.phases = phases
        self.write()
        if not first:
            return
        for callback in self.after_first_step:
            try:
                callback(self.report)
            except OSError as exc:  # bookkeeping must never stop training
                log.warning("after the first step: %s", exc)

    def first_step_of(self, source: str, steps: set[str]) -> set[str] | None:
        """The functions whose compile or load ends before the first step: the one whose
        first execution was detected, else the prewarmed steps (every function when none
        is known); None for a job that runs no step (prewarm, verify)."""
        if self.report.job != TRAIN:
            return None
        detected = source.removeprefix("the first execution of ")
        return {detected} if detected != source else steps

    def write(self) -> Path | None:
        """Write the report; not before the process knows its index (a wrapped trainer that
        stopped before its first lowering): a guessed index would overwrite another
        process's report, and the launcher says when a training job wrote none."""
        if self.path is None:
            return None
        with self._lock:
            self.report.lock_wait_s = lock_waits()
            text = dumps(self.report, indent=1) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(self.path, text)

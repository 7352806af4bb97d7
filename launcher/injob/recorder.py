"""Records what the persistent cache did during a job's init, and writes the init report.

Two sources, both public: `jax.monitoring` events (lookups, hits, durations) and the log
lines JAX always emits at DEBUG (function name and key of each hit or miss, and the hash of
each key component). The log records are caught by a filter on JAX's own loggers that lets
through only what would have been shown anyway, so recording adds no output.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from launcher.files import atomic_write
from prewarm.jaxkey.components import explain
from prewarm.jaxkey.logs import (CACHE_KEY_LOGGER, COMPILER_LOGGER, COMPONENT,
                                 EVENT_BACKEND_COMPILE, EVENT_HIT, EVENT_LOOKUP,
                                 EVENT_RETRIEVAL, EVENT_SAVED, HIT_OR_MISS, is_hit)
from prewarm.jaxkey.predict import in_probe

log = logging.getLogger("jaxwarm.recorder")


@dataclass
class FunctionRecord:
    """One compile request: a cache lookup (hit or miss) or a compile with the cache off."""

    name: str
    key: str | None
    hit: bool
    seconds: float = 0.0
    components: dict[str, str] = field(default_factory=dict)
    # Of the entry this process wrote (process 0, local cache): what `cache verify` checks.
    sha256: str | None = None
    size: int | None = None


@dataclass
class InitReport:
    job: str
    restart_count: int
    process_index: int
    process_count: int
    cache_dir: str
    init_budget_s: float
    lookups: int = 0
    hits: int = 0
    backend_compile_s: float = 0.0
    retrieval_s: float = 0.0
    compile_time_saved_s: float = 0.0
    time_to_first_step_s: float | None = None
    # The jaxwarm-owned variables this process ran with: equal across jobs and restarts.
    environment: dict[str, str] = field(default_factory=dict)
    functions: list[FunctionRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return self.lookups - self.hits

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["misses"] = self.misses
        data["over_budget"] = (self.time_to_first_step_s is not None
                               and self.time_to_first_step_s > self.init_budget_s)
        return data


def restart_count() -> int:
    """Which attempt of the job this is: 0, then 1, 2, ... after each SLURM requeue."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


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
    """Collects cache events for one process and writes its init report as JSON."""

    def __init__(self, report: InitReport, path: Path, recompile_warn_s: float = 1.0):
        self.report = report
        # Only compiles at least this long count as a wasteful double compile: small helpers
        # (e.g. allgathers) legitimately compile once per input shape.
        self.recompile_warn_s = recompile_warn_s
        self.path = path
        self.start_time = process_start_time()
        self._lock = threading.Lock()
        self._components: dict[str, str] = {}
        self._pending: FunctionRecord | None = None
        self._warned: set[str] = set()
        # Called with the report once the first step is done (e.g. the cache's usage log).
        self.after_first_step: list[Callable[[InitReport], None]] = []

    # -- wiring ---------------------------------------------------------------------------

    def install(self) -> InitRecorder:
        import jax.monitoring as monitoring
        monitoring.register_event_listener(self.on_event)
        monitoring.register_event_duration_secs_listener(self.on_duration)
        for name in (COMPILER_LOGGER, CACHE_KEY_LOGGER):
            logger = logging.getLogger(name)
            logger.addFilter(_CaptureFilter(self, logger.getEffectiveLevel()))
            logger.setLevel(logging.DEBUG)
        return self


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
        with self._lock:
            if event == EVENT_RETRIEVAL:
                self.report.retrieval_s += duration
            elif event == EVENT_SAVED:
                self.report.compile_time_saved_s += duration
            elif event == EVENT_BACKEND_COMPILE:
                self._finish_function(str(kwargs.get("fun_name", "?")), duration)

    def on_log(self, message: str) -> None:
        with self._lock:
            if match := COMPONENT.match(message):
                self._components[match["component"]] = match["hash"]
            elif match := HIT_OR_MISS.match(message):
                self._pending = FunctionRecord(
                    name=match["name"], key=match["key"], hit=is_hit(match),
                    components=self._components)
                self._components = {}

    def _finish_function(self, fun_name: str, duration: float) -> None:
        # JAX's backend-compile duration wraps the whole lookup: the retrieval on a hit,
        # the compile on a miss. Without a pending lookup the cache was not consulted.
        record = self._pending or FunctionRecord(name=f"jit_{fun_name}", key=None, hit=False)
        self._pending = None
        record.seconds = duration
        if not record.hit:
            self.report.backend_compile_s += duration
        self._check_recompile(record)
        self.report.functions.append(record)

    def _check_recompile(self, record: FunctionRecord) -> None:
        """Warn once when one function is compiled again under another key: the
        double-compile pattern (AOT from a dummy batch, then again at step 0)."""
        if record.key is None or record.name in self._warned or \
                record.seconds < self.recompile_warn_s:
            return
        for earlier in self.report.functions:
            if earlier.name == record.name and earlier.key not in (None, record.key) and \
                    earlier.seconds >= self.recompile_warn_s:
                reasons = explain(earlier.components, record.components) or \
                    ["the key components were not recorded"]
                message = (f"'{record.name}' was compiled twice in this process under "
                           f"different cache keys (e.g. an AOT compile from a dummy input, "
                           f"then the real call): " + "; ".join(reasons))
                self.report.warnings.append(message)
                self._warned.add(record.name)
                log.warning("%s", message)
                return

    # -- milestones ---------------------------------------------------------------------------

    def mark_first_step(self) -> None:
        """Call once the first train step has finished (after block_until_ready)."""
        if self.report.time_to_first_step_s is None:
            self.report.time_to_first_step_s = time.time() - self.start_time
            self.write()
            for callback in self.after_first_step:
                try:
                    callback(self.report)
                except OSError as exc:  # bookkeeping must never stop training
                    log.warning("after the first step: %s", exc)

    def write(self) -> Path:
        with self._lock:
            data = self.report.to_json()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(self.path, json.dumps(data, indent=1) + "\n")

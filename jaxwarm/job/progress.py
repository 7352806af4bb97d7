"""What a long prewarm says while it compiles: each target with how long the same function
took last time on this layout, and when it should be done.

A 24-minute compile would otherwise print nothing until it ends. The manifest already knows
how long the same function (same name, abstract signature and process layout) took the last
time it was compiled, under any key: so each target gets one line, `compiling jit_train_step
(1 of 2; last time 23 min 10 s on this layout; ETA 11:42)`, and when stdout is a terminal the
elapsed time is rewritten in place every few seconds while it compiles. Process 0 also keeps
the line in `<run dir>/prewarm-progress.json`, which `jaxwarm status` shows for a running
prewarm job (its log is not a terminal).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jaxwarm.core.files import atomic_write
from jaxwarm.core.jsonio import dumps
from jaxwarm.core.records import PrewarmProgress
from jaxwarm.core.rundir import prewarm_progress_path
from jaxwarm.core.words import duration
from jaxwarm.store.manifest import ManifestEntry

log = logging.getLogger(__name__)

# How often the elapsed time is rewritten on a terminal.
TICK_S = 5.0


def progress_line(progress: PrewarmProgress, now: float | None = None) -> str:
    """What a prewarm compiles, with the ETA the last compile of the same function gives;
    with `now`, also how long it has been at it (`jaxwarm status`)."""
    if progress.done:
        return "prewarm: every target compiled or loaded"
    if progress.last_s is None:
        known = "no earlier compile of it on this layout"
    else:
        eta = time.strftime("%H:%M:%S", time.localtime(progress.started + progress.last_s))
        known = f"last time {duration(progress.last_s)} on this layout; ETA {eta}"
    line = f"compiling {progress.function} ({progress.index} of {progress.count}; {known})"
    if now is not None:
        line += f", {duration(max(now - progress.started, 0.0))} elapsed"
    return line


def last_compile(manifest: dict[str, ManifestEntry], function: str, signature: str | None,
                 process_count: int) -> ManifestEntry | None:
    """The newest compile of the same function on the same layout that the manifest knows,
    under any key (an emptied cache, a changed flag: the function is the same size)."""
    same = [entry for entry in manifest.values()
            if entry.function == function and entry.process_count == process_count
            and entry.compile_s > 0 and (signature is None or entry.signature in (None,
                                                                                  signature))]
    return max(same, key=lambda entry: entry.created, default=None)


@contextmanager
def compiling(progress: PrewarmProgress, record_to: Path | None) -> Iterator[None]:
    """Say that a target's compile starts (one line; on a terminal, the elapsed time kept up
    to date in place), and keep it in the run dir for `jaxwarm status` (process 0)."""
    line = progress_line(progress)
    log.info("%s", line)
    if record_to is not None:
        _record(record_to, progress)
    stop = threading.Event()
    ticker = None
    if sys.stdout.isatty():
        ticker = threading.Thread(target=_tick, args=(progress, stop), daemon=True,
                                  name="jaxwarm-progress")
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
            sys.stdout.write("\n")
            sys.stdout.flush()


def finished(record_to: Path | None, count: int) -> None:
    """The prewarm has no compile left: the progress file says so."""
    if record_to is not None:
        _record(record_to, PrewarmProgress(function="", index=count, count=count,
                                           started=time.time(), done=True))


def _record(path: Path, progress: PrewarmProgress) -> None:
    try:
        atomic_write(path, dumps(progress) + "\n")
    except OSError as exc:  # bookkeeping never stops a prewarm
        log.warning("cannot record the prewarm's progress: %s", exc)


def _tick(progress: PrewarmProgress, stop: threading.Event) -> None:
    while not stop.wait(TICK_S):
        elapsed = duration(time.time() - progress.started)
        sys.stdout.write(f"\r  {progress.function}: {elapsed} elapsed"
                         + (f" of about {duration(progress.last_s)}" if progress.last_s
                            else "") + " " * 8)
        sys.stdout.flush()


def progress_file(run_dir: Path, is_writer: bool) -> Path | None:
    return prewarm_progress_path(run_dir) if is_writer else None

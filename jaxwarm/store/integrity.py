"""Is a cache entry intact? And moving the ones that are not out of JAX's way.

JAX never replaces a corrupt entry: every run warns and recompiles, and a flipped byte that
still decompresses can crash the process (SIGILL) when the executable is loaded. So an entry
is checked twice: its compressed stream must decode to more than JAX's 4-byte header (catches
truncation, zeroing and most bit rot), and where jaxwarm saw it written (prewarm manifest or a
job's usage record) its sha256 must match (catches what still decodes). Bad entries move to
`jaxwarm-quarantine/` under JAX's lock; the next compile of that key writes a fresh one.
The checks read and write through the `LocalStore` they are given (its files, its usage log
as it parsed it), which binds them to its dir.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import stat
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from jaxwarm.core.files import atomic_write, file_kind, make_dir, modes_in
from jaxwarm.core.records import EntryChecked, EntryQuarantined
from jaxwarm.jaxkey.entryformat import (
    BLOCK_BYTES,
    HEAD_BYTES,
    TIME_BYTES,
    PayloadTooBig,
    looks_like_entry,
    payload_size,
)
from jaxwarm.store.entries import NotAnEntry, open_entry, payload_limit, remove_entry, scan
from jaxwarm.store.usage import KeyHistory, key_histories, read_usage, records_entry

if TYPE_CHECKING:
    from jaxwarm.store.store import LocalStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IntegrityCheck:
    """What a full check of one entry found (`check_entries`: `jaxwarm cache verify`, the
    prewarm's repairs): its size, the problem (None: intact), and whether a checksum was on
    record to compare. A warm decision's look at an entry is a `WarmCheck`."""

    key: str
    size: int
    problem: str | None
    checksum_known: bool

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class Recorded:
    """An entry as jaxwarm saw it written (or fully checked): what a quick check compares."""

    sha256: str
    size: int | None


class _Tap:
    """An entry file read once, in blocks, by the decompressor: hashes what passes through
    and notes whether any byte was non-zero."""

    def __init__(self, source: BinaryIO) -> None:
        self.source, self.digest, self.nonzero = source, hashlib.sha256(), False

    def read(self, size: int = BLOCK_BYTES) -> bytes:
        data = self.source.read(min(size if size >= 0 else BLOCK_BYTES, BLOCK_BYTES))
        self.digest.update(data)
        self.nonzero = self.nonzero or bool(data.strip(b"\0"))
        return data

    def drain(self) -> None:
        while self.read():
            pass


def entry_problem(path: Path, expected_sha256: str | None) -> str | None:
    """Why the entry at `path` cannot be loaded safely; None when it is intact. The full
    check: it reads and decompresses the whole entry, in bounded blocks, and refuses a
    payload beyond `payload_limit` of its size (a decompression bomb)."""
    try:
        source = open_entry(path)
    except FileNotFoundError:
        return "missing"
    except NotAnEntry as exc:
        return str(exc)
    with source:
        return stream_problem(source, os.fstat(source.fileno()).st_size, expected_sha256)


def stream_problem(source: BinaryIO, size: int, expected_sha256: str | None) -> str | None:
    """`entry_problem` of an entry opened for reading, `size` bytes long: a local file, or
    one read through etils.epath (`RemoteStore.entry_problem`)."""
    if not size:
        return "empty file (a torn or interrupted write)"
    tap = _Tap(source)
    payload, problem = 0, None
    try:
        payload = payload_size(tap, payload_limit(size))
    except PayloadTooBig as exc:
        return str(exc)
    except (zlib.error, ValueError) as exc:
        problem = f"does not decompress ({exc})"
    except Exception as exc:  # zstandard raises its own error type
        problem = f"does not decompress ({type(exc).__name__}: {exc})"
    tap.drain()
    if not tap.nonzero:
        return f"all {size} bytes are zero"
    if problem:
        return problem
    if payload <= TIME_BYTES:
        return f"decompresses to {payload} bytes: no executable after the header"
    if expected_sha256 is not None and tap.digest.hexdigest() != expected_sha256:
        return "sha256 differs from the one recorded when it was written"
    return None


def recorded_entries(store: LocalStore, strict: bool = True, key: str | None = None,
                     histories: dict[str, KeyHistory] | None = None) -> dict[str, Recorded]:
    """Checksum and size per key (only `key`'s when given), as recorded when jaxwarm saw the
    entry written. The usage log is the later word: a quarantine or prune there voids the
    manifest's record. With `strict=False` a broken manifest counts as empty (see
    `read_manifest`). `histories`: the usage log as the caller already parsed it (with
    `key`, at least that key's lines); else the store's whole log, or `key`'s lines."""
    recorded = {name: Recorded(entry.sha256, entry.size)
                for name, entry in store.manifest(strict, key).items() if entry.sha256}
    if histories is None:
        histories = store.histories() if key is None else key_lines(store, key)
    for name, history in histories.items():
        if key is not None and name != key:
            continue
        if history.sha256:
            recorded[name] = Recorded(history.sha256, history.size)
        elif history.removed:
            recorded.pop(name, None)
    return recorded


def quick_problem(path: Path, size: int) -> str | None:
    """The cheap check of a recorded entry (a stat and the first bytes): its size is the one
    recorded and it starts like a zstd or zlib stream. Catches a torn, truncated or
    replaced file without reading it."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISREG(info.st_mode):
        return f"not a regular file ({file_kind(info.st_mode)})"
    if info.st_size != size:
        return f"{info.st_size} bytes, but {size} were recorded when it was written (torn)"
    with path.open("rb") as source:
        head = source.read(HEAD_BYTES)
    if not looks_like_entry(head):
        return "does not start like a zstd or zlib stream"
    return None


BEING_WRITTEN = "being written by a running prewarm (its writer lock is held)"
MISSED_NOTE = ("WARM by size, but a previous run missed it; the next prewarm checks it in "
               "full (and compiles it again if it is corrupt)")


def key_lines(store: LocalStore, key: str) -> dict[str, KeyHistory]:
    """What the usage log records of `key`'s entry, from its lines alone (`records_entry`):
    a warm check of one key must not pay for parsing a log with one line per job ever run."""
    return key_histories(read_usage(store.usage_file, records_entry(key)))


@dataclass(frozen=True)
class WarmCheck:
    """What one look at a key's entry found, with nothing written: whether it is WARM
    (`problem` None), whether it was read in full to decide (an entry nobody recorded, or
    one a job missed), and whether a job missed it since its last full check. The prewarm
    repairs from it (`record_check`, `quarantine`); verify only reports it."""

    key: str
    problem: str | None
    read_in_full: bool = False
    missed: bool = False

    @property
    def warm(self) -> bool:
        return self.problem is None


def warm_check(store: LocalStore, key: str, *, recheck_missed: bool = False) -> WarmCheck:
    """Would the entry of `key` in a local dir load? (`CacheStore.warm_check`: a remote
    dir's store only looks the entry up.) An entry recorded with its size gets the quick
    check (within verify's 10 ms: only this key's lines of the usage log are parsed, once);
    any other is read in full. With `recheck_missed` (the prewarm), an entry a job missed
    although it was there (and that nothing checked in full since) is read in full too, so
    a corrupt entry of the right size is found. An entry whose writer lock is held is being
    written: `BEING_WRITTEN`, never quarantined."""
    if store.in_flight(key):
        return WarmCheck(key, BEING_WRITTEN)
    path = store.entry_path(key)
    histories = key_lines(store, key)
    known = recorded_entries(store, strict=False, key=key, histories=histories).get(key)
    history = histories.get(key)
    missed = history is not None and history.missed
    if known is not None and known.size is not None and not (missed and recheck_missed):
        return WarmCheck(key, quick_problem(path, known.size), missed=missed)
    return WarmCheck(key, entry_problem(path, known.sha256 if known else None),
                     read_in_full=True, missed=missed)


def record_check(store: LocalStore, check: WarmCheck) -> None:
    """The prewarm's record of an entry it read in full and found intact: its checksum and
    size, so the next warm check of it is the quick one, and a job's earlier miss of it is
    settled."""
    if check.read_in_full and check.warm:
        written = store.written_since(check.key, 0.0)
        if written is not None:
            store.append_usage(EntryChecked(check.key, *written))


def check_entries(store: LocalStore, keys: list[str] | None = None,
                  strict: bool = True) -> list[IntegrityCheck]:
    """Check the given keys (default: every entry in the dir); `strict` as in
    `recorded_entries`. An entry being written (its writer lock held) is left alone."""
    recorded = recorded_entries(store, strict)
    if keys is None:
        keys = [entry.key for entry in scan(store, histories={})]
    checks = []
    for key in keys:
        if store.in_flight(key):
            log.info("%s: %s; not checking it now", key, BEING_WRITTEN)
            continue
        path = store.entry_path(key)
        known = recorded.get(key)
        problem = entry_problem(path, known.sha256 if known else None)
        if problem == "missing":
            continue
        checks.append(IntegrityCheck(key=key, size=path.lstat().st_size if path.exists() else 0,
                            problem=problem, checksum_known=known is not None))
    return checks


def quarantine(store: LocalStore, check: IntegrityCheck, say: bool = True) -> Path | None:
    """Move a bad entry aside (with a note of why), so JAX compiles and writes it afresh;
    said in a line unless the caller says it (`say`)."""
    folder = make_dir(store.quarantine_dir)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    with store.jax_lock():
        # A second quarantine of the key within the second (an entry replaced and found bad
        # again) gets a name of its own: the first one's copy and note stay.
        destination = next(candidate for n in itertools.count(1) if not (candidate := folder / (
            f"{check.key}-cache.{stamp}" + (f"-{n}" if n > 1 else ""))).exists())
        if not remove_entry(store, check.key, destination):
            return None
    atomic_write(destination.with_suffix(destination.suffix + ".json"),
                 json.dumps({"key": check.key, "problem": check.problem, "time": time.time()})
                 + "\n", modes_in(folder)[0], what="the note of why the entry was quarantined")
    store.append_usage(EntryQuarantined(check.key, check.problem))
    if say:
        log.warning("quarantined %s: %s (moved to %s)", check.key, check.problem, destination)
    return destination


def refuse_read(store: LocalStore, key: str, repair: bool) -> bool:
    """Right before JAX reads the entry of `key` (`jaxwarm.jaxkey.entryload.guard_reads`),
    after every check of the launch and the job's start: is what is there now still a
    regular file within MAX_ENTRY_BYTES, opened without following a link or blocking
    (`open_entry`)? When it is not (a link to /dev/zero, a FIFO, planted since), it is
    quarantined (`repair`; a verify writes nothing into the cache dir and leaves it) and
    the answer is True: JAX's lookup is a miss, and it compiles. Said in one line."""
    path = store.entry_path(key)
    try:
        with open_entry(path):
            return False
    except FileNotFoundError:
        return False  # JAX's own miss
    except NotAnEntry as exc:
        problem = str(exc)
    moved = quarantine(store, IntegrityCheck(key, 0, problem, False), say=False) \
        if repair else None
    log.warning("jaxwarm: %s: %s, put there since the job's checks; %s, and JAX's lookup of "
                "it is a miss (it compiles instead)", path, problem,
                f"quarantined (moved to {moved})" if moved else "not read")
    return True


def check_and_quarantine(store: LocalStore, keys: list[str] | None = None,
                         strict: bool = True, repair: bool = True
                         ) -> tuple[list[IntegrityCheck], float]:
    """Check entries and (with `repair`) quarantine the bad ones; returns the checks and the
    seconds it took."""
    start = time.perf_counter()
    checks = check_entries(store, keys, strict)
    for check in checks:
        if repair and not check.ok:
            quarantine(store, check)
    return checks, time.perf_counter() - start


# The most entry bytes a `--prewarm auto` launch reads in full before it goes without its
# prewarm job: a few seconds of reading, against a prewarm job's start, imports and lowering
# (on SLURM, and its queue wait), which would check no more than the quick check does.
FULL_CHECK_BYTES = 2 << 30


@dataclass(frozen=True)
class Relied:
    """What a launch about to go without its prewarm job found of the entries it relies on:
    `problem` ("entry K: why") for the first that would not load, None when all pass;
    `full` whether they were read in full (checksums), else only quick-checked."""

    problem: str | None
    full: bool
    size: int
    seconds: float

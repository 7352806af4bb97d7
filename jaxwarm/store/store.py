"""`open_store`, and `LocalStore`: a cache dir on a file system this process opens.

A command or a job opens its cache dir once (`open_store`) and asks the store, never the
path (`jaxwarm.store.cachestore.CacheStore`: what both kinds answer). A `LocalStore` holds
JAX's entries and, beside them, jaxwarm's records, every change under the lock its readers
take. Where each of its files is, it says once, when it is opened (`manifest_file`,
`usage_file`, ...), and the operations of this package's modules (`entries`, `integrity`,
`prune`, `staging`, `bundle`, `security`, and the one-file modules `manifest`, `usage`,
`prewarms`) work through it: none rebuilds a path from the dir's name.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from jaxwarm.core.config import CacheConfig, Config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import atomic_write, canonical_path, is_held, locked, make_dir, modes_in
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import PrewarmDecision, PrewarmRecord, UsageRecord
from jaxwarm.core.rundir import prewarm_decision_path
from jaxwarm.core.words import plural
from jaxwarm.jaxkey.entryformat import ATIME_SUFFIX, CACHE_SUFFIX, JAX_LOCK, encode_atime
from jaxwarm.jaxkey.versions import installed
from jaxwarm.store import bundle, entries, integrity, manifest, prewarms, prune, staging, usage
from jaxwarm.store.bundle import BundleMeta
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.entries import QUARANTINE_DIR, WRITER_LOCKS, Entry, open_entry, sha256_file
from jaxwarm.store.integrity import BEING_WRITTEN, IntegrityCheck, Recorded, WarmCheck
from jaxwarm.store.manifest import MANIFEST_NAME, Manifest, ManifestEntry
from jaxwarm.store.prewarms import PREWARMS_NAME
from jaxwarm.store.remotestore import RemoteStore
from jaxwarm.store.security import (
    DirIdentity,
    check_cache_dir,
    prepare_cache_dir,
    recheck_cache_dir,
    share_owned_subdirs,
)
from jaxwarm.store.staging import Staged
from jaxwarm.store.usage import USAGE_LOG, KeyHistory

log = logging.getLogger(__name__)

# A second prewarm of the same key waits while the first compiles it: as long as a big
# compile takes, and no longer.
COMPILE_LOCK_TIMEOUT_S = 3 * 3600.0


def open_store(cache_dir: str) -> CacheStore:
    """The store of a cache dir as a config names it: remote for a URL (gs://, s3://),
    local for a path. The one place that tells the two kinds apart."""
    return RemoteStore(cache_dir) if "://" in cache_dir else LocalStore(cache_dir)


class LocalStore(CacheStore):
    """A cache dir on a file system this process opens: JAX's entries and jaxwarm's records
    beside them, every change under the lock its readers take (see `entries`)."""

    def __init__(self, cache_dir: str | Path) -> None:
        super().__init__(str(cache_dir))
        self.path = Path(cache_dir)
        # jaxwarm's files beside the entries, named once for every question asked of them.
        self.manifest_file = self.path / MANIFEST_NAME
        self.usage_file = self.path / USAGE_LOG
        self.prewarms_file = self.path / PREWARMS_NAME
        self.quarantine_dir = self.path / QUARANTINE_DIR
        self.locks_dir = self.path / WRITER_LOCKS
        # JAX's own lock (a `filelock`): with a size cap it reads, writes and evicts under it.
        self.jax_lock_file = self.path / JAX_LOCK
        # The usage log as this store last parsed it (`usage`); None: read it at next use.
        self._usage: list[UsageRecord] | None = None

    def resolved(self, base: Path | None = None) -> str:
        return canonical_path(self.dir, base)

    def xla_caches(self, setting: str) -> str:
        return setting

    # -- the dir itself: who may write it (`security`) -------------------------------------

    def check(self, cache: CacheConfig, source: str, *, key: str = "cache.dir",
              writing: bool = False, base: Path | None = None) -> DirIdentity | None:
        path = self.path.expanduser()
        return check_cache_dir(path if path.is_absolute() else (base or Path.cwd()) / path,
                               cache, source, writing=writing, key=key)

    def prepare(self, cache: CacheConfig, source: str,
                key: str = "cache.dir") -> DirIdentity | None:
        return prepare_cache_dir(self.path, cache, source, key=key)

    def recheck(self, cache: CacheConfig, source: str, checked: DirIdentity | None,
                key: str = "cache.dir") -> DirIdentity | None:
        return recheck_cache_dir(self.path, cache, source, checked, key=key)

    # -- entries -----------------------------------------------------------------------------

    def entry_path(self, key: str) -> Path:
        """Where JAX's file cache keeps the executable of `key`."""
        return self.path / f"{key}{CACHE_SUFFIX}"

    def atime_path(self, key: str) -> Path:
        """JAX's record of the last use of `key` (size-capped caches only)."""
        return self.path / f"{key}{ATIME_SUFFIX}"

    def writer_lock_path(self, key: str) -> Path:
        return self.locks_dir / f"{key}.lock"

    def jax_lock(self) -> AbstractContextManager[None]:
        """JAX's own cache lock: held, no JAX process with a size cap reads, writes or
        evicts, so an entry and its atime file are removed or added together."""
        return locked(self.jax_lock_file, "JAX cache")

    def in_flight(self, key: str) -> bool:
        """Written (or being written) by a running prewarm that has not recorded it yet."""
        return is_held(self.writer_lock_path(key))

    def has_entry(self, key: str) -> bool:
        return self.entry_path(key).is_file()

    def entry_size(self, key: str) -> int | None:
        try:
            return self.entry_path(key).stat().st_size
        except FileNotFoundError:
            return None

    def read_entry(self, key: str, admit: Callable[[int], bool]) -> bytes | None:
        with open_entry(self.entry_path(key)) as source:
            if not admit(os.fstat(source.fileno()).st_size):
                return None
            return source.read()

    def entry_problem(self, key: str, expected_sha256: str | None = None) -> str | None:
        return integrity.entry_problem(self.entry_path(key), expected_sha256)

    def written_since(self, key: str, since: float) -> tuple[str, int] | None:
        """An older file under the key is one this process failed to load, not one it wrote."""
        path = self.entry_path(key)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        if stat.st_mtime < since:
            return None
        return sha256_file(path), stat.st_size

    def load_problem(self, key: str, since: float, records: CacheStore) -> str | None:
        """An entry written before `since` and missed anyway: JAX could not load it (JAX
        never replaces an entry), so its full read says why; one that reads intact now was
        most likely replaced while the job ran."""
        try:
            if self.entry_path(key).stat().st_mtime >= since:
                return None  # written by this job: not one it was offered
        except FileNotFoundError:
            return None
        known = records.recorded(strict=False, key=key)
        return self.entry_problem(key, known[key].sha256 if key in known else None) or \
            "it reads intact now (was it replaced while this job ran?)"

    def mark_used(self, key: str) -> None:
        """As JAX's own read does, under JAX's lock, so that an entry loaded another way
        (`cache.prefetch`) keeps its place in the eviction order."""
        with self.jax_lock():
            if self.entry_path(key).exists():
                atomic_write(self.atime_path(key), encode_atime(time.time_ns()),
                             modes_in(self.path)[0])

    def share_with_group(self) -> list[Path]:
        return share_owned_subdirs(self.path)

    def ensure_atime_files(self) -> int:
        return entries.ensure_atime_files(self)

    def writer_lock(self, key: str | None) -> AbstractContextManager[None]:
        if key is None:
            return nullcontext()
        path = self.writer_lock_path(key)
        make_dir(path.parent)
        return locked(path, f"compile of {key}", COMPILE_LOCK_TIMEOUT_S)

    def scan(self, histories: dict[str, KeyHistory] | None = None) -> list[Entry]:
        return entries.scan(self, self.histories() if histories is None else histories)

    def quarantined(self) -> int:
        folder = self.quarantine_dir
        return len(list(folder.glob("*-cache.*[0-9]"))) if folder.is_dir() else 0

    # -- integrity -------------------------------------------------------------------------

    def warm_check(self, key: str, *, recheck_missed: bool = False) -> WarmCheck:
        return integrity.warm_check(self, key, recheck_missed=recheck_missed)

    def recorded(self, strict: bool = True, key: str | None = None) -> dict[str, Recorded]:
        """With `key`, from that key's lines of the usage log alone."""
        return integrity.recorded_entries(self, strict, key)

    def record_check(self, check: WarmCheck) -> None:
        integrity.record_check(self, check)

    def quarantine(self, check: IntegrityCheck) -> Path | None:
        return integrity.quarantine(self, check)

    def refuse_read(self, key: str, repair: bool) -> bool:
        return integrity.refuse_read(self, key, repair)

    def check_and_quarantine(self, keys: list[str] | None = None, strict: bool = True,
                             repair: bool = True) -> tuple[list[IntegrityCheck], float]:
        return integrity.check_and_quarantine(self, keys, strict, repair)

    def prune(self, *, max_bytes: int | None = None, older_than_s: float | None = None,
              include_pinned: bool = False) -> list[Entry]:
        return prune.prune(self, prune.Pruning(max_bytes, older_than_s), include_pinned)

    # -- the manifest, the usage log, the record of completed prewarms ---------------------

    def manifest(self, strict: bool = True, key: str | None = None) -> Manifest:
        return manifest.read_manifest(self.manifest_file, strict, key)

    def record_entries(self, recorded: list[ManifestEntry]) -> None:
        manifest.record_entries(self.manifest_file, recorded)

    def uses_entries(self, used: list[ManifestEntry], run: str) -> None:
        manifest.uses_entries(self.manifest_file, used, run)

    def records_where(self) -> str:
        return f"manifest: {self.manifest_file}"

    def usage(self) -> list[UsageRecord]:
        """Parsed once however many steps of a command ask (a log with one line per job
        ever run is the biggest file jaxwarm reads); read afresh after this store wrote to
        it. A snapshot: lines other processes append meanwhile are seen by the next command."""
        if self._usage is None:
            self._usage = usage.read_usage(self.usage_file)
        return self._usage

    def histories(self) -> dict[str, KeyHistory]:
        return usage.key_histories(self.usage())

    def append_usage(self, record: UsageRecord) -> None:
        with self._writing():
            usage.append_usage(self.usage_file, record)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Around anything that appends to the usage log: the snapshot is stale after."""
        try:
            yield
        finally:
            self._usage = None

    def prewarms(self) -> dict[str, PrewarmRecord]:
        return prewarms.read_prewarms(self.prewarms_file)

    def record_prewarm(self, record: PrewarmRecord) -> None:
        prewarms.record_prewarm(self.prewarms_file, record)

    def forget_prewarm(self, digest: str, key: str, why: str) -> None:
        prewarms.forget_prewarm(self.prewarms_file, digest, key, why)

    # -- the prewarm job's books ---------------------------------------------------------

    def repair(self, checks: list[WarmCheck], warm: list[ManifestEntry], run: str) -> None:
        """A torn or corrupt entry is quarantined (JAX never replaces one), and so is one a
        job missed that the full check now finds corrupt; one being written by another
        prewarm is left alone (its compile waits for that writer's lock, then loads it). An
        entry read in full and found intact has its check recorded (the next check is the
        quick one); a WARM one no manifest records (its prewarm was killed before recording
        it) is pinned now, with its checksum, and one another run recorded is recorded as
        used by `run` too (and, where that record predates `cache.prefetch`, with what
        loading it takes, from `warm`)."""
        for check in checks:
            if check.problem not in (None, "missing", BEING_WRITTEN):
                self.quarantine(IntegrityCheck(check.key, 0, check.problem,
                                               checksum_known=False))
            self.record_check(check)
        recorded = self.manifest(strict=False)
        found = [_written(entry, self.written_since(entry.key, 0.0))
                 for entry in warm if entry.key not in recorded]
        if found:
            self.record_entries(found)
        known = {entry.key: _with_load(recorded[entry.key], entry)
                 for entry in warm if entry.key in recorded}
        refreshed = [entry for key, entry in known.items() if entry is not recorded[key]]
        if refreshed:
            self.record_entries(refreshed)
        self.uses_entries(list(known.values()), run)

    def record_compile(self, entry: ManifestEntry, since: float,
                       not_stored: bool = False) -> tuple[tuple[str, int] | None, str | None]:
        """Recorded at once, not at the prewarm's end, so that no prune or crash finds the
        entry unrecorded; a torn one is quarantined (and recorded as not written). Nothing
        there and nothing stored (`not_stored`): nothing to record, and no failure."""
        written = self.written_since(entry.key, since)
        failure: str | None
        if written is None:
            if not_stored:
                return None, None
            failure = "JAX did not write it (a full disk or a read-only cache dir?)"
        else:
            failure = self.entry_problem(entry.key)
            if failure is not None:
                self.quarantine(IntegrityCheck(entry.key, written[1], failure, True))
                written = None
        try:
            self.record_entries([_written(entry, written)])
        except OSError as exc:
            return written, failure or f"the manifest could not be written ({exc.strerror})"
        return written, failure

    def record_fingerprint(self, run_dir: Path, run: str, keys: list[str],
                           reads: dict[str, str]) -> None:
        """Only the keys whose entries are here are promised. Not when this job runs
        another jax than the launcher saw (its fingerprint would promise keys this job did
        not make), nor for a job script submitted by hand (no launch computed one)."""
        decision = read_record(PrewarmDecision, prewarm_decision_path(run_dir))
        if decision is None or decision.fingerprint is None:
            return
        found = decision.fingerprint
        here = installed()
        seen = (found.parts.get("jax"), found.parts.get("jaxlib"))
        if here is None or (here.jax, here.jaxlib) != seen:
            log.warning("this job runs jax %s / jaxlib %s but the launcher saw %s / %s: no "
                        "fingerprint recorded, so every launch runs its prewarm job",
                        here and here.jax, here and here.jaxlib, *seen)
            return
        kept = [key for key in keys if self.has_entry(key)]
        self.record_prewarm(PrewarmRecord(dataclasses.replace(found, reads=reads), kept, run))
        log.info("fingerprint %s recorded with %d %s: a launch with the same fingerprint "
                 "goes without a prewarm job", found.digest, len(kept),
                 plural(len(kept), "entry", "entries"))

    # -- node-local staging (`staging`) and bundles (`bundle`) --------------------------------

    def stage_into(self, stage: str, run: str, max_size: int = -1) -> Staged:
        return staging.stage_entries(self, LocalStore(stage), run, max_size)

    def publish_from(self, stage: str, since: float,
                     max_size: int = -1) -> dict[str, tuple[str, int]]:
        return staging.publish_entries(LocalStore(stage), self, since, max_size)

    def export_bundle(self, config: Config, output: Path, every: bool = False) -> BundleMeta:
        if every:
            keys = [entry.key for entry in self.scan(histories={})]
        else:
            keys = [e.key for e in self.run_entries(config.run.name, strict=True)
                    if self.has_entry(e.key)]
        if not keys:
            raise ConfigError(f"{config.source}: run.name: no prewarmed entries of run "
                              f"{config.run.name!r} in {self.dir}; prewarm first or pass --all")
        return bundle.export_bundle(self, config, output, keys)

    def import_bundle(self, source: Path, config: Config,
                      max_bytes: int) -> tuple[list[str], list[str]]:
        return bundle.import_bundle(source, self, config, max_bytes)


def _written(entry: ManifestEntry, written: tuple[str, int] | None) -> ManifestEntry:
    """A manifest entry with the (sha256, size) of its file as written (None: not written)."""
    return dataclasses.replace(entry, written=written is not None,
                               sha256=written[0] if written else None,
                               size=written[1] if written else None)


def _with_load(recorded: ManifestEntry, found: ManifestEntry) -> ManifestEntry:
    """A recorded entry with what loading it takes (`cache.prefetch`), from this prewarm's
    probe of the same key (`found`), where an older prewarm did not record it; else the
    entry as it is."""
    if recorded.compile_options is not None or found.compile_options is None:
        return recorded
    return dataclasses.replace(recorded, compile_options=found.compile_options,
                               device_ids=list(found.device_ids))

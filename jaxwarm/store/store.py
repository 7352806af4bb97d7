"""`CacheStore`: one object owns a cache dir, and is the one place that knows what kind it is.

As JAX's own cache has one object per dir (`LRUCache(path, max_size)` behind its
`CacheInterface`), a jaxwarm command or job opens its cache dir once (`open_store`) and
asks the store, never the path, what is there. Two kinds sit behind the one interface:

- `LocalStore`, a dir on a local or shared (mounted) file system: JAX's entries, and beside
  them what jaxwarm keeps there (the prewarm manifest, the usage log, the record of
  completed prewarms, writer locks, the quarantine), all under file locks;
- `RemoteStore`, a gs:// or s3:// URL: only JAX's entries, which JAX writes through
  etils.epath. jaxwarm's own records need a local file lock, so a remote dir has none: its
  manifest and prewarm records read as empty, and `local` is None.

A caller that needs the records (prune, verify, the prewarm's bookkeeping) asks for
`store.local` and does without when it is None; everything both kinds answer (the warm
check, an entry's size, the manifest as far as there is one) is asked of the store itself.
The local operations live in the modules of this package (`entries`, `manifest`, `usage`,
`integrity`, `prewarms`, `security`, `prune`, `staging`), over the dir's path; the store
binds them to its dir.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from jaxwarm.core.config import CacheConfig
from jaxwarm.core.files import canonical_path, locked, make_dir
from jaxwarm.core.records import PrewarmRecord, UsageRecord
from jaxwarm.jaxkey.entryformat import CACHE_SUFFIX
from jaxwarm.store.entries import (
    Entry,
    ensure_atime_files,
    entry_path,
    mark_used,
    scan,
    writer_lock_path,
    written_since,
)
from jaxwarm.store.integrity import (
    IntegrityCheck,
    Recorded,
    Relied,
    WarmCheck,
    check_and_quarantine,
    check_relied,
    entry_problem,
    quarantine,
    record_check,
    recorded_entries,
    refuse_read,
    warm_check,
)
from jaxwarm.store.manifest import (
    ManifestEntry,
    latest_for_run,
    manifest_path,
    read_manifest,
    record_entries,
    uses_entries,
)
from jaxwarm.store.prewarms import forget_prewarm, read_prewarms, record_prewarm
from jaxwarm.store.prune import prune
from jaxwarm.store.security import (
    DirIdentity,
    check_cache_dir,
    prepare_cache_dir,
    recheck_cache_dir,
)
from jaxwarm.store.staging import Staged, publish_entries, stage_entries
from jaxwarm.store.usage import KeyHistory, append_usage, key_histories, read_usage

# A second prewarm of the same key waits while the first compiles it: as long as a big
# compile takes, and no longer.
COMPILE_LOCK_TIMEOUT_S = 3 * 3600.0


def open_store(cache_dir: str) -> CacheStore:
    """The store of a cache dir as a config names it: remote for a URL (gs://, s3://),
    local for a path."""
    return RemoteStore(cache_dir) if "://" in cache_dir else LocalStore(cache_dir)


class CacheStore(ABC):
    """What every cache dir answers, local or remote."""

    def __init__(self, cache_dir: str) -> None:
        self.dir = cache_dir

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dir!r})"

    @property
    @abstractmethod
    def local(self) -> LocalStore | None:
        """This store where jaxwarm keeps its records beside the entries; None for a remote
        dir, which holds only JAX's entries."""

    @abstractmethod
    def resolved(self, base: Path | None = None) -> str:
        """The dir as every job must see it (`environment.resolve_paths`)."""

    @abstractmethod
    def xla_caches(self, setting: str) -> str:
        """`jax_persistent_cache_enable_xla_caches` for this dir under the config's
        `setting`: XLA's own sub-caches (GPU autotune results) write with plain file I/O."""

    @abstractmethod
    def entry_size(self, key: str) -> int | None:
        """The size of the entry of `key` as this process sees it now; None when it has none."""

    @abstractmethod
    def warm_check(self, key: str, *, recheck_missed: bool = False) -> WarmCheck:
        """Would the entry of `key` load? The one check behind the warm decisions of the
        prewarm and the verify job (`jaxwarm.job.warm.judge`); it reads, never writes."""

    @abstractmethod
    def manifest(self, strict: bool = True, key: str | None = None) -> dict[str, ManifestEntry]:
        """The prewarm manifest's entries by key (`store.manifest.read_manifest`)."""

    def run_entries(self, run: str, strict: bool = False) -> list[ManifestEntry]:
        """What run `run`'s next job expects to load (`manifest.latest_for_run`)."""
        return latest_for_run(self.manifest(strict), run)

    @abstractmethod
    def prewarms(self) -> dict[str, PrewarmRecord]:
        """The completed prewarms by fingerprint digest (`store.prewarms`)."""


class RemoteStore(CacheStore):
    """A gs:// or s3:// cache dir, read through etils.epath as JAX reads it; JAX writes the
    entries, jaxwarm writes nothing there."""

    @property
    def local(self) -> None:
        return None

    def resolved(self, base: Path | None = None) -> str:
        return self.dir

    def xla_caches(self, setting: str) -> str:
        return "none"  # only JAX's entries, written through etils/fsspec, go there

    def _entry(self, key: str) -> Any:  # an etils.epath.Path (etils ships no types)
        from etils import epath
        return epath.Path(self.dir) / f"{key}{CACHE_SUFFIX}"

    def entry_size(self, key: str) -> int | None:
        try:
            return int(self._entry(key).stat().length)
        except FileNotFoundError:
            return None

    def warm_check(self, key: str, *, recheck_missed: bool = False) -> WarmCheck:
        """Whether the entry is there: no record of its checksum or size is kept here."""
        return WarmCheck(key, None if self._entry(key).exists() else "missing")

    def manifest(self, strict: bool = True, key: str | None = None) -> dict[str, ManifestEntry]:
        return {}

    def prewarms(self) -> dict[str, PrewarmRecord]:
        return {}


class LocalStore(CacheStore):
    """A cache dir on a file system this process opens: JAX's entries and jaxwarm's records
    beside them, every change under the lock its readers take (see `entries`)."""

    def __init__(self, cache_dir: str | Path) -> None:
        super().__init__(str(cache_dir))
        self.path = Path(cache_dir)
        # The usage log as this store last parsed it (`usage`); None: read it at next use.
        self._usage: list[UsageRecord] | None = None

    @property
    def local(self) -> LocalStore:
        return self

    def resolved(self, base: Path | None = None) -> str:
        return canonical_path(self.dir, base)

    def xla_caches(self, setting: str) -> str:
        return setting

    # -- the dir itself: who may write it (`security`) -------------------------------------

    def check(self, cache: CacheConfig, source: str, *, key: str = "cache.dir",
              writing: bool = False, base: Path | None = None) -> DirIdentity | None:
        """`security.check_cache_dir` of the dir as written, relative to `base` (default the
        working dir) when it is not absolute."""
        path = self.path.expanduser()
        return check_cache_dir(path if path.is_absolute() else
                                        (base or Path.cwd()) / path,
                                        cache, source, writing=writing, key=key)

    def prepare(self, cache: CacheConfig, source: str,
                key: str = "cache.dir") -> DirIdentity | None:
        return prepare_cache_dir(self.path, cache, source, key=key)

    def recheck(self, cache: CacheConfig, source: str, checked: DirIdentity | None,
                key: str = "cache.dir") -> DirIdentity | None:
        return recheck_cache_dir(self.path, cache, source, checked, key=key)

    # -- entries -----------------------------------------------------------------------------

    def entry_path(self, key: str) -> Path:
        return entry_path(self.path, key)

    def has_entry(self, key: str) -> bool:
        return self.entry_path(key).exists()

    def entry_size(self, key: str) -> int | None:
        try:
            return self.entry_path(key).stat().st_size
        except FileNotFoundError:
            return None

    def scan(self, histories: dict[str, KeyHistory] | None = None) -> list[Entry]:
        """Every entry, oldest use first (`entries.scan`); `histories={}` when the order
        does not matter, which reads no usage log."""
        return scan(self.path, self.histories() if histories is None else histories)

    def written_since(self, key: str, since: float) -> tuple[str, int] | None:
        return written_since(self.path, key, since)

    def mark_used(self, key: str) -> None:
        mark_used(self.path, key)

    def ensure_atime_files(self) -> int:
        return ensure_atime_files(self.path)

    def writer_lock(self, key: str | None) -> AbstractContextManager[None]:
        """Held by process 0 of a prewarm while it compiles (and JAX writes) `key`, until
        the manifest records it: prune spares an entry under a held lock."""
        if key is None:
            return nullcontext()
        path = writer_lock_path(self.path, key)
        make_dir(path.parent)
        return locked(path, f"compile of {key}", COMPILE_LOCK_TIMEOUT_S)

    # -- integrity -------------------------------------------------------------------------

    def refuse_read(self, key: str, repair: bool) -> bool:
        """Whether JAX must not read the entry of `key` now (`integrity.refuse_read`)."""
        with self._writing():
            return refuse_read(self.path, key, repair)

    def warm_check(self, key: str, *, recheck_missed: bool = False) -> WarmCheck:
        return warm_check(self.path, key, recheck_missed=recheck_missed)

    def recorded(self, strict: bool = True, key: str | None = None) -> dict[str, Recorded]:
        """Checksum and size per key (`integrity.recorded_entries`); with `key`, from that
        key's lines of the usage log alone."""
        return recorded_entries(self.path, strict, key,
                                histories=None if key is not None else self.histories())

    def entry_problem(self, key: str, expected_sha256: str | None = None) -> str | None:
        """Why the entry of `key` cannot be loaded safely, read in full; None: intact."""
        return entry_problem(self.entry_path(key), expected_sha256)

    def record_check(self, check: WarmCheck) -> None:
        with self._writing():
            record_check(self.path, check)

    def quarantine(self, check: IntegrityCheck) -> Path | None:
        with self._writing():
            return quarantine(self.path, check)

    def check_and_quarantine(self, keys: list[str] | None = None, strict: bool = True,
                             repair: bool = True) -> tuple[list[IntegrityCheck], float]:
        checks, seconds = check_and_quarantine(self.path, keys, strict, repair,
                                               self.histories())
        if repair and not all(check.ok for check in checks):
            self._usage = None  # a quarantine was logged
        return checks, seconds

    def check_relied(self, keys: list[str], full_check: bool) -> Relied:
        relied = check_relied(self.path, keys, full_check, self.histories())
        if relied.full and relied.problem is not None:
            self._usage = None  # a quarantine was logged
        return relied

    def prune(self, *, max_bytes: int | None = None, older_than_s: float | None = None,
              include_pinned: bool = False) -> list[Entry]:
        with self._writing():
            return prune(self.path, max_bytes=max_bytes, older_than_s=older_than_s,
                         include_pinned=include_pinned, histories=self.histories())

    # -- the manifest, the usage log, the record of completed prewarms ---------------------

    def manifest(self, strict: bool = True, key: str | None = None) -> dict[str, ManifestEntry]:
        return read_manifest(self.path, strict, key)

    def manifest_path(self) -> Path:
        return manifest_path(self.path)

    def record_entries(self, recorded: list[ManifestEntry]) -> None:
        record_entries(self.path, recorded)

    def uses_entries(self, used: list[ManifestEntry], run: str) -> None:
        uses_entries(self.path, used, run)

    def usage(self) -> list[UsageRecord]:
        """The whole usage log, parsed once however many steps of a command ask (a log
        with one line per job ever run is the biggest file jaxwarm reads); read afresh after
        this store wrote to it. A snapshot: lines other processes append meanwhile are seen
        by the next command."""
        if self._usage is None:
            self._usage = read_usage(self.path)
        return self._usage

    def histories(self) -> dict[str, KeyHistory]:
        """What the usage log says of each key (`usage.key_histories`)."""
        return key_histories(self.usage())

    def append_usage(self, record: UsageRecord) -> None:
        with self._writing():
            append_usage(self.path, record)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Around anything that may append to the usage log: the snapshot is stale after."""
        try:
            yield
        finally:
            self._usage = None

    def prewarms(self) -> dict[str, PrewarmRecord]:
        return read_prewarms(self.path)

    def record_prewarm(self, record: PrewarmRecord) -> None:
        record_prewarm(self.path, record)

    def forget_prewarm(self, digest: str, key: str, why: str) -> None:
        forget_prewarm(self.path, digest, key, why)

    # -- node-local staging (`staging`) ----------------------------------------------------

    def stage_into(self, stage: str, run: str, max_size: int = -1) -> Staged:
        """Copy run `run`'s entries from this (shared) dir into a node's `stage` dir."""
        return stage_entries(self.dir, stage, run, max_size)

    def publish_from(self, stage: str, since: float,
                     max_size: int = -1) -> dict[str, tuple[str, int]]:
        """Copy the entries a job wrote into its node's `stage` dir into this (shared) dir."""
        return publish_entries(stage, self.dir, since, max_size)

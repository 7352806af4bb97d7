"""`CacheStore`: what every cache dir answers, local or remote, so no caller asks which it holds.

As JAX's own cache has one object per dir (`LRUCache(path, max_size)` behind its
`CacheInterface`, local or remote decided once, in its constructor) and orbax's storage
backends each answer every operation, a jaxwarm command or job opens its cache dir once
(`jaxwarm.store.store.open_store`) and asks the store, never the path, what is there. Two
kinds answer:

- `LocalStore` (`jaxwarm.store.store`), a dir on a local or shared (mounted) file system:
  JAX's entries, and beside them what jaxwarm keeps there (the prewarm manifest, the usage
  log, the record of completed prewarms, writer locks, the quarantine), all under file locks;
- `RemoteStore` (`jaxwarm.store.remotestore`), a gs:// or s3:// URL: only JAX's entries, which
  JAX writes through etils.epath. jaxwarm's records need a local file lock, so a remote dir
  keeps none: its records read as empty, and writing one is a no-op. What a user asks of a
  dir that only a local one can do (list, prune, check every entry, move bundles, stage) is
  refused in one line (`RemoteDirError`).

The questions that read the same on both kinds (a launch's check of the entries it relies
on, the explanation of a miss, a run's entries) are answered here, once, over the
operations each kind defines.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from jaxwarm.core.config import CacheConfig, Config
from jaxwarm.core.errors import UserError
from jaxwarm.core.records import Fingerprint, FunctionRecord, PrewarmRecord, UsageRecord
from jaxwarm.store.bundle import BundleMeta
from jaxwarm.store.entries import Entry
from jaxwarm.store.integrity import (
    FULL_CHECK_BYTES,
    IntegrityCheck,
    Recorded,
    Relied,
    WarmCheck,
)
from jaxwarm.store.manifest import Manifest, ManifestEntry
from jaxwarm.store.misses import MissContext, changed_variables, explain_miss
from jaxwarm.store.security import DirIdentity
from jaxwarm.store.staging import Staged
from jaxwarm.store.usage import KeyHistory


class RemoteDirError(UserError):
    """What only a local or mounted dir can do, asked of a remote one: one line naming the
    dir and the operation."""


class CacheStore(ABC):
    """What every cache dir answers, local or remote."""

    def __init__(self, cache_dir: str) -> None:
        self.dir = cache_dir

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dir!r})"

    # -- the dir itself ----------------------------------------------------------------------

    @abstractmethod
    def resolved(self, base: Path | None = None) -> str:
        """The dir as every job must see it (`jaxwarm.job.start.pinned.resolve_paths`)."""

    @abstractmethod
    def xla_caches(self, setting: str) -> str:
        """`jax_persistent_cache_enable_xla_caches` for this dir under the config's
        `setting`: XLA's own sub-caches (GPU autotune results) write with plain file I/O."""

    @abstractmethod
    def check(self, cache: CacheConfig, source: str, *, key: str = "cache.dir",
              writing: bool = False, base: Path | None = None) -> DirIdentity | None:
        """Refuse a dir others could swap or write (every rank runs what is there), in one
        line naming `source` and `key`; the identity of the dir checked, or None where there
        is none (yet) on this machine. `writing` (a launch): a dir this user cannot write is
        refused too. `base`: what a relative dir is relative to (default the working dir)."""

    @abstractmethod
    def prepare(self, cache: CacheConfig, source: str,
                key: str = "cache.dir") -> DirIdentity | None:
        """`check`, then create the dir with a safe mode where it does not exist."""

    @abstractmethod
    def recheck(self, cache: CacheConfig, source: str, checked: DirIdentity | None,
                key: str = "cache.dir") -> DirIdentity | None:
        """`check` again right before JAX opens the dir, which must still be the one
        `checked` (a dir swapped in between is refused, not loaded from)."""

    # -- entries -----------------------------------------------------------------------------

    @abstractmethod
    def has_entry(self, key: str) -> bool:
        """Whether the entry of `key` is there now."""

    @abstractmethod
    def entry_size(self, key: str) -> int | None:
        """The size of the entry of `key` as this process sees it now; None when it has none."""

    @abstractmethod
    def read_entry(self, key: str, admit: Callable[[int], bool]) -> bytes | None:
        """The bytes of the entry of `key`, read only when `admit` accepts its size (a
        prefetch within its memory cap); None when it does not. Raises FileNotFoundError, or
        `entries.NotAnEntry` for a file jaxwarm will not read."""

    @abstractmethod
    def entry_problem(self, key: str, expected_sha256: str | None = None) -> str | None:
        """Why the entry of `key` cannot be loaded safely, read in full (and compared with
        `expected_sha256` where given); None: intact."""

    @abstractmethod
    def written_since(self, key: str, since: float) -> tuple[str, int] | None:
        """(sha256, size) of the entry of `key` when it was written at or after `since`
        (by this process: what the records keep of it); None otherwise."""

    @abstractmethod
    def load_problem(self, key: str, since: float, records: CacheStore) -> str | None:
        """Why JAX could not load the entry of `key` that was in this dir before `since`
        (read in full, against the checksum `records`, the shared dir, keeps of it); None
        when there was none to load."""

    @abstractmethod
    def mark_used(self, key: str) -> None:
        """What JAX's own read does in a size-capped cache: the entry was used now."""

    @abstractmethod
    def share_with_group(self) -> list[Path]:
        """In a dir shared with its group: what this user made below it that the group
        cannot write (XLA's own sub-cache dirs) made group-writable; the dirs changed."""

    @abstractmethod
    def ensure_atime_files(self) -> int:
        """Every entry with the atime file JAX's eviction needs; how many were added."""

    @abstractmethod
    def writer_lock(self, key: str | None) -> AbstractContextManager[None]:
        """Held by process 0 of a prewarm while it compiles (and JAX writes) `key`, until
        the manifest records it: prune spares an entry under a held lock."""

    @abstractmethod
    def scan(self, histories: dict[str, KeyHistory] | None = None) -> list[Entry]:
        """Every entry, oldest use first; `histories={}` when the order does not matter,
        which reads no usage log."""

    @abstractmethod
    def quarantined(self) -> int:
        """How many entries were moved aside as corrupt."""

    # -- integrity -------------------------------------------------------------------------

    @abstractmethod
    def warm_check(self, key: str, *, recheck_missed: bool = False) -> WarmCheck:
        """Would the entry of `key` load? The one check behind the warm decisions of the
        prewarm and the verify job (`jaxwarm.job.warm.judge`); it reads, never writes."""

    @abstractmethod
    def recorded(self, strict: bool = True, key: str | None = None) -> dict[str, Recorded]:
        """Checksum and size per key, as recorded when jaxwarm saw each entry written."""

    @abstractmethod
    def record_check(self, check: WarmCheck) -> None:
        """The record of an entry a warm check read in full and found intact."""

    @abstractmethod
    def quarantine(self, check: IntegrityCheck) -> Path | None:
        """Move a bad entry aside, so JAX compiles and writes it afresh; where it went."""

    @abstractmethod
    def refuse_read(self, key: str, repair: bool) -> bool:
        """Whether JAX must not read the entry of `key` now, right before its own read: one
        swapped since the checks for a link or a FIFO, said in one line (and, with
        `repair`, quarantined): JAX's lookup is then a miss."""

    @abstractmethod
    def check_and_quarantine(self, keys: list[str] | None = None, strict: bool = True,
                             repair: bool = True) -> tuple[list[IntegrityCheck], float]:
        """Check `keys` (default: every entry) in full and, with `repair`, quarantine the
        bad ones; the checks and the seconds it took."""

    def check_relied(self, keys: list[str], full_check: bool) -> Relied:
        """The check of the entries a recorded prewarm left, before a launch relies on them:
        the quick one for each (missing, being written, torn, missed by a job since), then,
        with `full_check` and at most `FULL_CHECK_BYTES` in all, each read in full against
        the checksum recorded when it was written, a bad one quarantined: an entry corrupted
        without changing its size would otherwise pass, and every job would miss it."""
        start = time.perf_counter()
        size = 0
        for key in keys:
            check = self.warm_check(key)
            problem = "a job missed it; the prewarm checks it in full" if check.warm and \
                check.missed else check.problem
            if problem is None:
                found = self.entry_size(key)
                problem = "missing" if found is None else None
                size += found or 0
            if problem is not None:
                return Relied(f"entry {key}: {problem}", False, size,
                              time.perf_counter() - start)
        if not full_check or size > FULL_CHECK_BYTES:
            return Relied(None, False, size, time.perf_counter() - start)
        checks, _ = self.check_and_quarantine(keys, strict=False)
        bad = next((check for check in checks if not check.ok), None)
        return Relied(None if bad is None else
                      f"entry {bad.key}: {bad.problem} (read in full; quarantined, so the "
                      f"prewarm compiles it again)", True, size, time.perf_counter() - start)

    @abstractmethod
    def prune(self, *, max_bytes: int | None = None, older_than_s: float | None = None,
              include_pinned: bool = False) -> list[Entry]:
        """Least recently used entries out until the rest fit in `max_bytes`, and those
        unused for `older_than_s`; safe while jobs run. What was removed."""

    # -- jaxwarm's records: the manifest, the usage log, the completed prewarms ------------

    @abstractmethod
    def manifest(self, strict: bool = True, key: str | None = None) -> Manifest:
        """The prewarm manifest's entries by key (only `key`'s when given). A broken one
        raises `manifest.ManifestError`, or with `strict=False` reads as empty."""

    def run_entries(self, run: str, strict: bool = False) -> list[ManifestEntry]:
        """What run `run`'s next job expects to load (`Manifest.for_run`)."""
        return self.manifest(strict).for_run(run)

    @abstractmethod
    def record_entries(self, recorded: list[ManifestEntry]) -> None:
        """Add entries to the manifest (a key's earlier users kept)."""

    @abstractmethod
    def uses_entries(self, used: list[ManifestEntry], run: str) -> None:
        """Record that `run` uses these entries (its prewarm found them WARM)."""

    @abstractmethod
    def records_where(self) -> str:
        """Where this dir's records are, as a prewarm's log says it."""

    @abstractmethod
    def usage(self) -> list[UsageRecord]:
        """The whole usage log."""

    @abstractmethod
    def histories(self) -> dict[str, KeyHistory]:
        """What the usage log says of each key (`usage.key_histories`)."""

    @abstractmethod
    def append_usage(self, record: UsageRecord) -> None:
        """One record appended to the usage log."""

    @abstractmethod
    def prewarms(self) -> dict[str, PrewarmRecord]:
        """The completed prewarms by fingerprint digest (`store.prewarms`)."""

    @abstractmethod
    def record_prewarm(self, record: PrewarmRecord) -> None:
        """Add (or renew) the record of a prewarm that completed under its fingerprint."""

    @abstractmethod
    def forget_prewarm(self, digest: str, key: str, why: str) -> None:
        """Drop the record of fingerprint `digest` when it promised `key`, which a job
        launched with that very fingerprint missed (`why`)."""

    # -- the prewarm job's books ---------------------------------------------------------

    @abstractmethod
    def repair(self, checks: list[WarmCheck], warm: list[ManifestEntry], run: str) -> None:
        """What process 0 of the prewarm does with its warm checks (verify never does it):
        bad entries quarantined, full checks recorded, and the `warm` entries (as this
        prewarm would record them) pinned in the manifest and used by `run`."""

    @abstractmethod
    def record_compile(self, entry: ManifestEntry, since: float,
                       not_stored: bool = False) -> tuple[tuple[str, int] | None, str | None]:
        """Right after process 0 of a prewarm compiled `entry.key` (JAX said it did not
        store it: `not_stored`), under its writer lock: the entry JAX wrote since `since`,
        checked and recorded. Its (sha256, size) as recorded, and why it failed (None: it
        did not)."""

    @abstractmethod
    def record_fingerprint(self, run_dir: Path, run: str, keys: list[str],
                           reads: dict[str, str]) -> None:
        """Record that a prewarm of `run` completed under the fingerprint its launch
        computed (in `run_dir`), with the files its step factory read (`reads`) and the
        entries of `keys` it leaves: a later launch with the same fingerprint can go
        without a prewarm job."""

    # -- node-local staging and bundles ----------------------------------------------------

    @abstractmethod
    def stage_into(self, stage: str, run: str, max_size: int = -1) -> Staged:
        """Copy run `run`'s entries from this (shared) dir into a node's `stage` dir."""

    @abstractmethod
    def publish_from(self, stage: str, since: float,
                     max_size: int = -1) -> dict[str, tuple[str, int]]:
        """Copy the entries a job wrote into its node's `stage` dir into this (shared) dir;
        (sha256, size) of each one published."""

    @abstractmethod
    def export_bundle(self, config: Config, output: Path, every: bool = False) -> BundleMeta:
        """Write the entries the config's run needs (`every`: all of them), checked intact,
        to the bundle file `output`; a config none of whose entries are here is refused."""

    @abstractmethod
    def import_bundle(self, source: Path, config: Config,
                      max_bytes: int) -> tuple[list[str], list[str]]:
        """Add the entries of the bundle `source` that the config can hit; (added, already
        present)."""

    # -- why a function missed ----------------------------------------------------------

    def explain_miss(self, missed: FunctionRecord, manifest: dict[str, ManifestEntry],
                     context: MissContext | None = None) -> list[str]:
        """Why the function of the lookup `missed` has no entry in this dir, against the
        prewarm of the same target in `manifest` (this dir's, as the caller read it), where
        it missed (`context`): `jaxwarm.store.misses.explain_miss`."""
        return explain_miss(self, missed, manifest, context or MissContext())

    def changed_variables(self, key: str, now: Fingerprint | None) -> set[str] | None:
        """The key environment variables that differ between the newest recorded prewarm
        that left `key` and the fingerprint `now` (`jaxwarm.store.misses.changed_variables`);
        None where either is unknown (a remote dir records no prewarms)."""
        return changed_variables(self.prewarms(), key, now)

"""`RemoteStore`: a gs:// or s3:// cache dir, read through etils.epath as JAX reads it.

JAX writes the entries there; jaxwarm writes nothing. Its records (the manifest, the usage
log, the completed prewarms, checksums, atime files, writer locks) need a local file lock,
so a remote dir keeps none: they read as empty and writing one is a no-op, which is what a
caller that keeps books (a prewarm, a training job's process 0, a launch's `--prewarm auto`)
needs to go on unchanged. What it answers for real, through epath: whether an entry is there,
its size and bytes, and (read in full) whether it decompresses. What a user asks that only a
local or mounted dir can do (list, prune, check every entry, bundles, staging) is refused in
one line (`RemoteDirError`), not answered as an empty dir.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, NoReturn

from jaxwarm.core.config import CacheConfig, Config
from jaxwarm.core.records import PrewarmRecord, UsageRecord
from jaxwarm.jaxkey.entryformat import CACHE_SUFFIX
from jaxwarm.store.bundle import BundleMeta
from jaxwarm.store.cachestore import CacheStore, RemoteDirError
from jaxwarm.store.entries import Entry
from jaxwarm.store.integrity import IntegrityCheck, Recorded, WarmCheck, stream_problem
from jaxwarm.store.manifest import Manifest, ManifestEntry
from jaxwarm.store.security import DirIdentity
from jaxwarm.store.staging import Staged
from jaxwarm.store.usage import KeyHistory

log = logging.getLogger(__name__)


class RemoteStore(CacheStore):
    """A gs:// or s3:// cache dir: JAX's entries and no records of jaxwarm's."""

    def _refuse(self, what: str) -> NoReturn:
        raise RemoteDirError(f"{self.dir}: {what} needs a local or mounted cache dir (jaxwarm's "
                             f"records there need a file lock); this one is remote, where "
                             f"jaxwarm keeps none")

    def _entry(self, key: str) -> Any:  # an etils.epath.Path (etils ships no types)
        from etils import epath
        return epath.Path(self.dir) / f"{key}{CACHE_SUFFIX}"

    # -- the dir itself: the bucket's own access rules say who may write it -----------------

    def resolved(self, base: Path | None = None) -> str:
        return self.dir

    def xla_caches(self, setting: str) -> str:
        return "none"  # only JAX's entries, written through etils/fsspec, go there

    def check(self, cache: CacheConfig, source: str, *, key: str = "cache.dir",
              writing: bool = False, base: Path | None = None) -> DirIdentity | None:
        """Nothing on this machine to check: who may write a bucket is its access policy."""
        return None

    def prepare(self, cache: CacheConfig, source: str,
                key: str = "cache.dir") -> DirIdentity | None:
        return None  # JAX creates what it writes through epath

    def recheck(self, cache: CacheConfig, source: str, checked: DirIdentity | None,
                key: str = "cache.dir") -> DirIdentity | None:
        return None

    # -- entries -------------------------------------------------------------------------------

    def has_entry(self, key: str) -> bool:
        return bool(self._entry(key).exists())

    def entry_size(self, key: str) -> int | None:
        try:
            return int(self._entry(key).stat().length)
        except FileNotFoundError:
            return None

    def read_entry(self, key: str, admit: Callable[[int], bool]) -> bytes | None:
        entry = self._entry(key)
        if not admit(int(entry.stat().length)):
            return None
        return bytes(entry.read_bytes())

    def entry_problem(self, key: str, expected_sha256: str | None = None) -> str | None:
        """Read in full through epath (a download), as a local entry is read."""
        entry = self._entry(key)
        try:
            size = int(entry.stat().length)
        except FileNotFoundError:
            return "missing"
        with entry.open("rb") as source:
            return stream_problem(source, size, expected_sha256)

    def written_since(self, key: str, since: float) -> tuple[str, int] | None:
        """None: no record keeps a remote entry's checksum, so it is not read back (a
        download of every entry the job wrote)."""
        return None

    def load_problem(self, key: str, since: float, records: CacheStore) -> str | None:
        """None: a missed remote entry is not read back to say why (a download per miss,
        and no checksum on record to compare it with); the miss is reported as a miss."""
        return None

    def mark_used(self, key: str) -> None:
        pass  # jaxwarm writes no atime file into a remote dir

    def ensure_atime_files(self) -> int:
        return 0  # as `mark_used`: JAX keeps its own, through epath

    def share_with_group(self) -> list[Path]:
        return []  # an object store has no file modes: its bucket's access rules decide

    def writer_lock(self, key: str | None) -> AbstractContextManager[None]:
        """No lock: a lock file needs a local file system (no prune here to hold off)."""
        return nullcontext()

    def scan(self, histories: dict[str, KeyHistory] | None = None) -> list[Entry]:
        self._refuse("listing its entries")

    def quarantined(self) -> int:
        return 0  # nothing is moved aside in a remote dir

    # -- integrity: whether an entry is there; no checksum is kept to compare with -----------

    def warm_check(self, key: str, *, recheck_missed: bool = False) -> WarmCheck:
        """Whether the entry is there: no record of its checksum or size is kept here."""
        return WarmCheck(key, None if self.has_entry(key) else "missing")

    def recorded(self, strict: bool = True, key: str | None = None) -> dict[str, Recorded]:
        return {}

    def record_check(self, check: WarmCheck) -> None:
        pass  # no usage log to record it in

    def quarantine(self, check: IntegrityCheck) -> Path | None:
        """None: nothing is moved in a remote dir (its warm check finds no torn entry)."""
        return None

    def refuse_read(self, key: str, repair: bool) -> bool:
        """False: JAX reads a remote entry through epath, a download of what the object
        store holds, with no link or FIFO to plant."""
        return False

    def check_and_quarantine(self, keys: list[str] | None = None, strict: bool = True,
                             repair: bool = True) -> tuple[list[IntegrityCheck], float]:
        """Every entry: refused (a listing); given keys: none checked, as no record says what
        a remote entry should be and nothing is moved there (the job's load checks it)."""
        if keys is None:
            self._refuse("checking every entry")
        return [], 0.0

    def prune(self, *, max_bytes: int | None = None, older_than_s: float | None = None,
              include_pinned: bool = False) -> list[Entry]:
        self._refuse("pruning")

    # -- jaxwarm's records: none kept ---------------------------------------------------------

    def manifest(self, strict: bool = True, key: str | None = None) -> Manifest:
        return Manifest()

    def record_entries(self, recorded: list[ManifestEntry]) -> None:
        pass

    def uses_entries(self, used: list[ManifestEntry], run: str) -> None:
        pass

    def records_where(self) -> str:
        return "no manifest for a remote cache dir (it needs a local file lock)"

    def usage(self) -> list[UsageRecord]:
        return []

    def histories(self) -> dict[str, KeyHistory]:
        return {}

    def append_usage(self, record: UsageRecord) -> None:
        pass

    def prewarms(self) -> dict[str, PrewarmRecord]:
        return {}

    def record_prewarm(self, record: PrewarmRecord) -> None:
        pass

    def forget_prewarm(self, digest: str, key: str, why: str) -> None:
        pass

    # -- the prewarm job's books: nothing to keep them in ------------------------------------

    def repair(self, checks: list[WarmCheck], warm: list[ManifestEntry], run: str) -> None:
        pass

    def record_compile(self, entry: ManifestEntry, since: float,
                       not_stored: bool = False) -> tuple[tuple[str, int] | None, str | None]:
        return None, None  # JAX wrote it through epath; no manifest records it

    def record_fingerprint(self, run_dir: Path, run: str, keys: list[str],
                           reads: dict[str, str]) -> None:
        log.info("no fingerprint recorded in a remote cache dir: every launch with "
                 "--prewarm auto runs its prewarm job")

    # -- staging and bundles: a local or mounted dir's ------------------------------------

    def stage_into(self, stage: str, run: str, max_size: int = -1) -> Staged:
        self._refuse("staging")  # the config refuses cache.stage with a remote dir first

    def publish_from(self, stage: str, since: float,
                     max_size: int = -1) -> dict[str, tuple[str, int]]:
        self._refuse("publishing a node's entries")

    def export_bundle(self, config: Config, output: Path, every: bool = False) -> BundleMeta:
        self._refuse("exporting a bundle")

    def import_bundle(self, source: Path, config: Config,
                      max_bytes: int) -> tuple[list[str], list[str]]:
        self._refuse("importing a bundle")

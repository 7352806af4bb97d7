"""Node-local staging: the run's entries copied from the shared cache dir to a node's own disk.

A 64-rank job whose ranks all load one multi-hundred-MB entry from a shared file system at
the same second is what Marin moved its caches to node-local NVMe for (see docs/cache.md's
"Node-local staging"). With `cache.stage`, one process per node copies the entries the run's
prewarm recorded (the manifest) into the node's stage dir, and the training job's JAX reads
them there; entries the job compiles are published back to the shared dir.

Nothing torn or wrong reaches either dir: every copy is read in blocks, hashed as it is read,
written to a temp file next to its destination, synced, and renamed into place only when its
sha256 and size are the ones recorded when the entry was written (an entry nobody recorded
gets the full decompression check instead). A local copy already there is used again only
when its checksum is right; a partial or corrupt one is replaced.

The key must not change: before jax 0.11 the cache dir's path string is part of every key
(XLA's autotune dir), so staging is refused there unless XLA's sub-caches are off
(`jaxwarm.jaxkey.versions.staging_problem`); from 0.11, or with them off, the stage dir and
the shared dir give the same key, so a node that reads the shared dir instead (its staging
failed) still hits.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from jaxwarm.core.files import LockTimeout, atomic_path, locked, make_dir, modes_in
from jaxwarm.store.entries import NotAnEntry, ensure_atime_files, open_entry, scan, sha256_file
from jaxwarm.store.integrity import Recorded, entry_problem, recorded_entries

if TYPE_CHECKING:
    from jaxwarm.store.store import LocalStore

log = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 20


@dataclass
class Staged:
    """What staging one node did."""

    copied: list[str] = field(default_factory=list)
    # Local copies already there with the recorded checksum (an earlier job on this node).
    reused: list[str] = field(default_factory=list)
    # Entries left out, and why (not in the shared dir, or its checksum is not the recorded
    # one): JAX misses them wherever it looks, and the job compiles them.
    skipped: dict[str, str] = field(default_factory=dict)
    # Local copies that were there but partial or corrupt, replaced by a verified copy.
    replaced: list[str] = field(default_factory=list)
    bytes_copied: int = 0
    seconds: float = 0.0


class _Differs(Exception):
    """A copy whose bytes are not the entry recorded under its key."""


def needed_entries(shared: LocalStore, run: str) -> dict[str, Recorded | None]:
    """The entries the run's next job expects to load (the newest per function its
    prewarms recorded), each with its recorded checksum and size where known."""
    recorded = recorded_entries(shared, strict=False)
    return {entry.key: recorded.get(entry.key) for entry in shared.run_entries(run)}


def copy_entry(source: Path, destination: Path, expected: Recorded | None,
               keep_mtime: bool) -> tuple[str, int]:
    """Copy one entry file so that `destination` is absent, the old file, or the whole
    verified copy; returns its (sha256, size). Raises FileNotFoundError or NotAnEntry for
    the source, _Differs when the bytes are not the recorded entry, OSError on a write."""
    with open_entry(source) as reader:
        info = os.fstat(reader.fileno())
        mode = modes_in(destination.parent)[0]
        with atomic_path(destination, mode, what=f"a copy of {source}") as tmp:
            digest, size = hashlib.sha256(), 0
            with tmp.open("wb") as writer:
                for block in iter(lambda: reader.read(BLOCK_BYTES), b""):
                    digest.update(block)
                    writer.write(block)
                    size += len(block)
            sha256 = digest.hexdigest()
            if expected is not None and (sha256, size) != (expected.sha256,
                                                             expected.size or size):
                raise _Differs("its sha256 differs from the one recorded when it was written")
            if expected is None and (problem := entry_problem(tmp, None)):
                raise _Differs(problem)
            if keep_mtime:  # a staged copy is not an entry this job wrote
                os.utime(tmp, (info.st_atime, info.st_mtime))
    return sha256, size


def local_copy_ok(path: Path, expected: Recorded) -> bool | None:
    """Whether the node's copy is the recorded entry: True, False (partial or corrupt: it is
    replaced), None when there is none."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    return size == (expected.size or size) and sha256_file(path) == expected.sha256


def stage_entries(shared: LocalStore, local: LocalStore, run: str,
                  max_size: int = -1) -> Staged:
    """Copy the run's entries from `shared` into the node's `local` dir (which exists, checked
    like a cache dir: every rank runs what is in it). A write that fails (full disk,
    read-only) raises OSError: the node then reads the shared dir. With a size cap, JAX's
    atime files are added as JAX's eviction needs."""
    start = time.perf_counter()
    staged = Staged()
    for key, expected in needed_entries(shared, run).items():
        target = local.entry_path(key)
        present = local_copy_ok(target, expected) if expected is not None else None
        if present:
            staged.reused.append(key)
            continue
        try:
            staged.bytes_copied += copy_entry(shared.entry_path(key), target, expected,
                                              keep_mtime=True)[1]
        except FileNotFoundError:
            staged.skipped[key] = "not in the shared cache dir"
            continue
        except (NotAnEntry, _Differs) as exc:
            staged.skipped[key] = f"the shared entry is not loadable: {exc}"
            continue
        (staged.replaced if present is False else staged.copied).append(key)
    if max_size != -1:
        ensure_atime_files(local)
    staged.seconds = time.perf_counter() - start
    return staged


def publish_entries(local: LocalStore, shared: LocalStore, since: float,
                    max_size: int = -1) -> dict[str, tuple[str, int]]:
    """Copy the entries this job wrote in its stage dir (those modified at or after `since`)
    into the shared dir, each under its writer lock and never over an entry already there;
    returns (sha256, size) of each one published, for the usage log. An entry whose writer
    lock a prewarm holds is left to that prewarm."""
    published: dict[str, tuple[str, int]] = {}
    for entry in scan(local, histories={}):
        target = shared.entry_path(entry.key)
        if entry.created < since or target.exists():
            continue
        lock = shared.writer_lock_path(entry.key)
        make_dir(lock.parent)
        try:
            with locked(lock, f"publish of {entry.key}", timeout_s=0):
                if target.exists():
                    continue
                published[entry.key] = copy_entry(entry.path, target, None, keep_mtime=False)
        except LockTimeout:
            log.info("%s: a prewarm is writing it into %s; not publishing this job's copy",
                     entry.key, shared.dir)
        except _Differs as exc:
            log.warning("%s: not published, the job's own copy in %s is not loadable: %s",
                        entry.key, local.dir, exc)
    if published and max_size != -1:
        ensure_atime_files(shared)
    return published

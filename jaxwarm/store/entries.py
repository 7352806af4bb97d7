"""Entries of a JAX cache dir: where they are, what is there, and removing one safely.

JAX keeps one file per executable, `<key>-cache`, where the key is `<module name>-<sha256>`.
With `cache.max_size` set it also keeps `<key>-atime` (8-byte little-endian ns of the last
use) and serializes every read, write and eviction on `<dir>/.lockfile` (a `filelock`). Every
removal here follows that protocol: under the same lock, the `-cache` file and its `-atime`
file go together, so a concurrent JAX process never finds one without the other.

jaxwarm adds, next to the entries: the prewarm manifest (`jaxwarm.store.manifest`), the
usage log (`jaxwarm.store.usage`), and `jaxwarm-quarantine/` for bad entries. Where each file
is, a `LocalStore` says (its paths are built once, when it is opened); the operations here
take the store.
"""

from __future__ import annotations

import hashlib
import logging
import re
import stat as stat_module
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from jaxwarm.core.files import (
    RefusedFile,
    atomic_write,
    file_kind,
    modes_in,
    open_regular,
    read_capped,
)
from jaxwarm.core.words import plural
from jaxwarm.jaxkey.entryformat import CACHE_SUFFIX, decode_atime, encode_atime, function_of
from jaxwarm.store.usage import KeyHistory

if TYPE_CHECKING:
    from jaxwarm.store.store import LocalStore

log = logging.getLogger(__name__)

QUARANTINE_DIR = "jaxwarm-quarantine"
# Process 0 of a prewarm holds `<dir>/jaxwarm-locks/<key>.lock` while JAX writes the key and
# until the manifest records it: an entry under a held lock is in flight, never pruned.
WRITER_LOCKS = "jaxwarm-locks"
# JAX's key: the module name (`jit_<function>`), '-', the sha256 hex of the key components.
# Anything else is not an entry: never a path to build, read or remove.
ENTRY_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*-[0-9a-f]{64}")
# No entry JAX writes comes near this; a bigger "entry" is not read into memory.
MAX_ENTRY_BYTES = 4 << 30
# An entry's payload is capped at PAYLOAD_RATIO times its compressed size (at least
# MIN_PAYLOAD_CAP): serialized executables compress a few times, a zlib bomb 1000 times.
PAYLOAD_RATIO = 64
MIN_PAYLOAD_CAP = 64 << 20
# Nodes sharing a cache dir disagree on the time by a little; a file time further ahead than
# this is no evidence of use.
CLOCK_SKEW_S = 300.0
# JAX writes 8 bytes (`encode_atime`); anything much longer is not its atime file.
ATIME_CAP = 64


class NotAnEntry(ValueError):
    """A file under an entry's name that jaxwarm will not read: the message says why."""


def is_entry_key(key: str) -> bool:
    return ENTRY_KEY.fullmatch(key) is not None


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    size: int
    created: float
    # Last use known to JAX (its atime file, when the cache has a size cap) or to jaxwarm's
    # usage log; the creation time when neither knows better.
    last_used: float

    @property
    def function(self) -> str:
        return function_of(self.key)


def open_entry(path: Path) -> BinaryIO:
    """A regular entry file opened for reading, without following a symlink or blocking on a
    FIFO, and bounded (a link to /dev/zero or a huge file is refused, not opened). Raises
    FileNotFoundError, or NotAnEntry saying what is there instead. Read it in blocks."""
    try:
        return open_regular(path, MAX_ENTRY_BYTES, "any JAX entry")
    except RefusedFile as exc:
        raise NotAnEntry(exc.why) from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise NotAnEntry(f"not a regular file ({exc.strerror})") from None


def payload_limit(size: int) -> int:
    """The most an entry of `size` compressed bytes may decompress to: far above what JAX's
    executables reach, far below what a crafted stream (zeros, 1000:1) claims."""
    return max(MIN_PAYLOAD_CAP, PAYLOAD_RATIO * size)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_atime(path: Path) -> float | None:
    """The last use JAX recorded in the atime file at `path`; None without one, or (with a
    line) for one that is not JAX's 8 bytes in a regular file."""
    try:
        return decode_atime(read_capped(path, ATIME_CAP, "an atime file"))
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("skipping %s", exc if isinstance(exc, RefusedFile)
                    else f"{path}: cannot read it ({exc.strerror})")
        return None


def plausible(moment: float, now: float) -> float | None:
    """A file time as evidence of use: one from the future (a skewed clock, a crafted atime
    file or mtime) says nothing, so it would otherwise keep the entry forever in LRU order
    and from `--older-than`; within CLOCK_SKEW_S of now it is read as now."""
    if moment <= now:
        return moment
    return now if moment <= now + CLOCK_SKEW_S else None


def scan(store: LocalStore, histories: dict[str, KeyHistory]) -> list[Entry]:
    """Every entry in the dir, oldest use first (an entry with no plausible time of use
    first of all); `histories`: what the usage log says of each key (`{}`: no log read).
    Tolerates entries vanishing mid-scan. Only regular files named like a JAX entry count;
    anything else under `*-cache` (a directory, a FIFO, a symlink) is skipped with a line,
    never read or removed."""
    now = time.time()
    entries = []
    for path in store.path.glob(f"*{CACHE_SUFFIX}"):
        key = path.name[:-len(CACHE_SUFFIX)]
        if not is_entry_key(key):
            continue
        try:
            stat = path.lstat()
        except FileNotFoundError:
            continue
        if not stat_module.S_ISREG(stat.st_mode):
            log.warning("skipping %s: %s, not a JAX entry", path, file_kind(stat.st_mode))
            continue
        history = histories.get(key)
        times = (stat.st_mtime, read_atime(store.atime_path(key)),
                 history and history.last_used)
        uses = [use for use in (plausible(moment, now) for moment in times if moment)
                if use is not None]
        entries.append(Entry(key=key, path=path, size=stat.st_size,
                             created=min(stat.st_mtime, now), last_used=max(uses, default=0.0)))
    return sorted(entries, key=lambda e: (e.last_used, e.key))


def remove_entry(store: LocalStore, key: str, destination: Path | None = None) -> bool:
    """Remove (or move to `destination`) one entry and its atime file. Caller holds JAX's
    lock (`LocalStore.jax_lock`).

    Returns False when the entry was already gone (another pruner, or JAX's own eviction).
    """
    try:
        if destination is None:
            store.entry_path(key).unlink()
        else:
            store.entry_path(key).rename(destination)
    except FileNotFoundError:
        return False
    store.atime_path(key).unlink(missing_ok=True)
    return True


def ensure_atime_files(store: LocalStore) -> int:
    """Give every entry an atime file. JAX with a size cap crashes its write (FileNotFoundError
    while evicting) on an entry without one, e.g. one written by an uncapped writer or
    imported from a bundle. Returns how many were added."""
    added = 0
    with store.jax_lock():
        for entry in scan(store, histories={}):
            atime = store.atime_path(entry.key)
            if not atime.exists():
                atomic_write(atime, encode_atime(int(entry.last_used * 1e9)),
                             modes_in(store.path)[0])
                added += 1
    if added:
        log.info("%s: added JAX atime files for %d %s written without a size cap",
                 store.dir, added, plural(added, "entry", "entries"))
    return added

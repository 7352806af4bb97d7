"""The cache store: what is in a JAX cache dir, who used it, and safe removal of entries.

JAX keeps one file per executable, `<key>-cache`, where the key is `<module name>-<sha256>`.
With `cache.max_size` set it also keeps `<key>-atime` (8-byte little-endian ns of the last
use) and serializes every read, write and eviction on `<dir>/.lockfile` (a `filelock`). Every
removal here follows that protocol: under the same lock, the `-cache` file and its `-atime`
file go together, so a concurrent JAX process never finds one without the other.

jaxwarm adds, next to the entries: the prewarm manifest (`launcher.manifest`), an append-only
usage log (`jaxwarm-usage.jsonl`: one line per job's process 0 after its first step, and one
per entry jaxwarm quarantined or pruned), and `jaxwarm-quarantine/` for bad entries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from launcher.environment import is_remote

log = logging.getLogger(__name__)

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
JAX_LOCK = ".lockfile"
# JAX waits 10 s for its lock; a prune holds it for a directory scan and some unlinks.
LOCK_TIMEOUT_S = 60.0
USAGE_LOG = "jaxwarm-usage.jsonl"
QUARANTINE_DIR = "jaxwarm-quarantine"


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


def function_of(key: str) -> str:
    """`jit_train_step-<sha256>` -> `jit_train_step`."""
    return key.rsplit("-", 1)[0]


def entry_path(cache_dir: str | Path, key: str) -> Path:
    """Where JAX's file cache keeps the executable of a key."""
    return Path(cache_dir) / f"{key}{CACHE_SUFFIX}"


def entry_exists(cache_dir: str, key: str) -> bool:
    """Local dirs through the file system; remote ones (gs://, s3://) through etils.epath,
    the library JAX itself reads and writes them with."""
    if not is_remote(cache_dir):
        return entry_path(cache_dir, key).is_file()
    from etils import epath
    return (epath.Path(cache_dir) / f"{key}{CACHE_SUFFIX}").exists()


def atime_path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / f"{key}{ATIME_SUFFIX}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def written_since(cache_dir: str | Path, key: str, since: float) -> tuple[str, int] | None:
    """(sha256, size) of the entry when it was written at or after `since`, else None: an
    older file under the key is one this process failed to load, not one it wrote."""
    path = entry_path(cache_dir, key)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    if stat.st_mtime < since:
        return None
    return sha256_file(path), stat.st_size


@contextmanager
def jax_lock(cache_dir: str | Path) -> Iterator[None]:
    """JAX's own cache lock: held, no JAX process with a size cap reads, writes or evicts."""
    with FileLock(str(Path(cache_dir) / JAX_LOCK), timeout=LOCK_TIMEOUT_S):
        yield


# -- the usage log ---------------------------------------------------------------------------

def usage_path(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / USAGE_LOG


def append_usage(cache_dir: str | Path, record: dict[str, Any]) -> None:
    """One JSON line, appended under a lock so concurrent jobs never interleave lines."""
    path = usage_path(cache_dir)
    line = json.dumps({"time": time.time(), **record}, sort_keys=True) + "\n"
    with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def read_usage(cache_dir: str | Path) -> list[dict[str, Any]]:
    """The usage log in order; a torn last line (a job killed mid-write) is skipped."""
    try:
        lines = usage_path(cache_dir).read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.debug("skipping a torn line in %s", usage_path(cache_dir))
    return records


@dataclass
class KeyHistory:
    """What the usage log says about one key."""

    last_used: float | None = None
    hits: int = 0
    misses: int = 0
    used_by: list[str] = field(default_factory=list)
    written_by: str | None = None
    # The checksum of the entry as last written; None once it was quarantined or pruned.
    sha256: str | None = None
    removed: bool = False


def key_histories(records: list[dict[str, Any]]) -> dict[str, KeyHistory]:
    histories: dict[str, KeyHistory] = {}
    for record in records:
        if record.get("event") in ("quarantined", "pruned"):
            history = histories.setdefault(record["key"], KeyHistory())
            history.sha256, history.removed = None, True
            continue
        user = f"{record.get('run', '?')} ({record.get('job', '?')} r{record.get('restart', 0)})"
        for function in record.get("functions", []):
            if not function.get("key"):
                continue
            history = histories.setdefault(function["key"], KeyHistory())
            history.last_used = record["time"]
            history.hits += bool(function.get("hit"))
            history.misses += not function.get("hit")
            if user not in history.used_by:
                history.used_by.append(user)
            if function.get("sha256"):
                history.written_by, history.sha256, history.removed = \
                    user, function["sha256"], False
    return histories


# -- entries ---------------------------------------------------------------------------------

def read_atime(cache_dir: str | Path, key: str) -> float | None:
    try:
        return int.from_bytes(atime_path(cache_dir, key).read_bytes(), "little") / 1e9
    except (FileNotFoundError, ValueError):
        return None


def scan(cache_dir: str | Path, histories: dict[str, KeyHistory] | None = None) -> list[Entry]:
    """Every entry in the dir, oldest use first. Tolerates entries vanishing mid-scan."""
    histories = histories if histories is not None else key_histories(read_usage(cache_dir))
    entries = []
    for path in Path(cache_dir).glob(f"*{CACHE_SUFFIX}"):
        key = path.name[:-len(CACHE_SUFFIX)]
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        history = histories.get(key)
        uses = [t for t in (read_atime(cache_dir, key), history and history.last_used) if t]
        entries.append(Entry(key=key, path=path, size=stat.st_size, created=stat.st_mtime,
                             last_used=max([stat.st_mtime, *uses])))
    return sorted(entries, key=lambda e: (e.last_used, e.key))


def remove_entry(cache_dir: str | Path, key: str, destination: Path | None = None) -> bool:
    """Remove (or move to `destination`) one entry and its atime file. Caller holds jax_lock.

    Returns False when the entry was already gone (another pruner, or JAX's own eviction).
    """
    path = entry_path(cache_dir, key)
    try:
        if destination is None:
            path.unlink()
        else:
            os.replace(path, destination)
    except FileNotFoundError:
        return False
    atime_path(cache_dir, key).unlink(missing_ok=True)
    return True


def ensure_atime_files(cache_dir: str | Path) -> int:
    """Give every entry an atime file. JAX with a size cap crashes its write (FileNotFoundError
    while evicting) on an entry without one, e.g. one written by an uncapped writer or
    imported from a bundle. Returns how many were added."""
    added = 0
    with jax_lock(cache_dir):
        for entry in scan(cache_dir, histories={}):
            atime = atime_path(cache_dir, entry.key)
            if not atime.exists():
                atime.write_bytes(int(entry.last_used * 1e9).to_bytes(8, "little"))
                added += 1
    if added:
        log.info("%s: added JAX atime files for %d entr%s written without a size cap",
                 cache_dir, added, "y" if added == 1 else "ies")
    return added


# -- pruning ---------------------------------------------------------------------------------

def choose_victims(entries: list[Entry], *, max_bytes: int | None, older_than_s: float | None,
                   pinned: set[str], now: float) -> list[Entry]:
    """Which entries a prune removes: least recently used first until the rest fit in
    `max_bytes`, plus every entry unused for `older_than_s`. Pinned keys are never chosen.
    Pure, so the policy is tested without a cache."""
    candidates = [e for e in entries if e.key not in pinned]
    victims = [e for e in candidates
               if older_than_s is not None and now - e.last_used > older_than_s]
    if max_bytes is not None:
        total = sum(e.size for e in entries) - sum(e.size for e in victims)
        for entry in sorted(candidates, key=lambda e: (e.last_used, e.key)):
            if total <= max_bytes:
                break
            if entry not in victims:
                victims.append(entry)
                total -= entry.size
    return victims


def prune(cache_dir: str | Path, *, max_bytes: int | None = None,
          older_than_s: float | None = None, pinned: set[str] = frozenset()) -> list[Entry]:
    """Remove entries by size and/or age under JAX's lock; safe while jobs run."""
    histories = key_histories(read_usage(cache_dir))
    with jax_lock(cache_dir):
        victims = choose_victims(scan(cache_dir, histories), max_bytes=max_bytes,
                                 older_than_s=older_than_s, pinned=set(pinned), now=time.time())
        removed = [v for v in victims if remove_entry(cache_dir, v.key)]
    for entry in removed:
        append_usage(cache_dir, {"event": "pruned", "key": entry.key, "size": entry.size})
    return removed

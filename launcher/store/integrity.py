"""Is a cache entry intact? And moving the ones that are not out of JAX's way.

JAX never replaces a corrupt entry: every run warns and recompiles, and a flipped byte that
still decompresses can crash the process (SIGILL) when the executable is loaded. So an entry
is checked twice: its compressed stream must decode to more than JAX's 4-byte header (catches
truncation, zeroing and most bit rot), and where jaxwarm saw it written (prewarm manifest or a
job's usage record) its sha256 must match (catches what still decodes). Bad entries move to
`jaxwarm-quarantine/` under JAX's lock; the next compile of that key writes a fresh one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from prewarm.jaxkey.entryformat import TIME_BYTES, ZSTD_MAGIC, decompress
from launcher.store.manifest import read_manifest
from launcher.store.entries import QUARANTINE_DIR, entry_path, jax_lock, remove_entry, scan
from launcher.store.usage import append_usage, key_histories, read_usage

log = logging.getLogger("jaxwarm.store")


@dataclass(frozen=True)
class Check:
    key: str
    size: int
    problem: str | None
    checksum_known: bool

    @property
    def ok(self) -> bool:
        return self.problem is None


def entry_problem(path: Path, expected_sha256: str | None) -> str | None:
    """Why the entry at `path` cannot be loaded safely; None when it is intact."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "missing"
    if not data:
        return "empty file (a torn or interrupted write)"
    if not data.strip(b"\0"):
        return f"all {len(data)} bytes are zero"
    try:
        payload = decompress(data)
    except (zlib.error, ValueError) as exc:
        return f"does not decompress ({exc})"
    except Exception as exc:  # zstandard raises its own error type
        return f"does not decompress ({type(exc).__name__}: {exc})"
    if len(payload) <= TIME_BYTES:
        return f"decompresses to {len(payload)} bytes: no executable after the header"
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        return "sha256 differs from the one recorded when it was written"
    return None


def known_checksums(cache_dir: str | Path) -> dict[str, str]:
    """sha256 per key, as recorded when jaxwarm saw the entry written. The usage log is the
    later word: a quarantine or prune there voids the manifest's checksum of that key."""
    checksums = {key: entry.sha256 for key, entry in read_manifest(cache_dir).items()
                 if entry.sha256}
    for key, history in key_histories(read_usage(cache_dir)).items():
        if history.sha256:
            checksums[key] = history.sha256
        elif history.removed:
            checksums.pop(key, None)
    return checksums


def check_entries(cache_dir: str | Path, keys: list[str] | None = None) -> list[Check]:
    """Check the given keys (default: every entry in the dir)."""
    checksums = known_checksums(cache_dir)
    if keys is None:
        keys = [entry.key for entry in scan(cache_dir, histories={})]
    checks = []
    for key in keys:
        path = entry_path(cache_dir, key)
        problem = entry_problem(path, checksums.get(key))
        if problem == "missing":
            continue
        checks.append(Check(key=key, size=path.stat().st_size if path.exists() else 0,
                            problem=problem, checksum_known=key in checksums))
    return checks


def quarantine(cache_dir: str | Path, check: Check) -> Path | None:
    """Move a bad entry aside (with a note of why), so JAX compiles and writes it afresh."""
    folder = Path(cache_dir) / QUARANTINE_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    destination = folder / f"{check.key}-cache.{stamp}"
    with jax_lock(cache_dir):
        if not remove_entry(cache_dir, check.key, destination):
            return None
    destination.with_suffix(destination.suffix + ".json").write_text(
        json.dumps({"key": check.key, "problem": check.problem, "time": time.time()}) + "\n")
    append_usage(cache_dir, {"event": "quarantined", "key": check.key, "problem": check.problem})
    log.warning("quarantined %s: %s (moved to %s)", check.key, check.problem, destination)
    return destination


def check_and_quarantine(cache_dir: str | Path,
                         keys: list[str] | None = None) -> tuple[list[Check], float]:
    """Check entries, quarantine the bad ones; returns the checks and the seconds it took."""
    start = time.perf_counter()
    checks = check_entries(cache_dir, keys)
    for check in checks:
        if not check.ok:
            quarantine(cache_dir, check)
    return checks, time.perf_counter() - start

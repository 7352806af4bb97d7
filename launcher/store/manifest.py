"""The prewarm manifest: which functions a prewarm job put in the cache, under which key.

It lives in the cache dir (`jaxwarm-manifest.json`) so it travels with the entries. Many
prewarm jobs may finish at once on a shared file system, so every update is a
read-modify-write under a file lock, published with an atomic rename: a reader never sees
a half-written file.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.files import atomic_write, locked

MANIFEST_NAME = "jaxwarm-manifest.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ManifestEntry:
    function: str
    key: str
    run: str
    config: str
    compile_s: float
    lower_s: float
    written: bool
    jax_version: str
    process_count: int
    created: float = field(default_factory=time.time)
    components: dict[str, str] = field(default_factory=dict)
    # Of the entry file as this prewarm wrote it: what `jaxwarm cache verify` checks against.
    sha256: str | None = None
    size: int | None = None
    # The function's abstract signature (tells functions of one name apart), and whether its
    # first execution is the run's first step (not an init function).
    signature: str | None = None
    is_step: bool = True


def manifest_path(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / MANIFEST_NAME


def read_manifest(cache_dir: str | Path) -> dict[str, ManifestEntry]:
    """Entries by cache key; empty when there is no manifest yet."""
    path = manifest_path(cache_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return {key: ManifestEntry(**entry) for key, entry in data.get("entries", {}).items()}


def record_entries(cache_dir: str | Path, entries: list[ManifestEntry]) -> Path:
    path = manifest_path(cache_dir)
    with locked(str(path) + ".lock", "manifest"):
        current = read_manifest(cache_dir)
        current.update({entry.key: entry for entry in entries})
        data: dict[str, Any] = {"version": MANIFEST_VERSION,
                                "entries": {k: asdict(v) for k, v in current.items()}}
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n", mode=0o600)
    return path


def latest_for_run(manifest: dict[str, ManifestEntry], run: str) -> list[ManifestEntry]:
    """The newest entry per function that run `run`'s prewarms recorded: what its next job
    expects to load (older keys of the same function are from an earlier step or setup)."""
    latest: dict[str, ManifestEntry] = {}
    for entry in manifest.values():
        if entry.run == run and (entry.function not in latest
                                 or entry.created > latest[entry.function].created):
            latest[entry.function] = entry
    return sorted(latest.values(), key=lambda e: e.function)

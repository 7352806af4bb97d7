"""The prewarm manifest: which functions a prewarm job put in the cache, under which key.

It lives in the cache dir (`jaxwarm-manifest.json`) so it travels with the entries. Many
prewarm jobs may finish at once on a shared file system, so every update is a
read-modify-write under a file lock, published with an atomic rename: a reader never sees
a half-written file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jaxwarm.core.decode import convert
from jaxwarm.core.errors import ConfigError, UserError
from jaxwarm.core.files import RefusedFile, atomic_write, locked, modes_in, read_bounded
from jaxwarm.core.jsonio import load_json, warn_once
from jaxwarm.core.records import InputSignature
from jaxwarm.store.entries import is_entry_key

log = logging.getLogger(__name__)

MANIFEST_NAME = "jaxwarm-manifest.json"
MANIFEST_VERSION = 1
# About 3 KB per entry (half of it the compile options): some 40,000 entries, far more
# than any cache holds.
MANIFEST_CAP = 128 << 20


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
    # The process-global JAX settings it was lowered under (jaxwarm.jaxkey.globalopts).
    global_options: dict[str, str] = field(default_factory=dict)
    # Every other run whose prewarm found this entry WARM and uses it (`run` wrote it): its
    # pre-run check and `cache export` include the entry too. Older manifests have none.
    runs: list[str] = field(default_factory=list)
    # The layout JAX's mock GPU topology compiled it for, on one node (prewarm.layout: mock),
    # e.g. "8x8x1"; None: compiled on the run's own layout. And the XLA_FLAGS it was
    # compiled under (every flag is in the key): a run's miss names the flags that differ.
    mock_topology: str | None = None
    xla_flags: str | None = None
    # Its inputs as the prewarm lowered them (None: not recorded, an older prewarm or an
    # entry found in the cache): a training job that misses it says which inputs differ.
    inputs: InputSignature | None = None
    # What loading the entry takes besides its bytes (`jaxwarm.jaxkey.entryload.LoadSpec`):
    # a training job's `cache.prefetch` deserializes it with these before the trainer asks.
    compile_options: str | None = None
    device_ids: list[int] = field(default_factory=list)

    def used_by(self, run: str) -> bool:
        return run == self.run or run in self.runs


class Manifest(dict[str, ManifestEntry]):
    """The prewarm manifest as read: its entries by cache key. A snapshot, asked many
    questions by one reader (the entries of a run, the record of a key), so a command or
    a job reads the file once (`CacheStore.manifest`), not once per question."""

    def for_run(self, run: str) -> list[ManifestEntry]:
        """The newest entry per function that run `run`'s prewarms recorded (or found WARM
        and use): what its next job expects to load (older keys of the same function are
        from an earlier step or setup)."""
        latest: dict[str, ManifestEntry] = {}
        for entry in self.values():
            if entry.used_by(run) and (entry.function not in latest
                                       or entry.created > latest[entry.function].created):
                latest[entry.function] = entry
        return sorted(latest.values(), key=lambda e: e.function)

    def compared(self, run: str | None,
                 same_fingerprint: Collection[str] = ()) -> dict[str, ManifestEntry]:
        """For each function name a prewarm recorded, the one prewarm a lookup of that name
        is compared with: run `run`'s newest; else the newest of another run whose prewarm
        ran under this launch's fingerprint (`same_fingerprint`: the keys its record left);
        else the newest of any run. A relaunch under a new run name on a warm cache is the
        common case of the last two: its misses are said against the prewarm it would
        have used."""
        chosen: dict[str, ManifestEntry] = {}
        for entry in self.values():
            best = chosen.get(entry.function)
            if best is None or _preference(entry, run, same_fingerprint) > \
                    _preference(best, run, same_fingerprint):
                chosen[entry.function] = entry
        return chosen

    def compared_functions(self, run: str, same_fingerprint: Collection[str] = ()) -> set[str]:
        """The functions of the prewarm a run is compared with as a whole (`verify --trainer`
        waits for their lookups): its own, else the run's whose prewarm had this fingerprint,
        else the newest prewarm's run (`compared`'s order); none: no prewarm at all."""
        if not self:
            return set()
        best = max(self.values(), key=lambda e: _preference(e, run, same_fingerprint))
        owner = run if best.used_by(run) else best.run
        return {entry.function for entry in self.values() if entry.used_by(owner)}


def _preference(entry: ManifestEntry, run: str | None,
                same_fingerprint: Collection[str]) -> tuple[bool, bool, float]:
    return (run is not None and entry.used_by(run), entry.key in same_fingerprint,
            entry.created)


class ManifestError(UserError, ValueError):
    """A manifest that cannot be read, phrased as one line naming the file."""


def parse_manifest(text: str, source: str, key: str | None = None) -> Manifest:
    """Entries by cache key from the manifest's text (only `key`'s when given: a warm check
    of one key checks only its record), or ManifestError. Pure."""
    try:
        data = load_json(text)
    except ValueError as exc:
        raise ManifestError(f"{source}: not a jaxwarm manifest (not valid JSON: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ManifestError(f"{source}: not a jaxwarm manifest (expected an object with "
                            f"'version' and 'entries')")
    if data.get("version") != MANIFEST_VERSION:
        raise ManifestError(f"{source}: manifest version {data.get('version')!r}, this jaxwarm "
                            f"reads {MANIFEST_VERSION}")
    entries = Manifest()
    for name, raw in data["entries"].items():
        if key is not None and name != key:
            continue
        if not is_entry_key(name):
            raise ManifestError(f"{source}: entries: {name!r} is not a JAX cache key")
        try:
            entries[name] = convert(ManifestEntry, raw, f"entries.{name}", source)
        except ConfigError as exc:
            raise ManifestError(str(exc)) from None
    return entries


def read_manifest(path: Path, strict: bool = True, key: str | None = None) -> Manifest:
    """The manifest at `path`: entries by cache key (only `key`'s when given); empty when
    there is no manifest yet.
    A broken one (not a regular file within MANIFEST_CAP, or not a manifest) raises
    ManifestError, or with `strict=False` (a job that only reads it) is logged and read as
    empty: every entry then gets the full check, slower but never wrong."""
    try:
        try:
            text = read_bounded(path, MANIFEST_CAP, "a jaxwarm manifest")
        except RefusedFile as exc:
            raise ManifestError(str(exc)) from None
        return parse_manifest(text, str(path), key)
    except FileNotFoundError:
        return Manifest()
    except ManifestError as exc:
        if strict:
            raise
        warn_once(f"{exc}; reading it as empty")
        return Manifest()


def set_aside(path: Path, problem: str) -> Path:
    """Move a broken manifest out of the way, with a note of why, so writing can go on."""
    aside = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}")
    path.rename(aside)
    atomic_write(aside.with_name(aside.name + ".why"), problem + "\n", modes_in(path.parent)[0])
    log.warning("%s; moved it to %s and started a new one", problem, aside)
    return aside


def record_entries(path: Path, entries: list[ManifestEntry]) -> None:
    """Add entries to the manifest at `path`, under its lock. A broken manifest never
    blocks a prewarm: it is set aside (`set_aside`) and a new one started."""
    with locked(str(path) + ".lock", "manifest"):
        try:
            current = read_manifest(path)
        except ManifestError as exc:
            set_aside(path, str(exc))
            current = Manifest()
        current.update({entry.key: merged(current.get(entry.key), entry) for entry in entries})
        data: dict[str, Any] = {"version": MANIFEST_VERSION,
                                "entries": {k: asdict(v) for k, v in current.items()}}
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n",
                     mode=modes_in(path.parent)[0], what="the prewarm manifest")


def merged(old: ManifestEntry | None, new: ManifestEntry) -> ManifestEntry:
    """A new record of a key keeps the runs that used the old one (a rewrite after a
    quarantine must not make another run's entry invisible to it)."""
    if old is None:
        return new
    runs = [run for run in dict.fromkeys([old.run, *old.runs, *new.runs]) if run != new.run]
    return dataclasses.replace(new, runs=runs)


def uses_entries(path: Path, entries: list[ManifestEntry], run: str) -> None:
    """Record that `run` uses these entries (its prewarm found them WARM), so that its
    pre-run check and `cache export` include them; a no-op for entries it already uses."""
    new = [dataclasses.replace(entry, runs=[*entry.runs, run])
           for entry in entries if not entry.used_by(run)]
    if new:
        record_entries(path, new)

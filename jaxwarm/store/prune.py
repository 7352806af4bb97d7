"""Pruning: least recently used entries out until the cache fits, safe while jobs run."""

from __future__ import annotations

import time
from pathlib import Path

from jaxwarm.core.records import EntryPruned
from jaxwarm.store.entries import Entry, in_flight, jax_lock, remove_entry, scan
from jaxwarm.store.manifest import read_manifest
from jaxwarm.store.usage import KeyHistory, append_usage, key_histories, read_usage


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
          older_than_s: float | None = None, include_pinned: bool = False,
          histories: dict[str, KeyHistory] | None = None) -> list[Entry]:
    """Remove entries by size and/or age under JAX's lock; safe while jobs run.

    Never removes an entry a running prewarm wrote and has not recorded yet (its writer lock
    is held), with or without `include_pinned`. The writer locks are looked at before the
    manifest is read, both under JAX's lock: a prewarm records its entry before it lets go
    of the writer lock, so each entry is seen either in flight or pinned. `histories`: the
    usage log as the caller parsed it, else it is read here."""
    if histories is None:
        histories = key_histories(read_usage(cache_dir))
    with jax_lock(cache_dir):
        entries = scan(cache_dir, histories)
        busy = {e.key for e in entries if in_flight(cache_dir, e.key)}
        pinned = set() if include_pinned else set(read_manifest(cache_dir))
        victims = choose_victims(entries, max_bytes=max_bytes, older_than_s=older_than_s,
                                 pinned=pinned | busy, now=time.time())
        removed = [v for v in victims if remove_entry(cache_dir, v.key)]
    for entry in removed:
        append_usage(cache_dir, EntryPruned(entry.key, entry.size))
    return removed

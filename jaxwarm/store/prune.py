"""Pruning: least recently used entries out until the cache fits, safe while jobs run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jaxwarm.core.records import EntryPruned
from jaxwarm.store.entries import Entry, remove_entry, scan

if TYPE_CHECKING:
    from jaxwarm.store.store import LocalStore


@dataclass(frozen=True)
class Pruning:
    """What a prune asks for: the cache within `max_bytes`, and/or no entry unused for
    `older_than_s`. Which entries that removes (`victims`) is pure, so the policy is tested
    without a cache."""

    max_bytes: int | None = None
    older_than_s: float | None = None

    def victims(self, entries: list[Entry], *, pinned: set[str], now: float) -> list[Entry]:
        """Least recently used first until the rest fit in `max_bytes`, plus every entry
        unused for `older_than_s`. Pinned keys are never chosen."""
        candidates = [e for e in entries if e.key not in pinned]
        victims = [e for e in candidates
                   if self.older_than_s is not None and now - e.last_used > self.older_than_s]
        if self.max_bytes is not None:
            total = sum(e.size for e in entries) - sum(e.size for e in victims)
            for entry in sorted(candidates, key=lambda e: (e.last_used, e.key)):
                if total <= self.max_bytes:
                    break
                if entry not in victims:
                    victims.append(entry)
                    total -= entry.size
        return victims


def prune(store: LocalStore, pruning: Pruning, include_pinned: bool = False) -> list[Entry]:
    """Remove entries by size and/or age under JAX's lock; safe while jobs run.

    Never removes an entry a running prewarm wrote and has not recorded yet (its writer lock
    is held), with or without `include_pinned`. The writer locks are looked at before the
    manifest is read, both under JAX's lock: a prewarm records its entry before it lets go
    of the writer lock, so each entry is seen either in flight or pinned. The usage log is
    the one the store parsed (a last use it records keeps an entry)."""
    histories = store.histories()
    with store.jax_lock():
        entries = scan(store, histories)
        busy = {e.key for e in entries if store.in_flight(e.key)}
        pinned = set() if include_pinned else set(store.manifest())
        victims = pruning.victims(entries, pinned=pinned | busy, now=time.time())
        removed = [v for v in victims if remove_entry(store, v.key)]
    for entry in removed:
        store.append_usage(EntryPruned(entry.key, entry.size))
    return removed

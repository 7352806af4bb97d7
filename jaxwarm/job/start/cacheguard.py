"""Keeps the cache settings jaxwarm set in force when the trainer changes them afterwards.

A trainer that sets up its own cache (`jax.config.update("jax_compilation_cache_dir", ...)`,
a 60 s threshold) after jaxwarm did silently looks up another dir, under other keys (the
dir's path enters the compile options), and misses every prewarmed entry. Measured on jax
0.10.2: JAX reads the dir when it first opens the cache, at the first lookup, and a dir set
after that is ignored for reads and writes but still enters every later key. The thresholds
are read at each write. The end of each lowering comes before the key and the lookup, so the
recorder calls `check()` there: every change is said once, in one line, and under
`cache.enforce` jaxwarm's values are put back before the lookup that needs them. The line
names who made the change: in a training job the trainer; in a prewarm or verify job the
step factory, the only code besides jaxwarm's that runs there (an adapter that calls the
trainer's own set-up, e.g. MaxText's `initialize`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from jaxwarm.core.records import TRAIN

log = logging.getLogger(__name__)

CACHE_DIR = "jax_compilation_cache_dir"

_CONSEQUENCE = {
    CACHE_DIR: "the prewarmed entries are in {ours}",
    "jax_persistent_cache_min_compile_time_secs": "JAX stores only compiles at least that long",
    "jax_persistent_cache_min_entry_size_bytes": "JAX stores only entries at least that big",
    "jax_persistent_cache_enable_xla_caches": "XLA's sub-caches, and with them the key, follow it",
    "jax_compilation_cache_max_size": "every writer of one cache must use the same size cap",
}
WATCHED = tuple(_CONSEQUENCE)
# Whose code changed a setting: in a training job the trainer's; in a prewarm or verify job
# the step factory's (an adapter that runs the trainer's own set-up, as MaxText's does).
TRAINER, STEP_FACTORY = "the trainer", "the step factory"


def actor_of(job: str) -> str:
    """Whose code besides jaxwarm's runs in a job: the trainer's in the training job, the
    step factory's in the prewarm and verify jobs."""
    return TRAINER if job == TRAIN else STEP_FACTORY


def change_line(name: str, ours: Any, theirs: Any, enforce: bool, looked_up: bool,
                actor: str = TRAINER) -> str:
    """The one line a changed setting becomes, in the job log and the init report."""
    line = (f"{actor} set {name} to {theirs!r} after jaxwarm set {ours!r}; "
            f"{_CONSEQUENCE[name].format(ours=repr(ours))}")
    if enforce:
        return (line + f"; cache.enforce is on: jaxwarm set it back to {ours!r} before the "
                       f"next cache lookup")
    line += f"; cache.enforce is off: jaxwarm follows {actor}"
    if name == CACHE_DIR and looked_up:
        line += (f" (JAX had already opened {ours!r} and keeps reading and writing there, but "
                 f"the new path enters every later key, so those lookups miss)")
    elif name == CACHE_DIR and actor == TRAINER:
        line += ", so this process will not load the prewarmed entries"
    elif name == CACHE_DIR:
        line += f", so this job looks entries up in {theirs!r}, not in the config's cache dir"
    return line


@dataclass
class CacheGuard:
    """jaxwarm's values of the watched cache options, and what was already said about them."""

    ours: dict[str, Any]
    enforce: bool
    actor: str = TRAINER  # whose code runs in this job besides jaxwarm's
    _said: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def from_options(cls, options: dict[str, Any], enforce: bool,
                     actor: str = TRAINER) -> CacheGuard:
        return cls({name: options[name] for name in WATCHED if name in options}, enforce,
                   actor)

    def check(self, looked_up: bool) -> list[str]:
        """Lines for settings changed since the last check; puts ours back under enforce."""
        import jax

        lines = []
        for name, ours in self.ours.items():
            theirs = getattr(jax.config, name)
            if theirs == ours:
                continue
            if (name, repr(theirs)) not in self._said:
                self._said.add((name, repr(theirs)))
                lines.append(change_line(name, ours, theirs, self.enforce, looked_up,
                                         self.actor))
                log.warning("jaxwarm: %s", lines[-1])
            if self.enforce:
                jax.config.update(name, ours)
        return lines

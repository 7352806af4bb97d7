"""Step factories that die: one whose prewarm is killed (kill -9 style, no cleanup) the
moment JAX starts writing its second cache entry (a prewarm killed between two compiles,
without timing; the small step of conftest's FAST_STEP), and one that raises before
anything compiles."""

from __future__ import annotations

import os
from typing import Any

import jax

from jaxwarm.workload.small import make_train_step

WRITE_EVENT = "/jax/compilation_cache/cache_misses"  # fired just before JAX writes an entry


def make_train_step_then_die(config: Any, mesh: Any) -> Any:
    writes = []

    def on_event(event: str, **_: Any) -> None:
        if event == WRITE_EVENT:
            writes.append(event)
            if len(writes) == 2:
                os._exit(9)

    jax.monitoring.register_event_listener(on_event)
    return make_train_step(config, mesh)


class UnrecognizedFlagError(ValueError):
    """What absl's flag parser raises for a flag it does not know (absl.flags)."""


def make_train_step_but_refuse_a_flag(config: Any, mesh: Any) -> Any:
    """A factory whose parser reads sys.argv as well as the argv handed to it and refuses
    a flag it finds there: it raises before anything compiles."""
    raise UnrecognizedFlagError("Unknown command line flag 'd_model'")

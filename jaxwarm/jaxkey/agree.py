"""Process 0's answer to every process of a job, with nothing compiled.

`multihost_utils.broadcast_one_to_all` is a jitted psum: it is compiled, looked up in the
persistent cache, and on process 0 written into the cache dir (as `jit__psum-...`) when it
takes longer than the threshold, so the verify job, which must leave the cache dir as it
found it, cannot use it, and the prewarm would leave an entry nobody asked for. The
coordination service that `jax.distributed.initialize()` starts has a key-value store
(what JAX's own preemption sync and barriers use): process 0 sets the answer under a key,
the others block until it is there (`jaxwarm.jaxkey.kvstore`, the one way to that store).

Importing this module does not import jax.
"""

from __future__ import annotations

import itertools

from jaxwarm.jaxkey.kvstore import KVStore

_calls = itertools.count()


class NotJoined(RuntimeError):
    """Several processes, but not joined through `jax.distributed.initialize()`."""


def broadcast_flags(flags: list[bool], *, what: str, timeout_s: float) -> list[bool]:
    """Process 0's `flags` on every process (the same number on each). Every process must
    call it the same number of times, in the same order, as with any collective; the others
    wait at most `timeout_s` for process 0 (a dead process 0 ends the job, not a hang)."""
    import jax

    if jax.process_count() == 1:
        return list(flags)
    store = KVStore.of_job()
    if store is None:
        raise NotJoined(f"{jax.process_count()} processes but no jax.distributed client: "
                        f"cannot share {what}")
    key = f"jaxwarm/{what}/{next(_calls)}"
    if jax.process_index() == 0:
        store.set(key, "".join("1" if flag else "0" for flag in flags))
        return list(flags)
    value = store.get(key, timeout_s)
    if len(value) != len(flags):
        raise ValueError(f"process 0 shared {len(value)} answer(s) for {what}, this process "
                        f"has {len(flags)}: the processes lowered different targets")
    return [char == "1" for char in value]

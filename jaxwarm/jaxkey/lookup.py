"""Every multi-process compile of a job, at the two moments rank coordination needs: right
after JAX computed the persistent-cache key (before it looks the key up), and right after
the compile or load (before the program first runs, so before its first collective).

Why a seam and not the public events: JAX tells no listener which processes a program
spans, and nothing can make it skip one lookup. `watch_lookups` wraps, for the life of the
process, the two functions the key probe of `predict.py` relies on, both called through
their module on every tested version (0.8.3 to 0.12.0.1): `compiler.compile_or_get_cached`,
which gets the program's device assignment (hence its processes), and
`compilation_cache.get_cache_key`. For a program that spans several processes, the key JAX
computed (and each component's hash, from JAX's own DEBUG lines) goes to `before_lookup`;
when it returns False, the wrapper returns no key, and JAX compiles that program without
the persistent cache: nothing is read, nothing is written, the entry stays as it is.
`after_compile` runs from JAX's backend-compile duration event, which JAX fires once it has
measured the compile, so whatever the callback waits for is not counted as compile time.
A key probe (`predict.in_probe`) passes through untouched, and single-process programs cost
one set comprehension over their devices.

With auto-PGLE JAX computes two keys per compile; each goes to `before_lookup`.

`watch_keys` is the same seam for every compile of the process, one process or several:
`jaxwarm verify --trainer` hears each key the trainer's own lowering gives, and answers
whether JAX may look it up (a WARM entry loads) or compiles it without the cache.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxwarm.jaxkey import logs
from jaxwarm.jaxkey.entryformat import function_of
from jaxwarm.jaxkey.pgle import is_pgle_options
from jaxwarm.jaxkey.predict import KeyPrediction, _check_seam, in_probe


@dataclass(frozen=True)
class Lookup:
    """One multi-process compile, as the ranks compare it."""

    module_name: str
    key: str
    # sha256 hex of each key component (JAX's own DEBUG lines), by component name.
    components: dict[str, str]
    # The backend's platform ("cpu", "gpu"): on CPU each process hashes its own devices.
    platform: str
    # The processes whose devices the program runs on, ascending.
    processes: tuple[int, ...]


_local = threading.local()
_watching: list[bool] = []


def watch_lookups(before_lookup: Callable[[Lookup], bool],
                  after_compile: Callable[[Lookup], None]) -> None:
    """Install the wrappers (once per process); see the module docstring."""
    import jax.monitoring as monitoring
    from jax._src import compilation_cache, compiler

    if _watching:
        raise RuntimeError("watch_lookups is installed once per process")
    _check_seam(compilation_cache, compiler)
    _watching.append(True)
    original_compile = compiler.compile_or_get_cached
    original_key = compilation_cache.get_cache_key

    def compile_or_get_cached(backend: Any, computation: Any, devices: Any,
                              *args: Any, **kwargs: Any) -> Any:
        processes = tuple(sorted({device.process_index for device in devices.flat}))
        if in_probe() or len(processes) < 2:
            return original_compile(backend, computation, devices, *args, **kwargs)
        _local.processes, _local.lookup = processes, None
        try:
            executable = original_compile(backend, computation, devices, *args, **kwargs)
        finally:
            _local.processes = None
        _local.finished = _local.lookup  # for the backend-compile event that follows
        return executable

    def get_cache_key(module: Any, devices: Any, options: Any, backend: Any,
                      *args: Any, **kwargs: Any) -> str | None:
        processes = getattr(_local, "processes", None)
        if processes is None or in_probe():
            return original_key(module, devices, options, backend, *args, **kwargs)
        with logs.key_lines(threading.get_ident(), silence=False) as lines:
            key = original_key(module, devices, options, backend, *args, **kwargs)
        components = {match["component"]: match["hash"]
                      for match in map(logs.COMPONENT.match, lines) if match}
        lookup = Lookup(module_name=function_of(key), key=key, components=components,
                        platform=str(backend.platform), processes=processes)
        _local.lookup = lookup
        return key if before_lookup(lookup) else None

    def on_duration(event: str, duration: float, **kwargs: Any) -> None:
        if event != logs.EVENT_BACKEND_COMPILE or in_probe():
            return
        finished = getattr(_local, "finished", None)
        _local.finished = None
        if finished is not None:
            after_compile(finished)

    compiler.compile_or_get_cached = compile_or_get_cached
    compilation_cache.get_cache_key = get_cache_key
    monitoring.register_event_duration_secs_listener(on_duration)


def watch_keys(on_key: Callable[[KeyPrediction], bool]) -> None:
    """For the life of the process, every key JAX computes for a compile (not a key probe)
    goes to `on_key`, with each component's hash; when it returns False, JAX compiles that
    program without the persistent cache (nothing read, nothing written). Installed after
    `watch_lookups`, it hears the key that one let through (None: ranks compile uncached).
    JAX's PGLE-optimized key (`pgle.py`) passes untouched: the key that follows it is the
    first compile's, the one a prewarm writes."""
    from jax._src import compilation_cache, compiler

    _check_seam(compilation_cache, compiler)
    original_key = compilation_cache.get_cache_key

    def get_cache_key(module: Any, devices: Any, options: Any, *args: Any,
                      **kwargs: Any) -> str | None:
        if in_probe() or is_pgle_options(options):
            return original_key(module, devices, options, *args, **kwargs)
        with logs.key_lines(threading.get_ident(), silence=False) as lines:
            key = original_key(module, devices, options, *args, **kwargs)
        if key is None:
            return None
        components = {match["component"]: match["hash"]
                      for match in map(logs.COMPONENT.match, lines) if match}
        found = KeyPrediction(key=key, module_name=function_of(key),
                              components=components)
        return key if on_key(found) else None

    compilation_cache.get_cache_key = get_cache_key

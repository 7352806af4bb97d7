"""Which persistent-cache keys are JAX's profile-guided (PGLE) ones.

With automatic PGLE (`jax_enable_pgle`) or `jax_compilation_cache_expect_pgle`, JAX's
`compiler._resolve_compilation_strategy` computes two keys per compile, the same way on
every tested version (0.8.3 to 0.12.0.1): first the "PGLE-optimized" key, from the compile
options with their FDO profile replaced by the sentinel `b"pgle profiled"`; then the key of
the first compile, from the options without command buffers. If the cache holds the
PGLE-optimized entry, JAX loads it (and profiles nothing); else it looks up the first key,
and after `jax_pgle_profiling_runs` profiled runs compiles again with the profile and
stores that under the PGLE-optimized key. Neither key's lookup line says which it is; the
sentinel in the options does, at `compilation_cache.get_cache_key`.

On CPU the profiler collects an empty trace (JAX warns "PGLE collected an empty trace"):
there is no second compile, the first one is looked up again. A compile given an FDO profile
by hand (`compiler_options={"fdo_profile": ...}`) is stored under the PGLE-optimized key on
any backend.
"""

from __future__ import annotations

import threading
from typing import Any

from jaxwarm.jaxkey import logs

SENTINEL = b"pgle profiled"

_keys: dict[str, dict[str, str]] = {}
_watching: list[bool] = []


def is_pgle_options(options: Any) -> bool:
    """Are these the compile options JAX computes its PGLE-optimized key from?"""
    build = getattr(options, "executable_build_options", None)
    return getattr(build, "fdo_profile", None) == SENTINEL


def pgle_components(key: str) -> dict[str, str] | None:
    """The component hashes of `key` when this process computed it as a PGLE-optimized
    key; None for any other key."""
    return _keys.get(key)


def watch_pgle_keys() -> None:
    """Note each PGLE-optimized key this process computes (once per process). Its
    component lines are kept apart (`pgle_components`): JAX's DEBUG lines that follow
    belong to the key it looks up next."""
    from jax._src import compilation_cache

    if _watching:
        return
    _watching.append(True)
    original = compilation_cache.get_cache_key

    def get_cache_key(module: Any, devices: Any, options: Any, *args: Any,
                      **kwargs: Any) -> Any:
        if not is_pgle_options(options):
            return original(module, devices, options, *args, **kwargs)
        with logs.key_lines(threading.get_ident(), silence=True) as lines:
            key = original(module, devices, options, *args, **kwargs)
        if key is not None:
            _keys[key] = {match["component"]: match["hash"]
                          for match in map(logs.COMPONENT.match, lines) if match}
        return key

    compilation_cache.get_cache_key = get_cache_key

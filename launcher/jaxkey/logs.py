"""What JAX tells about its persistent cache: event names and log lines. No jax import.

The same on every tested version (0.8.3 to 0.12.0.1): `jax.monitoring` events, the
compiler's hit/miss line (DEBUG unless JAX_LOG_COMPILES / JAX_EXPLAIN_CACHE_MISSES raise
it) and `cache_key`'s per-component hash lines (DEBUG only).
"""

from __future__ import annotations

import re

EVENT_LOOKUP = "/jax/compilation_cache/compile_requests_use_cache"
EVENT_HIT = "/jax/compilation_cache/cache_hits"
EVENT_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
EVENT_RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
EVENT_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
EVENT_TRACED = "/jax/core/compile/jaxpr_trace_duration"
# The end of a lowering: before the key is computed and the cache looked up.
EVENT_LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"

COMPILER_LOGGER = "jax._src.compiler"
CACHE_KEY_LOGGER = "jax._src.cache_key"
# Logs "Finished XLA compilation of ..." around every compile_or_get_cached call.
DISPATCH_LOGGER = "jax._src.dispatch"

HIT_OR_MISS = re.compile(r"^(Persistent compilation cache hit|PERSISTENT COMPILATION CACHE MISS)"
                         r" for '(?P<name>[^']+)' with key '(?P<key>[^']+)'")
# pxla's DEBUG line at each lowering: the function's abstract signature (tells apart two
# functions of one name).
LOWERING_LOGGER = "jax._src.interpreters.pxla"
LOWERING = re.compile(r"^Compiling (?P<name>\S+) with global shapes and types (?P<avals>.*)\. "
                      r"Argument mapping: ", re.DOTALL)
COMPONENT = re.compile(r"^get_cache_key hash of serialized (?P<component>.+): "
                       r"(?P<hash>[0-9a-f]+)$")


def is_hit(match: re.Match[str]) -> bool:
    """For a HIT_OR_MISS match: was it a hit?"""
    return match.group(1).startswith("Persistent")


_ARRAY = re.compile(r"\w+(?:<\w+>)?\[(?P<dims>[\d, ]*)\]")


def input_elements(avals: str) -> int:
    """The number of elements of a function's inputs, from the `LOWERING` line's global
    shapes and types (`(ShapedArray(float32[4,64]), ShapedArray(key<fry>[]))`)."""
    total = 0
    for match in _ARRAY.finditer(avals):
        count = 1
        for dim in filter(None, match["dims"].replace(" ", "").split(",")):
            count *= int(dim)
        total += count
    return total

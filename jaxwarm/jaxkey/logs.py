"""What JAX tells about its persistent cache: event names and log lines. No jax import.

The same on every tested version (0.8.3 to 0.12.0.1): `jax.monitoring` events, the
compiler's hit/miss line (DEBUG unless JAX_LOG_COMPILES / JAX_EXPLAIN_CACHE_MISSES raise
it) and `cache_key`'s per-component hash lines (DEBUG only), and how one thread's lines are caught.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

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
# The compiler's line when process 0 chooses not to write a compiled function's entry, with
# its own reason: under its min compile time by its own clock (which starts later than the
# backend-compile duration jaxwarm times), or host callbacks.
NOT_WRITTEN = re.compile(r"^Not writing persistent cache entry for '(?P<name>[^']+)' because "
                         r"(?P<why>.+)$", re.DOTALL)
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


def weak_types(avals: str) -> list[bool]:
    """Per argument of the `LOWERING` line's global shapes and types (`(ShapedArray(f32[]),
    ShapedArray(float32[], weak_type=True))`), whether it is weak-typed: a Python scalar
    JAX lowers like any other input of its dtype."""
    text = avals.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items.append(text[start:])
    return [item.replace(" ", "").find("weak_type=True") >= 0 for item in items if item.strip()]


# A level no record has: the records of a silenced thread reach no handler.
SILENT = logging.CRITICAL + 1


class _ThreadLines(logging.Filter):
    """Of one thread's records: collects the messages (when `collect`) and lets through only
    those at `passing_level` or above. Other threads' records pass untouched."""

    def __init__(self, thread: int, lines: list[str], collect: bool, passing_level: int):
        super().__init__()
        self.thread, self.lines, self.collect = thread, lines, collect
        self.passing_level = passing_level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread:
            return True
        if self.collect:
            self.lines.append(record.getMessage())
        return record.levelno >= self.passing_level


@contextmanager
def key_lines(thread: int, silence: bool) -> Iterator[list[str]]:
    """`cache_key`'s DEBUG lines (one hash per key component) of `thread` while the block
    runs. With `silence` (a key probe, not a compile) that thread's records of the cache_key
    and dispatch loggers reach no handler and no later filter (e.g. the recorder's); without
    it they pass exactly as they would have at the logger's previous level. Levels and
    filters are put back as they were."""
    lines: list[str] = []
    loggers = [(logging.getLogger(CACHE_KEY_LOGGER), True)]
    if silence:
        loggers.append((logging.getLogger(DISPATCH_LOGGER), False))
    saved = [(logger, logger.level,
              _ThreadLines(thread, lines, collect,
                           SILENT if silence else logger.getEffectiveLevel()))
             for logger, collect in loggers]
    for logger, _, thread_filter in saved:
        logger.filters.insert(0, thread_filter)  # ahead of any filter that records
    loggers[0][0].setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        for logger, level, thread_filter in saved:
            logger.setLevel(level)
            logger.removeFilter(thread_filter)

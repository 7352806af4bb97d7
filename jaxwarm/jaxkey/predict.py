"""The persistent-cache key of a `jax.stages.Lowered`, as JAX itself computes it. No compile.

JAX computes the key in one place, `jax._src.compilation_cache.get_cache_key`, which
`compiler.compile_or_get_cached` calls (as a module attribute, on every tested version)
before it looks anything up or compiles. Rather than mirroring that recipe from private
symbols that move between releases, `predict_key` lets JAX's own `lowered.compile()` run up
to that call, with the function wrapped for the probing thread only: the wrapper records the
key JAX computed and raises `_KeyComputed`, which unwinds the compile before any lookup,
backend compile or write. Each component's hash comes from JAX's own
`get_cache_key hash of serialized <component>: <hex>` DEBUG lines. About 1-2 ms after
lowering (the serialized program is hashed twice while those lines are on).

The probe leaves no trace: the wrapped functions, the loggers' levels and filters are
restored in every case; the exception is not cached by JAX's in-memory compilation cache,
and the `Lowered` keeps no executable, so a later `lowered.compile()` compiles and writes
the entry as if no probe had run. JAX still fires its backend-compile duration event for
the unwound call: `in_probe()` tells listeners (the recorder) to ignore it.

With auto-PGLE or `jax_compilation_cache_expect_pgle` JAX computes two keys (`pgle.py`):
the probe lets the PGLE-optimized one through and stops at the next, the first compile's,
which a prewarm writes and a first run looks up; `KeyPrediction.pgle_key` is the other.

Importing this module does not import jax.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jaxwarm.jaxkey import logs
from jaxwarm.jaxkey.components import differing_components
from jaxwarm.jaxkey.entryformat import function_of
from jaxwarm.jaxkey.entryload import LoadSpec, load_spec
from jaxwarm.jaxkey.pgle import is_pgle_options
from jaxwarm.jaxkey.versions import (
    UnsupportedJaxVersion,
    unsupported_message,
    version_problem,
)

if TYPE_CHECKING:
    import jax

log = logging.getLogger(__name__)

# The names the probe needs in `jax._src.compilation_cache`; `compiler` calls both through
# the module, so replacing the attribute is seen by the compile.
SEAM = ("get_cache_key", "is_cache_used")


class KeyNotComputed(RuntimeError):
    """JAX would not compute a persistent-cache key for this program right now."""


class _KeyComputed(Exception):
    """Raised by the wrapped `get_cache_key` to stop the compile once the key is known."""


class _CacheNotUsed(Exception):
    """Raised by the wrapped `is_cache_used` when JAX would skip the persistent cache."""


@dataclass(frozen=True)
class KeyPrediction:
    """A predicted cache key and the sha256 hex of each key component on its own."""

    key: str
    module_name: str
    components: dict[str, str]
    # With PGLE on (or expected): the key JAX stores the profile-guided compile under.
    pgle_key: str | None = None
    # What JAX needs besides the entry to load it (`jaxwarm.jaxkey.entryload`): the compile
    # options it hashed, serialized, and the ids of the devices it compiled for.
    load: LoadSpec | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for json.dump; `from_json` reads it back."""
        return {"key": self.key, "module_name": self.module_name,
                "components": dict(self.components), "pgle_key": self.pgle_key}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyPrediction:
        pgle_key = data.get("pgle_key")
        return cls(key=str(data["key"]), module_name=str(data["module_name"]),
                   components={str(k): str(v) for k, v in data["components"].items()},
                   pgle_key=None if pgle_key is None else str(pgle_key))


def explain_difference(expected: KeyPrediction, actual: KeyPrediction) -> list[str]:
    """Names of the components that differ, in JAX's order; empty if the keys match."""
    if expected.key == actual.key:
        return []
    return differing_components(expected.components, actual.components)


_probe_lock = threading.Lock()
_probing = threading.local()


def in_probe() -> bool:
    """True while this thread runs a probe: JAX events and log lines it sees are the probe's."""
    return getattr(_probing, "active", False)


def check_jax() -> None:
    """Raise UnsupportedJaxVersion (one line) unless the installed jax can be probed."""
    problem = version_problem()
    if problem:
        raise UnsupportedJaxVersion(problem)


def predict_key(lowered: jax.stages.Lowered,
                compiler_options: dict[str, Any] | None = None) -> KeyPrediction:
    """The persistent-cache key JAX will look up when `lowered.compile(compiler_options)`
    runs now (the options enter the compile options, so the key).

    It is computed by JAX itself with the current config (cache dir, xla caches, ...) and
    environment (XLA_FLAGS, sys.argv), so call it with the run's settings in place.
    """
    import jax

    check_jax()
    if not isinstance(lowered, jax.stages.Lowered):
        raise TypeError(f"predict_key needs a jax.stages.Lowered, got {type(lowered).__name__}")
    start = time.perf_counter()
    keys, lines, load = _probe(lowered, compiler_options)
    key = keys[-1]
    # The PGLE-optimized key's lines come first; the dict keeps the looked-up key's.
    components = {match["component"]: match["hash"]
                  for match in map(logs.COMPONENT.match, lines) if match}
    prediction = KeyPrediction(key=key, module_name=function_of(key),
                               components=components,
                               pgle_key=keys[0] if len(keys) > 1 else None, load=load)
    log.debug("predicted cache key %s in %.2f ms", key, 1e3 * (time.perf_counter() - start))
    return prediction


def _probe(lowered: Any,
           compiler_options: dict[str, Any] | None
           ) -> tuple[list[str], list[str], LoadSpec | None]:
    """Run `lowered.compile(compiler_options)` up to the key JAX looks up; the keys it
    computed (a PGLE-optimized one first), the cache_key log lines, and what loading the
    looked-up key's entry takes."""
    from jax._src import compilation_cache, compiler

    _check_seam(compilation_cache, compiler)
    thread = threading.get_ident()
    keys: list[str] = []
    loads: list[LoadSpec | None] = []
    original_key = compilation_cache.get_cache_key
    original_used = compilation_cache.is_cache_used

    def get_cache_key(module: Any, devices: Any, options: Any, *args: Any,
                      **kwargs: Any) -> str:
        key = original_key(module, devices, options, *args, **kwargs)
        if threading.get_ident() != thread:
            return key
        keys.append(key)
        loads.append(load_spec(devices, options))
        if is_pgle_options(options):  # the key JAX looks up is computed right after
            return key
        raise _KeyComputed

    def is_cache_used(*args: Any, **kwargs: Any) -> bool:
        used = original_used(*args, **kwargs)
        if threading.get_ident() == thread and not used:
            raise _CacheNotUsed
        return used

    with _probe_lock, logs.key_lines(thread, silence=True) as lines:
        compilation_cache.get_cache_key = get_cache_key
        compilation_cache.is_cache_used = is_cache_used
        _probing.active = True
        try:
            lowered.compile(compiler_options)
        except _KeyComputed:
            return keys, lines, loads[-1]
        except _CacheNotUsed:
            raise KeyNotComputed(
                "JAX would not look this program up in the persistent cache: no cache dir "
                "is set (jax_compilation_cache_dir), the cache is disabled, or the backend "
                "cannot serialize executables") from None
        finally:
            _probing.active = False
            compilation_cache.get_cache_key = original_key
            compilation_cache.is_cache_used = original_used
    raise KeyNotComputed(
        "JAX reused this program's executable from its in-memory cache without computing "
        "a key (it was compiled earlier in this process): predict before the first compile, "
        "or call jax.clear_caches() first")


def _check_seam(compilation_cache: Any, compiler: Any) -> None:
    """The probe works only where `compiler` calls the seam through the module: a name it
    imported itself would bypass the wrapper, and the probe would really compile."""
    missing = [name for name in SEAM if not callable(getattr(compilation_cache, name, None))]
    if missing:
        raise UnsupportedJaxVersion(unsupported_message(
            _jax_version(), f"jax._src.compilation_cache has no {', '.join(missing)}"))
    bypassed = [name for name in SEAM
                if getattr(compiler, name, None) is getattr(compilation_cache, name)]
    if bypassed:
        raise UnsupportedJaxVersion(unsupported_message(
            _jax_version(), f"jax._src.compiler imports {', '.join(bypassed)} by name"))


def _jax_version() -> str:
    import jax

    return jax.__version__

"""Loading a cache entry before JAX asks for it, and handing it to JAX's own lookup; and
holding JAX's own read of an entry to what is safe to read.

JAX loads an entry in `compilation_cache.get_executable_and_time(key, compile_options,
backend, executable_devices[, host_callbacks])`, which `compiler._cache_read` calls through
the module on every tested version (0.8.3 to 0.12.0.1): read the file, decompress
(`decompress_executable`), split off the compile time (`extract_executable_and_time`),
then `backend.deserialize_executable(serialized, executable_devices, compile_options)`,
the expensive step (XLA rebuilds the runtime's program: it grows with the program, not the
entry's bytes). The last step needs the compile options and the devices the trainer's own
lowering will pass, which a training process does not have before that lowering. So the
prewarm records them (`load_spec`, from JAX's key probe: the options JAX hashed into the
key, serialized, and the device ids), the manifest keeps them, and a training job
deserializes with them on a background thread (`deserialize`).

At the lookup (`serve_lookups`) JAX's own key, computed from the trainer's lowering, picks
the prefetched executable, and it is handed over only when the trainer's call asks for it
with byte-identical compile options, the same devices in the same order and no host
callbacks (an executable deserialized with them is exactly what JAX would have built);
anything else takes JAX's normal path. JAX's events (lookup, hit, retrieval time) fire
as for any hit, since the wrapper sits inside `_cache_read`.

Deserialization releases the GIL on every tested version (measured: docs/cache.md,
"Prefetch"): the trainer's Python runs on while the loads do, competing with them only
for the CPU; the prefetch lowers the deserializing thread to idle priority for that call
alone (`jaxwarm.job.prefetch`, "Below the trainer").

The same seam is where JAX itself reads an entry, after every check jaxwarm made at the
launch and at the job's start: `guard_reads` asks, right before that read, whether the file
under the key is still one to read (a link to /dev/zero or a FIFO planted since would have
JAX read without end, or block in its open), and makes the lookup a miss when it is not.

Importing this module does not import jax.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxwarm.jaxkey.versions import UnsupportedJaxVersion, unsupported_message

# What the prefetch and the read guard need in `jax._src.compilation_cache` (an entry's bytes
# the prefetch reads itself, `entryformat.read_payload`).
SEAM = ("get_executable_and_time",)


@dataclass(frozen=True)
class LoadSpec:
    """What JAX passes to deserialize an entry besides its bytes: the compile options
    (`CompileOptions.SerializeAsString()`, base64) and the ids of the executable's devices,
    in order."""

    compile_options: str
    device_ids: tuple[int, ...]


def load_spec(devices: Any, compile_options: Any) -> LoadSpec | None:
    """The LoadSpec of a compile, from what JAX hashes into its key (`get_cache_key`'s
    devices and options); None where the options cannot be serialized (nothing to
    prefetch with, never a failed probe)."""
    try:
        serialized = compile_options.SerializeAsString()
        ids = tuple(int(device.id) for device in getattr(devices, "flat", devices))
    except Exception:  # a jax whose options do not serialize: no prefetch, nothing else
        return None
    return LoadSpec(base64.b64encode(serialized).decode("ascii"), ids)


@dataclass
class Loaded:
    """An executable deserialized ahead of its lookup; `size` is its serialized bytes."""

    executable: Any
    compile_time: int
    size: int


def deserialize(serialized: bytes, compile_time: int, spec: LoadSpec,
                before: Callable[[], None] | None = None) -> Loaded:
    """Deserialize on the default backend as JAX's lookup would with `spec`; `before` is
    called right before XLA's call, everything else prepared (the prefetch lowers its thread
    there: the call releases the GIL, the preparation does not). Raises LookupError when a
    recorded device is not in this process's backend."""
    import jax
    from jax._src.lib import xla_client

    backend = jax.devices()[0].client
    by_id = {device.id: device for device in jax.devices()}
    missing = [i for i in spec.device_ids if i not in by_id]
    if missing:
        raise LookupError(f"device {missing[0]} is not among this process's devices")
    options = xla_client.CompileOptions.ParseFromString(base64.b64decode(spec.compile_options))
    devices = xla_client.DeviceList(tuple(by_id[i] for i in spec.device_ids))
    if before is not None:
        before()
    return Loaded(backend.deserialize_executable(serialized, devices, options), compile_time,
                  len(serialized))


@dataclass(frozen=True)
class Asked:
    """One lookup of a prefetched key by the trainer's compile, as JAX makes it."""

    key: str
    spec: LoadSpec
    # The dir JAX's cache reads (a lookup from another dir must not get this dir's entry).
    cache_dir: str
    host_callbacks: bool


_serving: list[bool] = []


def serve_lookups(prefetched: Callable[[str], bool],
                  take: Callable[[Asked], Loaded | None]) -> None:
    """For the life of the process: a lookup of a key for which `prefetched` is true goes to
    `take`, whose Loaded JAX gets as the entry it read; None (or an exception, logged)
    sends it down JAX's normal path. Other keys never leave JAX's path. Installed once."""
    import jax
    from jax._src import compilation_cache

    if _serving:
        raise RuntimeError("serve_lookups is installed once per process")
    _check_seam(compilation_cache)
    _serving.append(True)
    original = compilation_cache.get_executable_and_time

    def get_executable_and_time(cache_key: str, compile_options: Any, backend: Any,
                                executable_devices: Any, *args: Any, **kwargs: Any) -> Any:
        if prefetched(cache_key):
            callbacks = args[0] if args else kwargs.get("host_callbacks", ())
            spec = load_spec(executable_devices, compile_options)
            if spec is not None:
                loaded = take(Asked(cache_key, spec,
                                    str(jax.config.jax_compilation_cache_dir or ""),
                                    bool(callbacks)))
                if loaded is not None:
                    return loaded.executable, loaded.compile_time
        return original(cache_key, compile_options, backend, executable_devices, *args,
                        **kwargs)

    compilation_cache.get_executable_and_time = get_executable_and_time


_guarding: list[bool] = []


def guard_reads(refuse: Callable[[str, str], bool]) -> None:
    """For the life of the process: right before JAX reads the entry of a key from its cache
    dir, `refuse(cache dir, key)`; when it is true, JAX's lookup is a miss (JAX compiles,
    as for a key not in the cache). Installed once, before `serve_lookups` (whose prefetched
    executables are read by the prefetch itself, within its own bounds)."""
    import jax
    from jax._src import compilation_cache

    if _guarding:
        raise RuntimeError("guard_reads is installed once per process")
    _check_seam(compilation_cache)
    _guarding.append(True)
    original = compilation_cache.get_executable_and_time

    def get_executable_and_time(cache_key: str, *args: Any, **kwargs: Any) -> Any:
        cache_dir = str(jax.config.jax_compilation_cache_dir or "")
        if cache_dir and refuse(cache_dir, cache_key):
            return None, None  # JAX's own answer for a key it does not hold
        return original(cache_key, *args, **kwargs)

    compilation_cache.get_executable_and_time = get_executable_and_time


def _check_seam(compilation_cache: Any) -> None:
    """The names the prefetch uses exist, and `compiler` reaches the lookup through the
    module (a name it imported itself would bypass the wrapper)."""
    from jax._src import compiler

    missing = [name for name in SEAM if not callable(getattr(compilation_cache, name, None))]
    if missing or getattr(compiler, SEAM[0], None) is not None:
        import jax
        raise UnsupportedJaxVersion(unsupported_message(
            jax.__version__, f"jax._src.compilation_cache has no {', '.join(missing)}"
            if missing else f"jax._src.compiler imports {SEAM[0]} by name"))


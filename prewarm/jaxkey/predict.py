"""Predict JAX's persistent-compilation-cache key of a `jax.stages.Lowered` without compiling.

This is the ONE module of jaxwarm that touches JAX internals. It is tested on jax 0.10.2
only (`TESTED_JAX_VERSIONS`). jax 0.11.2 is deliberately not listed: its
`jax._src.cache_key` replaced the `IgnoreCallbacks` enum (which `_hash_computation` takes)
by a bool `ignore_custom_partitioning`, added Mosaic debug-info stripping to the
computation hash, and its `compiler.get_compile_options` handles overrides differently,
so a mirror written against 0.10.2 is not known to be exact there.

Why mirror instead of asking JAX: JAX computes the key only inside `compile_or_get_cached`,
i.e. after it has decided to compile. `predict_key` replays the steps that
`MeshComputation.compile` -> `UnloadedMeshExecutable.from_hlo` -> `_cached_compilation`
-> `compiler.compile_or_get_cached` -> `_resolve_compilation_strategy` ->
`compilation_cache.get_cache_key` -> `cache_key.get` take before the lookup, which costs
about a millisecond after lowering. It also returns the hash of each key component alone
(what `cache_key._log_cache_key_hash` logs as "hash of serialized <component>"), so that a
miss can be explained by naming the component that differs.

Not mirrored: with auto-PGLE or `jax_compilation_cache_expect_pgle`, JAX may switch to the
"PGLE-optimized" key after finding it in the cache; predicting that needs a cache read.

Importing this module does not import jax. What a differing component means lives in
`prewarm.jaxkey.components`, which the launcher also uses on keys recorded at run time.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from prewarm.jaxkey.components import differing_components

if TYPE_CHECKING:
    import jax

log = logging.getLogger("jaxwarm.jaxkey")

TESTED_JAX_VERSIONS: tuple[str, ...] = ("0.10.2",)
ALLOW_UNTESTED_ENV = "JAXWARM_ALLOW_UNTESTED_JAX"

class UnsupportedJaxVersion(RuntimeError):
    """The installed jax is not one whose internals this module was checked against."""


@dataclass(frozen=True)
class KeyPrediction:
    """A predicted cache key and the sha256 hex of each key component on its own."""

    key: str
    module_name: str
    components: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        """Plain dict for json.dump; `from_json` reads it back."""
        return {"key": self.key, "module_name": self.module_name,
                "components": dict(self.components)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyPrediction:
        return cls(key=str(data["key"]), module_name=str(data["module_name"]),
                   components={str(k): str(v) for k, v in data["components"].items()})


def explain_difference(expected: KeyPrediction, actual: KeyPrediction) -> list[str]:
    """Names of the components that differ, in JAX's order; empty if the keys match."""
    if expected.key == actual.key:
        return []
    return differing_components(expected.components, actual.components)


def predict_key(lowered: jax.stages.Lowered) -> KeyPrediction:
    """The persistent-cache key JAX will look up when `lowered.compile()` runs now.

    Reads the current jax config (cache dir, xla caches, ...) and environment (XLA_FLAGS,
    sys.argv) exactly like the compile would, so call it with the run's settings in place.
    """
    import jax

    _check_jax_version(jax.__version__)
    if not isinstance(lowered, jax.stages.Lowered):
        raise TypeError(f"predict_key needs a jax.stages.Lowered, got {type(lowered).__name__}")
    start = time.perf_counter()
    try:
        prediction = _predict(lowered)
    except (AttributeError, TypeError, KeyError) as ex:
        raise UnsupportedJaxVersion(
            f"jaxwarm's cache-key prediction failed on jax {jax.__version__}: a JAX internal "
            f"API it uses moved ({type(ex).__name__}: {ex}). Tested on "
            f"{', '.join(TESTED_JAX_VERSIONS)}.") from ex
    log.debug("predicted cache key %s in %.2f ms", prediction.key,
              1e3 * (time.perf_counter() - start))
    return prediction


def _check_jax_version(version: str) -> None:
    """Refuse untested jax versions unless JAXWARM_ALLOW_UNTESTED_JAX=1."""
    if version in TESTED_JAX_VERSIONS:
        return
    tested = ", ".join(TESTED_JAX_VERSIONS)
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        log.warning("jaxwarm's cache-key prediction is tested on jax %s; trying jax %s "
                    "anyway because %s=1", tested, version, ALLOW_UNTESTED_ENV)
        return
    raise UnsupportedJaxVersion(
        f"jaxwarm's cache-key prediction is tested on jax {tested}; this is jax {version}. "
        f"Pin jax=={TESTED_JAX_VERSIONS[-1]} or set {ALLOW_UNTESTED_ENV}=1 to try anyway.")


def _predict(lowered: jax.stages.Lowered) -> KeyPrediction:
    """Replay pxla/compiler up to `cache_key.get`, recording each component's bytes."""
    from jax._src.lib.mlir import ir

    hlo, devices, options, backend = _compile_inputs(lowered._lowering)
    full = hashlib.sha256()
    components: dict[str, str] = {}
    for name, hashfn in _key_entries(hlo, devices, options, backend):
        recorder = _RecordingHash()
        hashfn(recorder)
        components[name] = hashlib.sha256(recorder.data).hexdigest()
        full.update(recorder.data)
    module_name = ir.StringAttr(hlo.operation.attributes["sym_name"]).value
    return KeyPrediction(key=f"{module_name}-{full.hexdigest()}", module_name=module_name,
                         components=components)


def _compile_inputs(lowering: Any) -> tuple[Any, Any, Any, Any]:
    """(module, device array, compile options, backend) as `compile_or_get_cached` gets them.

    Mirrors `UnloadedMeshExecutable.from_hlo` and `_cached_compilation`; the options are
    then adjusted as `_resolve_compilation_strategy` does before hashing.
    """
    import numpy as np
    from jax._src import compilation_cache
    from jax._src.interpreters import mlir, pxla

    args = lowering.compile_args
    backend = args["backend"]
    device_list = lowering._device_list
    if device_list is None:
        raise ValueError("the lowering has no device assignment; JAX needs one to compile")
    if not compilation_cache.is_persistent_cache_enabled():
        log.warning("the persistent compilation cache is not enabled: the predicted key "
                    "lacks the cache-dir compile options and JAX will not look it up")
    in_shardings = tuple(pxla.maybe_concretize_mesh(s, device_list)
                         for s in args["in_shardings"])
    out_shardings = tuple(pxla.maybe_concretize_mesh(s, device_list)
                          for s in args["out_shardings"])
    hlo = lowering._hlo
    shape_poly_state = args.get("shape_poly_state")
    if shape_poly_state is not None and shape_poly_state.uses_dim_vars:
        hlo = mlir.refine_polymorphic_shapes(hlo)
    prop_in, prop_out = pxla.get_prop_to_input_output(
        in_shardings, out_shardings, len(args["ordered_effects"]))
    devices = np.vectorize(lambda i: device_list[i], otypes=[object])(
        np.arange(len(device_list)))
    options = pxla.create_compile_options(
        hlo, args["tuple_args"], prop_in, prop_out, backend, devices,
        dict(lowering._compiler_options_kvs))
    return hlo, devices, _options_for_lookup(options), backend


def _key_entries(hlo: Any, devices: Any, options: Any,
                 backend: Any) -> list[tuple[str, Callable[[Any], None]]]:
    """`cache_key.get`'s entries: same names, order and hash functions, same arguments.

    The arguments are those `compiler._get_cache_key` and `compilation_cache.get_cache_key`
    pass: callback stripping from config, compression from whether zstandard imported.
    """
    from jax._src import cache_key, compilation_cache
    from jax._src import config as jax_config
    from jax._src.lib import version_str as jaxlib_version_str

    ignore_callbacks = (cache_key.IgnoreCallbacks.CUSTOM_PARTITIONING
                        if jax_config.remove_custom_partitioning_ptr_from_cache_key.value
                        else cache_key.IgnoreCallbacks.NO)
    compression = "zstandard" if compilation_cache.zstandard is not None else "zlib"
    return [
        ("computation", lambda h: cache_key._hash_computation(h, hlo, ignore_callbacks)),
        ("jax_lib version", lambda h: h.update(jaxlib_version_str.encode("utf-8"))),
        ("backend version", lambda h: cache_key._hash_platform(h, backend)),
        ("XLA flags", lambda h: cache_key._hash_xla_flags(h, cache_key.get_flag_prefixes())),
        ("compile_options", lambda h: cache_key._hash_serialized_compile_options(
            h, options, strip_device_assignment=(backend.platform == "gpu"))),
        ("accelerator_config", lambda h: cache_key._hash_accelerator_config(h, devices)),
        ("compression", lambda h: cache_key._hash_string(h, compression)),
        ("custom_hook", lambda h: cache_key._hash_string(h, cache_key.custom_hook())),
    ]


def _options_for_lookup(options: Any) -> Any:
    """The compile options `_resolve_compilation_strategy` hashes for the first lookup.

    With auto-PGLE on and an FDO profile present JAX uses the "PGLE-optimized" key (the
    profile replaced by a sentinel); with auto-PGLE or expect-PGLE it disables command
    buffers for the first pass; otherwise the options are used as built.
    """
    from jax._src import config as jax_config

    auto_pgle = (jax_config.enable_pgle.value
                 and jax_config.pgle_profiling_runs.value > 0)
    fdo_profile = options.executable_build_options.fdo_profile
    if auto_pgle and fdo_profile is not None and len(fdo_profile):
        pgle_options = copy.deepcopy(options)
        pgle_options.executable_build_options.fdo_profile = b"pgle profiled"
        return pgle_options
    if auto_pgle or jax_config.compilation_cache_expect_pgle.value:
        first_pass = copy.deepcopy(options)
        first_pass.env_option_overrides += [("xla_gpu_enable_command_buffer", "")]
        return first_pass
    return options


class _RecordingHash:
    """Stands in for the hashlib object `cache_key`'s hash functions feed.

    Keeping each component's bytes lets one pass give both the full key (sha256 of all
    bytes in order) and each component's own hash, as `_log_cache_key_hash` defines it,
    without hashing the (large) serialized computation twice.
    """

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def update(self, data: bytes) -> None:
        self._chunks.append(bytes(data))

    @property
    def data(self) -> bytes:
        return b"".join(self._chunks)

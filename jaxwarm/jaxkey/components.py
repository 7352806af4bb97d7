"""Cache-key components and what a difference in each one means. Pure: no jax import.

JAX's persistent-cache key is a sha256 over eight components, in this order. jaxwarm records
the hash of each component alone (from JAX's own DEBUG log lines, at run time or when
`jaxwarm.jaxkey.predict.predict_key` asks JAX ahead of it), so a miss can be explained by
naming the components whose hashes differ and what usually changes them.
"""

from __future__ import annotations

COMPONENTS: tuple[str, ...] = (
    "computation",
    "jax_lib version",
    "backend version",
    "XLA flags",
    "compile_options",
    "accelerator_config",
    "compression",
    "custom_hook",
)

# Components every process of one job computes for itself on a platform, so they differ
# between its ranks by design: on CPU the accelerator config is the process's own devices
# (measured, jax 0.10.2: the only component that differs between the ranks of a CPU job).
# On GPU JAX strips the device assignment and hashes the job's topology: none differ.
PER_PROCESS: dict[str, tuple[str, ...]] = {"cpu": ("accelerator_config",)}

_LIKELY_CAUSES: dict[str, str] = {
    "computation": (
        "the traced program differs: an input's sharding (or a missing sharding on a dummy "
        "batch), donation, a static argument, a weak-typed Python scalar where weak typing "
        "changes a dtype (e.g. an int8 input plus a Python int), "
        "jax_default_matmul_precision, jax_use_shardy_partitioner, the function name, "
        "mesh shape/axis names/axis types (from jax 0.9 jax.make_mesh defaults to Explicit, "
        "Mesh(...) to Auto) or device order. Moving code to another file or line does not "
        "matter (debug info is stripped) unless "
        "jax_compilation_cache_include_metadata_in_key is on"
    ),
    "jax_lib version": "the jaxlib version differs (jax and jaxlib are released in lockstep)",
    "backend version": (
        "the backend platform or its version string differs (e.g. cpu vs gpu, or another "
        "CUDA/TPU runtime version)"
    ),
    "XLA flags": (
        "XLA_FLAGS (or LIBTPU_INIT_ARGS) or an --xla_* flag in sys.argv differs; dump flags "
        "and --xla_force_host_platform_device_count are excluded from the key"
    ),
    "compile_options": (
        "in/out shardings, the device assignment, jit/compile compiler_options, "
        "jax_use_shardy_partitioner, PGLE on in one (pgle.enabled or pgle.expect), XLA_FLAGS "
        "(XLA reads them into the compile options' debug options) or Explicit mesh axes "
        "(jax.make_mesh makes output shardings concrete) "
        "differ, or, before jax 0.11, the cache dir path string differs (the XLA "
        "autotune cache dir is stored in compile options: a symlink or relative path "
        "changes it; cache.xla_caches: none / JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none "
        "makes the path irrelevant), or the persistent cache was off in one process"
    ),
    "accelerator_config": (
        "device count or kind/topology differs (e.g. 16 host devices vs 8 with the same "
        "8-device mesh); on CPU each process hashes its own local topology, so processes "
        "other than 0 of a multi-process run get their own keys"
    ),
    "compression": "zstandard importable in one process and not the other",
    "custom_hook": (
        "jax._src.cache_key.custom_hook was replaced in one process and returns a "
        "different string there"
    ),
}


def differing_components(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """Names of the components whose hashes differ, in JAX's order.

    Names unknown to `COMPONENTS` (hashes from another jax version) come last, sorted.
    """
    names = set(expected) | set(actual)
    ordered = [c for c in COMPONENTS if c in names]
    ordered += sorted(names - set(COMPONENTS))
    return [c for c in ordered if expected.get(c) != actual.get(c)]


def likely_causes(component: str) -> str:
    """Plain-words likely causes of a difference in one key component."""
    return _LIKELY_CAUSES.get(
        component, f"unknown cache-key component {component!r} (another jax version?)")


def explain(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """One line per differing component: its name and its likely causes."""
    return [f"{component} differs: {likely_causes(component)}"
            for component in differing_components(expected, actual)]

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

# What a difference in each component most often is, in a few words: what can change it is
# catalogued in docs/verify.md ("What changes each component"), not printed with each miss.
_LIKELY_CAUSES: dict[str, str] = {
    "computation": "the program (shardings, donation, static args, mesh, code)",
    "jax_lib version": "another jaxlib",
    "backend version": "another backend platform or runtime version",
    "XLA flags": "XLA_FLAGS, LIBTPU_INIT_ARGS or --xla_* in sys.argv",
    "compile_options": "shardings, compiler_options, PGLE or (jax < 0.11) the cache path",
    "accelerator_config": "the device count or topology",
    "compression": "zstandard importable in one process only",
    "custom_hook": "jax's cache-key custom_hook returns another string",
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

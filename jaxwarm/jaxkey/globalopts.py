"""The process-global JAX settings that enter the cache key, read as one snapshot.

A trainer's set-up often changes them before it builds its step (MaxText's `initialize`
sets `jax_default_prng_impl=unsafe_rbg`, the shardy partitioner and
`jax_remove_size_one_mesh_axis_from_type`, and adds to `LIBTPU_INIT_ARGS`); the step
factory must apply the same, or the prewarm compiles another program. The PRNG
implementation even changes the key's shape, so the run's step has other input types and
looks like "another function" to a comparison by signature: the prewarm records this
snapshot with each manifest entry, and the training job, verify and the report name the
option that differs instead.
"""

from __future__ import annotations

import os

from jaxwarm.core.environment import HASHED_NAMES, variable_of

# jax.config options that change the traced program or its compile options (where this jax
# has them; PGLE's two empty the first compile's command buffers), and the environment
# variables JAX hashes with the XLA flags on every backend.
OPTIONS = ("jax_default_prng_impl", "jax_threefry_partitionable", "jax_use_shardy_partitioner",
           "jax_default_matmul_precision", "jax_enable_x64",
           "jax_remove_size_one_mesh_axis_from_type", "jax_enable_pgle",
           "jax_compilation_cache_expect_pgle")
ENVIRONMENT = HASHED_NAMES
# How the training job's line about a prewarmed function that missed under other settings
# starts (the report leads with these lines).
MISS_PREFIX = "process-global JAX settings differ from the prewarm's"


def snapshot() -> dict[str, str]:
    """This process's values now, as strings (unset environment variables as '')."""
    import jax

    values = {name: str(getattr(jax.config, name)) for name in OPTIONS
              if hasattr(jax.config, name)}
    values.update({name: os.environ.get(name, "") for name in ENVIRONMENT})
    return values


def differing(prewarm: dict[str, str], this: dict[str, str]) -> list[tuple[str, str, str]]:
    """(name, prewarm's value, this value) for each option both recorded with different
    values (an option one side's jax does not have is no difference). Pure."""
    return [(name, prewarm[name], this[name]) for name in (*OPTIONS, *ENVIRONMENT)
            if name in prewarm and name in this and prewarm[name] != this[name]]


def differences(prewarm: dict[str, str], this: dict[str, str], job: str = "run") -> list[str]:
    """`<option> differs: prewarm <value>, <job> <value>` for each `differing` option."""
    return [f"{name} differs: prewarm {shown(before)}, {job} {shown(now)}"
            for name, before, now in differing(prewarm, this)]


def variable(name: str) -> str:
    """The environment variable a setting is given to a job by: JAX_* for a jax option
    (the config's `jax:`), the variable itself for one of `ENVIRONMENT`."""
    return variable_of(name) if name.startswith("jax_") else name


def shown(value: str) -> str:
    return value if value else "(unset)"


def options_line(function: str, lines: list[str]) -> str:
    """The training job's one line for a prewarmed function that missed under other global
    settings (the report's headline says whether they changed since the prewarm)."""
    return f"{MISS_PREFIX} for {function} (it missed): {'; '.join(lines)}"

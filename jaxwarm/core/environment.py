"""The one job environment every job, rank and restart gets, built from the config alone.

The persistent-cache key hashes XLA_FLAGS and every JAX option that changes the lowering,
and before jax 0.11 also the cache path string (through the XLA autotune dir in the compile
options; `jaxwarm.jaxkey.versions.cache_path_in_key`). So the prewarm job and the training
job must see byte-identical values: this module is the only place that produces them, and
`jaxwarm.job.start.pinned.resolve_paths` fixes the path strings once, at launch; jobs read
them from the pinned config as they are, never resolving them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxwarm.core.config import (
    MOCK_LAYOUT,
    MOCK_XLA_FLAGS,
    Config,
)

# The environment variables JAX or XLA read that can enter a cache key, in one place: the
# job environment, the fingerprint of `--prewarm auto` (`jaxwarm.submit.fingerprint`)
# and the jobs' comparison of process-global settings (`jaxwarm.jaxkey.globalopts`)
# all read them here (`key_variable`).
# Owned: the job environment sets them; inherited values are dropped so that a stray
# `export XLA_FLAGS=...` in the submitting shell cannot split prewarm from run.
OWNED_PREFIXES = ("JAX_", "JAXWARM_")
OWNED_NAMES = ("XLA_FLAGS",)
# Passed on: every job inherits them from the launching shell (the local runner's processes,
# the environment sbatch exports) unless the config's `env` sets them. JAX hashes these into
# every key as they are, with XLA_FLAGS, on every backend:
HASHED_NAMES = ("LIBTPU_INIT_ARGS",)
# and these choose the devices, the accelerator's runtime or the compiler's toolchain (TPU
# topology, visible GPUs, CUDA/ROCm paths, XLA's client options), which enter the key through
# the devices and the backend.
DEVICE_PREFIXES = ("TPU_", "LIBTPU_", "CUDA_", "NVIDIA_", "ROCR_", "HIP_", "XLA_")

PLATFORM_NAMES = {"cpu": "cpu", "gpu": "cuda"}
# glibc malloc gives each thread that allocates an arena of its own, up to 8 per core, and
# keeps what it freed there: a CPU rank's XLA, gRPC and Gloo threads held about 11 MiB more
# a rank (159 MiB of proportional set size against 147, the tiny step at 8 ranks; docs/scale.md).
# Not a variable JAX or XLA read, so no cache key changes; set for CPU ranks only (a GPU
# rank's memory is the device's), and the config's `env` can set another value.
CPU_RANK_VARIABLES = {"MALLOC_ARENA_MAX": "2"}
# The sha256 of the pinned config as the launch wrote it (`config.config_digest`), set by
# the launcher beside JAXWARM_CONFIG (`jaxwarm.submit.jobs.JobSpec.pinned`): a job refuses
# a pinned config that is not that file (`config.load_pinned`).
PINNED_DIGEST = "JAXWARM_CONFIG_SHA256"
# A fresh id for each `jaxwarm verify`, in its job's environment (`jaxwarm.submit.jobs`): the
# job writes it into its result, and the command answers only from a result holding it.
VERIFY_INVOCATION = "JAXWARM_VERIFY_INVOCATION"
def jax_options(config: Config) -> dict[str, Any]:
    """JAX config options (jax_* names) the job runs with: the cache settings plus the user's.

    The in-job hook applies the same dict through jax.config.update, so a trainer started
    without the launcher still gets the config's cache settings. XLA's own sub-caches (the
    GPU autotune results) write with plain file I/O, so for a remote dir (gs://, s3://)
    they are turned off when the config is resolved (`jaxwarm.job.start.pinned`); only
    JAX's entries, written through etils/fsspec, go there.
    """
    cache = config.cache
    options: dict[str, Any] = {
        "jax_compilation_cache_dir": cache.dir,
        "jax_persistent_cache_min_compile_time_secs": cache.min_compile_time_secs,
        "jax_persistent_cache_min_entry_size_bytes": cache.min_entry_size_bytes,
        # a pinned config's setting is already the store's answer for its dir (`pinned`)
        "jax_persistent_cache_enable_xla_caches": cache.xla_caches,
        "jax_compilation_cache_max_size": cache.max_size,
    }
    # PGLE's options only when on: a run without PGLE keeps the environment (and keys) it had.
    if config.pgle.enabled:
        options["jax_enable_pgle"] = True
        options["jax_pgle_profiling_runs"] = config.pgle.profiling_runs
    if config.pgle.expect:
        options["jax_compilation_cache_expect_pgle"] = True
    options.update(config.jax)
    return options


def xla_flags(config: Config) -> str:
    """XLA_FLAGS of every job. A run prewarmed through a mock topology carries the flags the
    mocked compile needs (`config.MOCK_XLA_FLAGS`) in every job, training included: every
    XLA flag is part of the key, so a flag only the prewarm had would make the run miss."""
    flags = list(config.xla_flags)
    if config.prewarm.layout == MOCK_LAYOUT:
        flags += [flag for flag in MOCK_XLA_FLAGS if flag not in flags]
    if config.topology.platform == "cpu":
        flags.append(f"--xla_force_host_platform_device_count="
                     f"{config.topology.devices_per_process}")
    return " ".join(flags)


def variable_of(option: str) -> str:
    """The environment variable JAX reads a `jax_*` option from."""
    return f"JAX_{option[len('jax_'):].upper()}"


def size_cap(environment: dict[str, str]) -> int:
    """The cache size cap a job ran with (from its recorded environment); -1 for none."""
    value = environment.get(variable_of("jax_compilation_cache_max_size"), "-1")
    return int(value) if value.lstrip("-").isdigit() else -1


def env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def job_environment(config: Config, config_path: str | Path) -> dict[str, str]:
    """The variables a job of this run exports, for every task and every restart.

    `config` must already be path-resolved (`jaxwarm.job.start.pinned.resolve_paths`) and
    `config_path` is the pinned copy that jobs read. Pure: same inputs, same dict, in a
    stable order.
    """
    env = {variable_of(name): env_value(value) for name, value in jax_options(config).items()}
    env["JAX_PLATFORMS"] = PLATFORM_NAMES[config.topology.platform]
    env["XLA_FLAGS"] = xla_flags(config)
    env["JAXWARM_CONFIG"] = str(config_path)
    env["JAXWARM_RUN_DIR"] = str(config.run_dir)
    if config.topology.platform == "cpu":
        env.update(CPU_RANK_VARIABLES)
    env.update(config.env)
    return env


def owned(name: str) -> bool:
    return name in OWNED_NAMES or name.startswith(OWNED_PREFIXES)


def key_variable(name: str) -> bool:
    """Whether JAX or XLA read this environment variable in a way that can change a key."""
    return owned(name) or name in HASHED_NAMES or name.startswith(DEVICE_PREFIXES)


def key_environment(inherited: dict[str, str], job_env: dict[str, str]) -> dict[str, str]:
    """The key variables a job of this launch runs with: its own, and what it inherits."""
    merged = merge_environment(inherited, job_env)
    return {name: merged[name] for name in sorted(merged) if key_variable(name)}


def dropped_variables(inherited: Mapping[str, str], job_env: dict[str, str]) -> list[str]:
    """The inherited variables a job does not get as they are: owned by the job environment,
    and either not set by it or set to another value (an `export XLA_FLAGS=...` of the
    submitting shell). Said at launch, so that a flag the user meant for the run is not
    lost without a word."""
    return sorted(name for name, value in inherited.items()
                  if owned(name) and job_env.get(name) != value)


def merge_environment(inherited: dict[str, str], job_env: dict[str, str]) -> dict[str, str]:
    """The inherited environment without the variables the job owns, plus the job's own."""
    merged = {k: v for k, v in inherited.items() if not owned(k)}
    merged.update(job_env)
    return merged

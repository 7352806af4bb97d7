"""The job environment: one canonical cache path string for every job, however it is named,
and no other (the shell's cache dir never reaches a job)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jaxwarm.core.config import expand_variables, load_config
from jaxwarm.core.environment import (
    VERIFY_INVOCATION,
    dropped_variables,
    job_environment,
    key_variable,
    merge_environment,
)
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import VERIFY, InitReport
from jaxwarm.core.rundir import report_path
from jaxwarm.job.start.pinned import config_from_env, resolve_paths
from jaxwarm.submit.jobs import prewarm_job, train_job, verify_job
from jaxwarm.submit.prepare import pin_config
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, run_cli


def pinned_env(tmp_path: Path, cache: str, cwd: Path) -> dict[str, str]:
    config = load_config(DEMO, [f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={cache}"])
    config, pinned = pin_config(config, base=cwd)
    return job_environment(config, pinned)


# The demo config's own flag, then the fake-device count of its layout.
DEMO_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=4"


def test_prewarm_and_train_get_the_same_environment(tmp_path: Path) -> None:
    config, pinned = pin_config(load_config(DEMO, [f"run.out_dir={tmp_path}",
                                                   f"cache.dir={tmp_path / 'c'}"]))
    assert prewarm_job(config, pinned).env == train_job(config, pinned).env
    env = prewarm_job(config, pinned).env
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "c")
    assert env["XLA_FLAGS"] == DEMO_XLA_FLAGS
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.5"
    assert env["JAXWARM_CONFIG"] == str(pinned)


def test_symlinked_and_relative_cache_dirs_give_one_canonical_string(tmp_path: Path) -> None:
    real = tmp_path / "real-cache"
    real.mkdir()
    link = tmp_path / "link-cache"
    link.symlink_to(real)
    work = tmp_path / "work"
    work.mkdir()
    direct = pinned_env(tmp_path, str(real), work)["JAX_COMPILATION_CACHE_DIR"]
    through_link = pinned_env(tmp_path, str(link), work)["JAX_COMPILATION_CACHE_DIR"]
    relative = pinned_env(tmp_path, "../link-cache", work)["JAX_COMPILATION_CACHE_DIR"]
    dotted = pinned_env(tmp_path, f"{tmp_path}/./work/../real-cache/", work)[
        "JAX_COMPILATION_CACHE_DIR"]
    assert direct == through_link == relative == dotted == os.path.realpath(real)


def test_pinned_config_round_trips_to_the_same_environment(tmp_path: Path) -> None:
    """A job reading the pinned file (another cwd, node or restart) builds the same env."""
    config, pinned = pin_config(load_config(DEMO, [f"run.out_dir={tmp_path}",
                                                   "cache.dir=relative-cache"]), base=tmp_path)
    again = load_config(pinned)
    assert job_environment(again, pinned) == job_environment(config, pinned)


def test_inherited_jax_variables_are_replaced(tmp_path: Path) -> None:
    config, pinned = pin_config(load_config(DEMO, [f"run.out_dir={tmp_path}",
                                                   f"cache.dir={tmp_path / 'c'}"]))
    inherited = {"PATH": "/bin", "XLA_FLAGS": "--xla_stray", "JAX_ENABLE_X64": "1",
                 "JAXWARM_CONFIG": "/elsewhere"}
    merged = merge_environment(inherited, job_environment(config, pinned))
    assert merged["PATH"] == "/bin"
    assert "JAX_ENABLE_X64" not in merged
    assert merged["XLA_FLAGS"] == DEMO_XLA_FLAGS
    assert merged["JAXWARM_CONFIG"] == str(pinned)


def test_user_flags_and_options_reach_the_environment(tmp_path: Path) -> None:
    config, pinned = pin_config(load_config(
        DEMO, [f"run.out_dir={tmp_path}", f"cache.dir={tmp_path / 'c'}",
               "xla_flags=[--xla_cpu_enable_fast_math=false]",
               "jax.jax_default_matmul_precision=highest", "env={MY_VAR: 1}"]))
    env = job_environment(config, pinned)
    assert env["XLA_FLAGS"] == ("--xla_cpu_enable_fast_math=false "
                                "--xla_force_host_platform_device_count=4")
    assert env["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"
    assert env["MY_VAR"] == "1"


def test_cpu_ranks_get_two_malloc_arenas_unless_the_config_says_otherwise(
        tmp_path: Path) -> None:
    """MALLOC_ARENA_MAX bounds a CPU rank's memory (docs/scale.md); it is no key variable,
    so it changes no cache key, and a GPU job's environment does not get it."""
    base = [f"run.out_dir={tmp_path}", f"cache.dir={tmp_path / 'c'}"]
    assert job_environment(*pin_config(load_config(DEMO, base)))["MALLOC_ARENA_MAX"] == "2"
    mine = job_environment(*pin_config(load_config(DEMO, [*base, "env={MALLOC_ARENA_MAX: 8}"])))
    assert mine["MALLOC_ARENA_MAX"] == "8"
    gpu = job_environment(*pin_config(load_config(DEMO, [*base, "topology.platform=gpu"])))
    assert "MALLOC_ARENA_MAX" not in gpu
    assert not key_variable("MALLOC_ARENA_MAX")


def test_pgle_reaches_every_job_the_same_and_only_when_on(tmp_path: Path) -> None:
    """PGLE (or expecting its entries) changes the key of the first compile, so prewarm,
    verify and train get the same options; off, no job's environment changes."""
    base = [f"run.out_dir={tmp_path}", f"cache.dir={tmp_path / 'c'}"]
    off = job_environment(*pin_config(load_config(DEMO, base)))
    assert not [name for name in off if "PGLE" in name]
    config, pinned = pin_config(load_config(
        DEMO, [*base, "pgle.enabled=true", "pgle.profiling_runs=5", "pgle.expect=true"]))
    jobs = [prewarm_job(config, pinned), verify_job(config, pinned), train_job(config, pinned)]
    # The same but for the id each verify gets, which no key sees.
    envs = [{k: v for k, v in job.env.items() if k != VERIFY_INVOCATION} for job in jobs]
    assert all(env == envs[0] for env in envs)
    assert {name: value for name, value in jobs[0].env.items() if "PGLE" in name} == {
        "JAX_ENABLE_PGLE": "true", "JAX_PGLE_PROFILING_RUNS": "5",
        "JAX_COMPILATION_CACHE_EXPECT_PGLE": "true"}


def test_a_job_uses_the_pinned_paths_as_pinned(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a node where part of the pinned path is a symlink (autofs), resolving it again
    would give another string, another key and a cache-dir error: the job must not."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "mnt").symlink_to(real)
    config, pinned = pin_config(load_config(DEMO, [f"run.out_dir={tmp_path / 'runs'}",
                                                   f"cache.dir={tmp_path / 'c'}"]))
    through_link = str(tmp_path / "mnt" / "cache")
    pinned.write_text(pinned.read_text().replace(config.cache.dir, through_link))
    monkeypatch.setenv("JAXWARM_CONFIG", str(pinned))
    assert config_from_env().cache.dir == through_link
    # A YAML file given by hand, which no launch resolved, is resolved.
    assert config_from_env(pinned).cache.dir == str(real / "cache")


def test_an_empty_variable_in_a_path_is_unset_not_nothing() -> None:
    env = {"TMPDIR": "", "NODE": "n1", "SCRATCH": "/scratch"}
    assert expand_variables("$SCRATCH/${NODE}/x", env) == ("/scratch/n1/x", [])
    assert expand_variables("$TMPDIR/x", env) == ("$TMPDIR/x", ["TMPDIR"])
    assert expand_variables("${GONE}/$TMPDIR", env) == ("${GONE}/$TMPDIR", ["GONE", "TMPDIR"])


def test_the_variables_a_job_does_not_get_as_inherited_are_named() -> None:
    job = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    shell = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true", "JAX_PLATFORMS": "cpu",
             "JAX_ENABLE_X64": "1", "JAXWARM_RUN_DIR": "/elsewhere", "HOME": "/home/u"}
    # JAX_PLATFORMS arrives as it was; HOME is not the job environment's.
    assert dropped_variables(shell, job) == ["JAXWARM_RUN_DIR", "JAX_ENABLE_X64", "XLA_FLAGS"]
    assert dropped_variables({"HOME": "/home/u"}, job) == []


@pytest.mark.e2e
def test_a_launch_names_the_shell_s_xla_flags_it_drops(tmp_path: Path) -> None:
    result = run_cli("verify", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                     f"cache.dir={tmp_path / 'cache'}", *ONE_PROCESS, *FAST_STEP,
                     env={"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    assert result.returncode == 1, result.stderr[-3000:]  # COLD: an empty cache
    named = [line for line in result.stderr.splitlines() if "not passed on" in line]
    assert named == ["jaxwarm: the shell's XLA_FLAGS is not passed on to the jobs: jaxwarm "
                     "gives every job its own (set them in the config's xla_flags, jax or "
                     "env section)"], result.stderr[-3000:]
    report = read_record(InitReport, report_path(tmp_path / "runs" / "demo", VERIFY, 0, 0))
    assert report is not None
    job_env = report.environment
    assert "fast_math" not in job_env["XLA_FLAGS"]


@pytest.mark.hostile
def test_the_shell_cache_dir_never_reaches_a_job(tmp_path: Path) -> None:
    config = resolve_paths(load_config(DEMO, [f"cache.dir={tmp_path / 'cache'}"]))
    merged = merge_environment({"JAX_COMPILATION_CACHE_DIR": "/attacker", "HOME": "/h"},
                               job_environment(config, tmp_path / "c.yaml"))
    assert merged["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache")

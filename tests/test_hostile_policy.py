"""Class 2 of issue 17: one cache-dir policy that nothing bypasses. Every way a dir can reach
JAX (the cache section, the `jax:` section, `env:`, the shell, the trainer itself) goes
through the same checks or is refused with one line; `.` and unsupported URL schemes are
refused; a group-writable parent without the sticky bit needs the trusted group; and a dir
swapped after the job checked it is refused at the next lookup, not loaded from."""

from __future__ import annotations

import grp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.environment import job_environment, merge_environment
from jaxwarm.core.errors import ConfigError
from jaxwarm.job.start.pinned import resolve_paths
from jaxwarm.store.store import LocalStore
from testing.jaxproc import jax_env
from tests.conftest import DEMO, run_cli
from tests.hostile import assert_refused, snapshot


def refused(tmp_path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(DEMO, [f"run.out_dir={tmp_path / 'runs'}", *overrides])
    return str(caught.value)


@pytest.mark.parametrize(("override", "fragment"), [
    ("jax.jax_compilation_cache_dir=/elsewhere", "set cache.dir instead"),
    ("jax.jax_compilation_cache_max_size=10", "set cache.max_size instead"),
    ("jax.jax_persistent_cache_min_compile_time_secs=0",
     "set cache.min_compile_time_secs instead"),
    ("jax.jax_enable_pgle=true", "the pgle section owns this option"),
    ("jax.jax_compilation_cache_expect_pgle=true", "set pgle.expect instead"),
    ("pgle.profiling_runs=0", "pgle.profiling_runs: expected a positive integer, got 0"),
    ("env.JAX_COMPILATION_CACHE_DIR=/elsewhere", "jaxwarm sets this variable itself"),
    ("cache.dir=.", "would mean the working directory"),
    ("cache.dir=./", "would mean the working directory"),
    ("cache.dir=sub/..", "would mean the working directory"),
    ("cache.dir=file:///tmp/x", "got a file:// URL"),
    ("cache.dir=http://host/x", "got a http:// URL"),
])
def test_every_other_way_to_a_cache_dir_is_one_line(tmp_path: Path, override: str,
                                                      fragment: str) -> None:
    message = refused(tmp_path, override)
    assert message.startswith(f"{DEMO}: ") and fragment in message, message


@pytest.mark.e2e
def test_a_jax_section_cache_dir_is_refused_by_render_and_launch(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    before = snapshot(tmp_path)
    for command in (("render", "--job", "train"), ("launch", "--local", "--no-prewarm")):
        result = run_cli(command[0], str(DEMO), *command[1:], f"run.out_dir={tmp_path / 'runs'}",
                         f"jax.jax_compilation_cache_dir={open_dir / 'cache'}")
        assert_refused(result, "jax.jax_compilation_cache_dir", "set cache.dir instead")
    assert snapshot(tmp_path) == before


def test_the_shell_cache_dir_never_reaches_a_job(tmp_path: Path) -> None:
    config = resolve_paths(load_config(DEMO, [f"cache.dir={tmp_path / 'cache'}"]))
    merged = merge_environment({"JAX_COMPILATION_CACHE_DIR": "/attacker", "HOME": "/h"},
                               job_environment(config, tmp_path / "c.yaml"))
    assert merged["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache")


def groups_of_root() -> tuple[int, int]:
    """Two gids: one to trust and one not to (any two groups of this machine)."""
    gids = sorted({g.gr_gid for g in grp.getgrall()} - {0})
    return gids[0], gids[1]


@pytest.mark.e2e
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a dir another group")
def test_a_group_writable_parent_needs_the_sticky_bit_or_the_trusted_group(
        tmp_path: Path) -> None:
    trusted, other = groups_of_root()
    parent = tmp_path / "team"
    parent.mkdir()
    os.chown(parent, -1, other)
    parent.chmod(0o2775)  # group members may rename the user's cache dir away
    cache = parent / "cache"
    cache.mkdir(mode=0o700)
    config = load_config(DEMO, [f"cache.dir={cache}"])
    with pytest.raises(ConfigError) as caught:
        LocalStore(cache).check(config.cache, "c.yaml")
    assert f"parent {parent} is writable by group {other} without the sticky bit" \
        in str(caught.value)
    before = snapshot(tmp_path)
    assert_refused(run_cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                           f"cache.dir={cache}"), f"parent {parent}", "sticky bit")
    assert snapshot(tmp_path) == before
    parent.chmod(0o3775)  # sticky: only the owner may rename what it owns
    assert LocalStore(cache).check(config.cache, "c.yaml") is not None
    parent.chmod(0o2775)
    os.chown(parent, -1, trusted)
    named = load_config(DEMO, [f"cache.dir={cache}",
                               f"cache.trusted_group={grp.getgrgid(trusted).gr_name}"])
    assert LocalStore(cache).check(named.cache, "c.yaml") is not None


def test_a_dir_swapped_after_its_check_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    config = load_config(DEMO, [f"cache.dir={cache}"])
    store = LocalStore(cache)
    checked = store.check(config.cache, "c.yaml")
    assert store.recheck(config.cache, "c.yaml", checked) == checked
    os.rename(cache, tmp_path / "mine")  # what renameat2(RENAME_EXCHANGE) does in one step
    (tmp_path / "theirs").mkdir(mode=0o700)
    os.rename(tmp_path / "theirs", cache)
    with pytest.raises(ConfigError) as caught:
        store.recheck(config.cache, "c.yaml", checked)
    assert "is not the directory checked when the job started" in str(caught.value)


SWAP_IN_JOB = r'''
import os, sys
import jax, jax.numpy as jnp
from jaxwarm import enable_cache
from jaxwarm.core.config import load_config
from jaxwarm.core.errors import ConfigError

config = load_config(sys.argv[1], sys.argv[2:])
enable_cache(config)
jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()
cache = config.cache.dir
os.rename(cache, cache + ".mine")
os.mkdir(cache + ".theirs", 0o700)
os.rename(cache + ".theirs", cache)
try:
    jax.jit(lambda x: x * 3)(jnp.ones(3)).block_until_ready()
except ConfigError as exc:
    print("REFUSED", exc)
    sys.exit(0)
print("LOADED FROM THE SWAPPED DIR")
sys.exit(1)
'''


@pytest.mark.e2e
def test_a_job_refuses_a_dir_swapped_between_two_compiles(tmp_path: Path) -> None:
    """The one JAX process of this file: the in-job re-check runs before each lookup."""
    proc = subprocess.run([sys.executable, "-c", SWAP_IN_JOB, str(DEMO),
                           f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'c'}",
                           "cache.min_compile_time_secs=0", "topology.processes_per_node=1",
                           "topology.devices_per_process=8"],
                          env=jax_env(8), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout and "is not the directory checked" in proc.stdout

"""The cache dir's safety (jaxwarm/store/security.py, under the trust rule of
jaxwarm/core/trust.py): one cache-dir policy that nothing
bypasses (classes 2 and 3 of issue 17). A dir anyone else may write, or whose parent lets
anyone else swap it, is refused with one line before anything is written: writable by
group without `cache.trusted_group`, a parent writable by every user or by a group without
the sticky bit, a parent another user owns, a symlink into such a parent, a read-only
mount; a dir swapped after the job checked it is refused at the next lookup, not loaded
from. A cache shared with `cache.trusted_group` works for the whole group: two non-root
users of one group (created here, removed after) use one cache, the first prewarms, the
second launches (prewarm, train), verifies and prunes, and every file and dir jaxwarm (or
JAX, in its jobs) creates there is group read/write, every dir setgid. (The other ways to a
cache dir, the `jax:` section, `env:` and the shell: tests/test_config.py and
tests/test_environment.py.)"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import GROUP_DIR
from jaxwarm.core.rundir import reports_dir
from jaxwarm.core.trust import Trust
from jaxwarm.store.store import LocalStore
from jaxwarm.submit.prepare import pin_config
from testing.jaxproc import jax_env
from tests.conftest import DEMO, FAST_STEP, Cli
from tests.hostile import assert_refused, snapshot
from tests.test_store_commands import TINY, assert_ok, config_args, job_args
from tests.users import as_user, two_users


def stat_result(mode: int, uid: int, gid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFDIR | mode, 0, 0, 2, uid, gid, 0, 0, 0, 0))


def test_dir_safety_rules() -> None:
    me, shared = Trust(uid=1000, gid=None), Trust(uid=1000, gid=500)
    assert me.dir_problem(stat_result(0o700, 1000, 1000)) is None
    assert "writable by every user" in me.dir_problem(stat_result(0o777, 1000, 1000))
    assert "not by you" in me.dir_problem(stat_result(0o700, 1001, 1001))
    # Shared on purpose: another member's dir is fine if it belongs to the trusted group...
    assert shared.dir_problem(stat_result(0o2770, 1001, 500)) is None
    # ...but not another group's, and never a world-writable one.
    assert "trusted group" in shared.dir_problem(stat_result(0o2770, 1001, 501))
    assert shared.dir_problem(stat_result(0o2777, 1001, 500)) is not None
    assert me.parent_problem(stat_result(0o1777, 0, 0)) is None  # /tmp: sticky
    assert me.parent_problem(stat_result(0o777, 0, 0)) is not None
    # A group-writable parent lets every member swap the dir, unless the group is trusted.
    assert "cache.trusted_group" in me.parent_problem(stat_result(0o2775, 0, 500))
    assert shared.parent_problem(stat_result(0o2775, 0, 500)) is None
    # Its owner may always rename in it: root, you, or a member of the trusted group only.
    assert me.parent_problem(stat_result(0o755, 1000, 1000)) is None
    assert "owned by uid 1001" in me.parent_problem(stat_result(0o755, 1001, 1001))
    assert "owned by uid 1001" in me.parent_problem(stat_result(0o1777, 1001, 0))
    assert shared.parent_problem(stat_result(0o2770, 1001, 500)) is None
    assert "owned by uid 1001" in shared.parent_problem(stat_result(0o755, 1001, 501))


def launch(cli: Cli, tmp_path: Path, cache: str | Path) -> subprocess.CompletedProcess[str]:
    """A launch of the demo with its cache at `cache`, in this process: each one here is
    refused before any job starts."""
    return cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
               f"cache.dir={cache}")


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_group_writable_cache_dir_needs_a_trusted_group(tmp_path: Path, cli: Cli) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o775)
    before = snapshot(tmp_path)
    assert_refused(launch(cli, tmp_path, cache), "cache.dir", "is writable by group",
                   "cache.trusted_group")
    assert_refused(cli("cache", "ls", str(cache)), "is writable by group")
    assert snapshot(tmp_path) == before


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_symlink_into_a_world_writable_parent_is_refused_by_the_launcher(
        tmp_path: Path, cli: Cli) -> None:
    open_dir = tmp_path / "open"
    (open_dir / "real-cache").mkdir(parents=True, mode=0o700)
    open_dir.chmod(0o777)  # no sticky bit: anyone may swap real-cache
    link = tmp_path / "cache-link"
    link.symlink_to(open_dir / "real-cache")
    before = snapshot(tmp_path)
    assert_refused(launch(cli, tmp_path, link), f"cache.dir: parent {open_dir}",
                   "writable by every user")
    assert snapshot(tmp_path) == before


def groups_of_root() -> tuple[int, int]:
    """Two gids: one to trust and one not to (any two groups of this machine)."""
    gids = sorted({g.gr_gid for g in grp.getgrall()} - {0})
    return gids[0], gids[1]


@pytest.mark.e2e
@pytest.mark.hostile
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a dir another group")
def test_a_group_writable_parent_needs_the_sticky_bit_or_the_trusted_group(
        tmp_path: Path, cli: Cli) -> None:
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
    assert_refused(launch(cli, tmp_path, cache), f"parent {parent}", "sticky bit")
    assert snapshot(tmp_path) == before
    parent.chmod(0o3775)  # sticky: only the owner may rename what it owns
    assert LocalStore(cache).check(config.cache, "c.yaml") is not None
    parent.chmod(0o2775)
    os.chown(parent, -1, trusted)
    named = load_config(DEMO, [f"cache.dir={cache}",
                               f"cache.trusted_group={grp.getgrgid(trusted).gr_name}"])
    assert LocalStore(cache).check(named.cache, "c.yaml") is not None


READ_ONLY = Path("/proc/sys")  # a read-only mount, even for root


@pytest.mark.e2e
@pytest.mark.hostile
@pytest.mark.skipif(os.access(READ_ONLY, os.W_OK), reason="no read-only mount to test on")
def test_a_read_only_cache_dir_is_one_line_before_any_job(tmp_path: Path, cli: Cli) -> None:
    before = snapshot(tmp_path)
    for command in ("launch", "prewarm", "verify"):
        result = cli(command, str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                     f"cache.dir={READ_ONLY / 'jax-cache'}")
        assert_refused(result, "cache.dir", f"cannot be created: {READ_ONLY} read-only for you")
    assert snapshot(tmp_path) == before


@pytest.mark.e2e
def test_unsafe_cache_dirs_are_refused_before_anything_runs(tmp_path: Path, cli: Cli) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    refused = cli("launch", *job_args(tmp_path, shared, *TINY))
    assert refused.returncode == 2
    line, = refused.stderr.strip().splitlines()
    assert "cache.dir" in line and "writable by every user" in line and str(DEMO) in line
    assert not reports_dir(tmp_path / "runs" / "demo").exists()
    if os.geteuid() != 0:
        foreign = Path("/usr")  # owned by root, not by this user
    else:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o770)
        os.chown(foreign, 65534, 0)
    refused = cli("launch", *job_args(tmp_path, foreign, *TINY))
    assert refused.returncode == 2
    assert "not by you" in refused.stderr and "cache.trusted_group" in refused.stderr
    if os.geteuid() == 0:
        # Shared on purpose: another member owns it, the config trusts its group.
        trusted = cli("render", *config_args(tmp_path, foreign, *TINY, "cache.trusted_group=root"),
                      "--job", "train")
        assert_ok(trusted)
    new = tmp_path / "new-cache"
    pin_config(load_config(DEMO, config_args(tmp_path, new, *TINY)[1:]))
    assert new.stat().st_mode & 0o777 == 0o700


@pytest.mark.hostile
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
@pytest.mark.hostile
def test_a_job_refuses_a_dir_swapped_between_two_compiles(tmp_path: Path) -> None:
    """A real JAX process: the in-job re-check runs before each lookup."""
    proc = subprocess.run([sys.executable, "-c", SWAP_IN_JOB, str(DEMO),
                           f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'c'}",
                           "cache.min_compile_time_secs=0", "topology.processes_per_node=1",
                           "topology.devices_per_process=8"],
                          env=jax_env(8), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout and "is not the directory checked" in proc.stdout


def test_share_with_group_opens_what_xla_made_and_only_in_a_group_dir(tmp_path: Path) -> None:
    """XLA makes its sub-cache dirs with mkdir's 0755, which a group job's umask 007 leaves
    0750 (setgid from the cache dir): measured on an H200, the next member of the group was
    refused its autotune results there. The store makes each dir this user owns below a
    group-shared cache dir group-writable, each file in it group read/write; a dir another
    user owns, and every dir of a cache dir not shared with a group, stay as they are."""
    old_umask = os.umask(0o007)
    try:
        for shared in (True, False):
            cache = tmp_path / ("group" if shared else "private") / "cache"
            cache.mkdir(parents=True)
            cache.chmod(0o2770 if shared else 0o700)
            xla = cache / "xla_gpu_per_fusion_autotune_cache_dir" / "ed0e56ab8b2a0ecb"
            for made in (xla.parent, xla):  # as XLA does, each: 0750 under the umask
                made.mkdir(mode=0o755)
            (xla / "result.textproto").write_text("autotune")
            theirs = cache / "theirs"
            theirs.mkdir(mode=0o755)
            os.chown(theirs, 65534, -1)  # another user's: not this user's to change
            changed = LocalStore(cache).share_with_group()
            modes = {path: stat.S_IMODE(path.stat().st_mode)
                     for path in (xla.parent, xla, xla / "result.textproto", theirs)}
            if shared:
                assert changed == [xla.parent, xla]
                assert modes[xla.parent] == modes[xla] == GROUP_DIR
                assert modes[xla / "result.textproto"] & 0o060 == 0o060
                assert modes[theirs] & 0o070 == 0o050
            else:
                assert changed == [] and modes[xla] & 0o070 == 0o050
    finally:
        os.umask(old_umask)


@pytest.fixture
def team() -> Iterator[tuple[str, str, str, Path]]:
    with two_users() as made:
        yield made


@pytest.mark.e2e
@pytest.mark.hostile
def test_two_members_share_one_cache(team: tuple[str, str, str, Path]) -> None:
    group, first, second, base = team
    shared = base / "team"  # the group's dir: the first member's, group-writable
    shared.mkdir()
    shutil.chown(shared, first, group)
    shared.chmod(0o2770)
    cache = shared / "cache"
    # One process, 2 devices, conftest's FAST_STEP: what is checked is who may write what
    # JAX and jaxwarm create, which no compile time changes.
    common = [f"cache.dir={cache}", f"cache.trusted_group={group}",
              "topology.processes_per_node=1", "topology.devices_per_process=2",
              "mesh.axes={data: 1, fsdp: 2}", *FAST_STEP, "train.steps=2"]
    made = as_user(first, base, "prewarm", str(DEMO), "--local",
                   f"run.out_dir={base / f'home-{first}' / 'runs'}", *common)
    assert made.returncode == 0, made.stderr[-3000:]
    launched = as_user(second, base, "launch", str(DEMO), "--local",
                       f"run.out_dir={base / f'home-{second}' / 'runs'}", *common)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "Permission denied" not in launched.stderr
    checked = as_user(second, base, "cache", "verify", str(DEMO), *common)
    assert checked.returncode == 0, checked.stderr[-3000:]
    pruned = as_user(second, base, "cache", "prune", str(DEMO), *common, "--max-size", "0",
                     "--include-pinned")
    assert pruned.returncode == 0, pruned.stderr[-3000:]
    assert "pruned" in pruned.stdout and not list(cache.glob("*-cache"))
    owners = set()
    for path in [cache, *cache.rglob("*")]:
        info = path.lstat()
        owners.add(info.st_uid)
        mode = stat.S_IMODE(info.st_mode)
        if path.is_dir():
            assert mode & GROUP_DIR == GROUP_DIR, (path, oct(mode))
        else:
            assert mode & 0o060 == 0o060, (path, oct(mode))
    assert len(owners) == 2  # both members wrote there


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_parent_another_user_owns_is_refused_unless_the_group_shares_it(
        team: tuple[str, str, str, Path]) -> None:
    # The first member's dir, 0755 (nobody else may write it), holds the second member's
    # own cache dir: the first may still rename it away and put theirs in its place.
    group, first, second, base = team
    theirs = base / "theirs"
    theirs.mkdir()
    shutil.chown(theirs, first, "root")
    theirs.chmod(0o755)
    cache = theirs / "cache"
    cache.mkdir()
    shutil.chown(cache, second, group)
    cache.chmod(0o700)
    refused = as_user(second, base, "cache", "ls", str(DEMO), f"cache.dir={cache}")
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert line.startswith(f"jaxwarm: error: {DEMO}: cache.dir: parent {theirs} is owned by "
                           f"uid {pwd.getpwnam(first).pw_uid}, not by you"), line
    launched = as_user(second, base, "launch", str(DEMO), "--local", f"cache.dir={cache}",
                       f"run.out_dir={base / f'home-{second}' / 'runs'}")
    assert launched.returncode == 2 and f"parent {theirs} is owned by" in launched.stderr
    assert not (base / f"home-{second}" / "runs").exists()
    assert sorted(path.name for path in cache.iterdir()) == []
    # The same dir in the group the cache is shared with: the group's to share.
    shutil.chown(theirs, first, group)
    shared = as_user(second, base, "cache", "ls", str(DEMO), f"cache.dir={cache}",
                     f"cache.trusted_group={group}")
    assert "is owned by" not in shared.stderr, shared.stderr
    # Your own dirs and root's: accepted as ever.
    mine = base / f"home-{second}" / "cache"
    own = as_user(second, base, "cache", "ls", str(DEMO), f"cache.dir={mine}")
    assert "parent" not in own.stderr, own.stderr

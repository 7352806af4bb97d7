"""Class 3 of issue 17: a cache shared with `cache.trusted_group` works for the whole group.
Two non-root users of one group (created here, removed after) use one cache: the first
prewarms, the second launches (prewarm, train), verifies and prunes. Every file and dir
jaxwarm (or JAX, in its jobs) creates there is group read/write, every dir setgid."""

from __future__ import annotations

import pwd
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxwarm.core.files import GROUP_DIR, make_dir, modes_in
from tests.conftest import DEMO, FAST_STEP
from tests.users import as_user, two_users


@pytest.fixture
def team() -> Iterator[tuple[str, str, str, Path]]:
    with two_users() as made:
        yield made


@pytest.mark.e2e
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


def test_modes_follow_the_dir(tmp_path: Path) -> None:
    private = make_dir(tmp_path / "private")
    assert stat.S_IMODE(private.stat().st_mode) == 0o700 and modes_in(private)[0] == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2770)
    inner = make_dir(shared / "jaxwarm-locks")
    assert stat.S_IMODE(inner.stat().st_mode) == 0o2770 and modes_in(shared)[0] == 0o660

"""Who may write the cache dir: every rank loads its entries and runs them as native code.

So a cache dir anyone else can write is a way to run code as the user on every node: the
cache dir and its parents are held to the trust rule of `jaxwarm.core.trust` (which the run
dir shares), checked when a command opens the dir and again right before JAX reads it (the
dir must still be the one checked). New dirs are created 0700 (0770 plus setgid for a
trusted group, so new files inherit the group).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from jaxwarm.core.config import CacheConfig
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import GROUP_DIR, GROUP_FILE, PRIVATE_DIR, modes_in
from jaxwarm.core.trust import Trust, check_parents, trusted_gid, write_problem

PRIVATE_MODE = PRIVATE_DIR
SHARED_MODE = GROUP_DIR


class DirIdentity(NamedTuple):
    """Which directory a path named when it was checked."""

    device: int
    inode: int


def check_cache_dir(path: Path, cache: CacheConfig, source: str,
                    writing: bool = False, key: str = "cache.dir") -> DirIdentity | None:
    """Refuse an unsafe existing cache dir or parent with one line naming file and key.

    The parents are checked along the path as written and along the path it resolves to,
    so a symlink cannot lead into a dir anyone may replace. With `writing` (a launch), a
    dir this user cannot write is refused here too, before any job starts. Returns the
    identity of the dir checked (None when it does not exist yet), for `recheck_cache_dir`.
    `key` is the config key that named the dir (`cache.stage` for a node's staged copy)."""
    trust = Trust(os.geteuid(), trusted_gid(cache, source))
    path = Path(os.path.abspath(path))
    check_parents(path, trust, f"{source}: {key}", "the cache",
                  "whoever can rename in it can swap the cache dir for theirs, and every rank "
                  "executes what is there")
    identity = None
    if path.exists():
        info = path.stat()
        problem = trust.dir_problem(info)
        if problem:
            raise ConfigError(f"{source}: {key}: {path} {problem}; refusing to run code "
                              f"from it")
        identity = DirIdentity(info.st_dev, info.st_ino)
    problem = write_problem(path) if writing else None
    if problem:
        raise ConfigError(f"{source}: {key}: {path} {problem}")
    return identity


def recheck_cache_dir(path: Path, cache: CacheConfig, source: str,
                      checked: DirIdentity | None, key: str = "cache.dir") -> DirIdentity | None:
    """The same checks again right before JAX opens the dir (each cache lookup of a job),
    and the dir must still be the one checked then: a dir swapped in between (a rename by
    whoever can write a parent) is refused, not loaded from."""
    identity = check_cache_dir(path, cache, source, key=key)
    if checked is not None and identity != checked:
        raise ConfigError(f"{source}: {key}: {path} is not the directory checked when "
                          f"the job started (it was replaced: device/inode {checked.device}/"
                          f"{checked.inode}, now {_describe(identity)}); refusing to load code "
                          f"from it")
    return identity


def _describe(identity: DirIdentity | None) -> str:
    return "missing" if identity is None else f"{identity.device}/{identity.inode}"


def prepare_cache_dir(path: Path, cache: CacheConfig, source: str,
                      key: str = "cache.dir") -> DirIdentity | None:
    """Check the dir, then create it (and missing parents) with a safe mode; returns the
    identity of the dir as checked or created."""
    identity = check_cache_dir(path, cache, source, key=key)
    if identity is not None:
        return identity
    gid = trusted_gid(cache, source)
    path.mkdir(mode=PRIVATE_MODE if gid is None else SHARED_MODE, parents=True, exist_ok=True)
    if gid is not None:
        os.chown(path, -1, gid)
        os.chmod(path, SHARED_MODE)  # mkdir's mode is filtered by the umask
    return check_cache_dir(path, cache, source, key=key)


def share_owned_subdirs(path: Path) -> list[Path]:
    """In a cache dir shared with its group (setgid, group-writable): each dir below it that
    this user owns and the group cannot write gets the group's dir mode, each file in them
    group read/write; the dirs changed. XLA makes its own sub-caches there (on GPU the
    per-fusion autotune dir and one dir per device kind in it) with mkdir's 0755, which a
    job's umask 007 leaves 0750: measured on an H200, the next member's autotune results
    were refused. Only their owner may change them, so each job does it for what it made.
    Entries are files at the top: only dirs are walked."""
    if modes_in(path) != (GROUP_FILE, GROUP_DIR):
        return []
    changed = []
    me = os.getuid()
    for top in os.scandir(path):
        if not top.is_dir(follow_symlinks=False):
            continue
        for root, _, files in os.walk(top.path):  # links are not followed
            for name in [root, *(os.path.join(root, f) for f in files)]:
                info = os.lstat(name)
                if info.st_uid != me or stat.S_ISLNK(info.st_mode):
                    continue
                is_dir = stat.S_ISDIR(info.st_mode)
                wanted = GROUP_DIR if is_dir else stat.S_IMODE(info.st_mode) | 0o060
                if stat.S_IMODE(info.st_mode) & wanted != wanted:
                    os.chmod(name, stat.S_IMODE(info.st_mode) | wanted)
                    if is_dir:
                        changed.append(Path(name))
    return changed

"""Who may write a dir jaxwarm reads code from or writes into: the one trust rule of the
cache dir (`jaxwarm.store.security`) and of the run dir (`check_run_dir`).

A dir anyone else may write is a way to run code as the user: every rank loads the cache
dir's entries and runs them as native code, and every job reads its pinned config in the run
dir (which names the code it imports), where jaxwarm also writes its logs and records (a link
planted there would have it write onto the user's files). So a dir (or a parent, unless it
has the sticky bit like /tmp) that is writable by everyone is refused, and a dir owned by
another user, unless the config names the group that shares it (`cache.trusted_group`):
then the dir must belong to that group and nobody outside it may write. A group-writable dir
is refused unless its group is that trusted group. Whoever owns a parent may rename what is
in it (the sticky bit does not stop its owner), so swap the dir for one of theirs: every
parent must be owned by root or by the user, unless its group is the trusted group.
The ground floor: the submit side checks the run dir before anything is written, the store
its cache dir.
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from jaxwarm.core.config import CacheConfig, Config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import file_kind, make_dirs
from jaxwarm.core.rundir import TRAINER_DIRS


def trusted_gid(cache: CacheConfig, source: str) -> int | None:
    if cache.trusted_group is None:
        return None
    try:
        return grp.getgrnam(cache.trusted_group).gr_gid
    except KeyError:
        raise ConfigError(f"{source}: cache.trusted_group: no group named "
                          f"{cache.trusted_group!r} on this machine") from None


@dataclass(frozen=True)
class Trust:
    """Whom a cache dir may answer to: the user `uid`, and the group `gid` the config
    trusts (`cache.trusted_group`; None: no group). Its rules are pure (a stat in, why it
    is unsafe out), so they are tested without another user's files."""

    uid: int
    gid: int | None

    def dir_problem(self, info: os.stat_result) -> str | None:
        """Why a cache dir with this stat is unsafe; None when it is safe."""
        uid, gid = self.uid, self.gid
        mode = stat.S_IMODE(info.st_mode)
        if not stat.S_ISDIR(info.st_mode):
            return "is not a directory"
        if mode & stat.S_IWOTH:
            return f"is writable by every user (mode {mode:04o})"
        if mode & stat.S_IWGRP and info.st_gid != gid:
            return (f"is writable by group {info.st_gid} (mode {mode:04o}), " +
                    ("and cache.trusted_group does not name it; set it to share a group "
                     "directory on purpose" if gid is None
                     else f"not by the trusted group (gid {gid})"))
        if info.st_uid == uid:
            return None
        if gid is None:
            return (f"is owned by uid {info.st_uid}, not by you (uid {uid}); set "
                    f"cache.trusted_group to share a group directory on purpose")
        if info.st_gid != gid:
            return (f"is owned by uid {info.st_uid} and group {info.st_gid}, not by the "
                    f"trusted group (gid {gid})")
        return None

    def parent_problem(self, info: os.stat_result, what: str = "the cache") -> str | None:
        """A parent others may rename in lets them swap the dir: its owner, unless that is
        root or this user (the sticky bit does not stop an owner); and, without the sticky
        bit, anyone for a world-writable one, every member of its group for a
        group-writable one. A parent whose group is the trusted group is the group's to
        share. `what` the parent holds, for the line."""
        uid, gid = self.uid, self.gid
        mode = stat.S_IMODE(info.st_mode)
        trusted = gid is not None and info.st_gid == gid
        if info.st_uid not in (0, uid) and not trusted:
            return (f"is owned by uid {info.st_uid}, not by you (uid {uid}) or root (keep "
                    f"{what} under dirs you or root own" + (
                        ")" if gid is not None else
                        ", or set cache.trusted_group to a group that owns that dir)"))
        if mode & stat.S_ISVTX:
            return None
        if mode & stat.S_IWOTH:
            return f"is writable by every user without the sticky bit (mode {mode:04o})"
        if mode & stat.S_IWGRP and info.st_gid != gid:
            return (f"is writable by group {info.st_gid} without the sticky bit (mode "
                    f"{mode:04o}) and cache.trusted_group does not name that group")
        return None


def check_parents(path: Path, trust: Trust, where: str, what: str, why: str) -> None:
    """`Trust.parent_problem` for every existing parent of `path`, along the path as written
    and along the path it resolves to (a symlink cannot lead into a dir anyone may
    replace); `where` starts the one line ("FILE: KEY"), `why` ends it."""
    real = Path(os.path.realpath(path))
    for parent in dict.fromkeys([*reversed(path.parents), *reversed(real.parents)]):
        problem = trust.parent_problem(parent.stat(), what) if parent.exists() else None
        if problem:
            raise ConfigError(f"{where}: parent {parent} {problem}: {why}")


def write_problem(path: Path) -> str | None:
    """Why this user cannot create or write the dir (it, or its nearest existing parent)."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    what = "is" if existing == path else f"cannot be created: {existing}"
    return f"{what} read-only for you; jobs could neither write nor lock entries there"


def check_run_dir(config: Config) -> None:
    """Refuse, in one line, a run dir (`<out_dir>/<run name>`, path-resolved) others could
    write or swap: a parent under `Trust.parent_problem` (key `run.out_dir`), the run dir or
    any dir in it under `Trust.dir_problem` (its owner and who may write it;
    `cache.trusted_group` is the trusted group here too), and a symlink anywhere in it (key
    `run.name`): jaxwarm never writes through a link, and one planted there is refused, not
    replaced. Dirs the trainer keeps (`rundir.TRAINER_DIRS`: its checkpoints, maybe a link
    to a bigger file system) are the trainer's and not walked. A run dir that does not
    exist yet passes (`prepare_run_dir` creates it)."""
    trust = Trust(os.geteuid(), trusted_gid(config.cache, config.source))
    run_dir = Path(os.path.abspath(config.run_dir))
    check_parents(run_dir, trust, f"{config.source}: run.out_dir", "the run dir",
                  "whoever can rename in it can swap the run dir for theirs, and every job "
                  "runs the code its pinned config names")
    try:
        top = run_dir.stat()
    except FileNotFoundError:
        return
    problem = trust.dir_problem(top)
    directories = [run_dir]
    while directories and problem is None:
        directory = directories.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if directory == run_dir and entry.name in TRAINER_DIRS:
                    continue
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode) and not link_beside(Path(entry.path)):
                    problem = (f"is {file_kind(info.st_mode)} (to "
                               f"{os.readlink(entry.path)}): jaxwarm never writes through a "
                               f"link; remove it")
                elif stat.S_ISDIR(info.st_mode):
                    problem = trust.dir_problem(info)
                    directories.append(Path(entry.path))
                if problem is not None:
                    run_dir = Path(entry.path)
                    break
    if problem is not None:
        raise ConfigError(f"{config.source}: run.name: {run_dir} {problem}; refusing to use "
                          f"this run dir (jobs read their config and jaxwarm writes its logs "
                          f"and records there)")


def link_beside(link: Path) -> bool:
    """Is `link` a link to a regular file beside it, in the same dir? submitit names each
    job's submission script by a link of its own there (`.submission_file_<id>.sh` ->
    `<job id>_submission.sh`, in the run's `slurm/` folder): such a link reaches nothing
    outside the dir it is in, whose owner and modes are checked."""
    target = Path(os.path.normpath(link.parent / os.readlink(link)))
    try:
        return target.parent == link.parent and stat.S_ISREG(target.lstat().st_mode)
    except OSError:
        return False


def prepare_run_dir(config: Config) -> Path:
    """Create the run dir (and missing parents) with safe modes (`files.make_dirs`: 0700,
    or the group's in a setgid dir of the trusted group), then check it again: a dir someone
    else made in between (in a sticky dir anyone may create in) is refused, not used."""
    make_dirs(config.run_dir)
    check_run_dir(config)
    return config.run_dir

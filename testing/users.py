"""Two non-root users of one group, made for a run and removed after (root only): the
tests' rules about who may write the cache and run dirs, which root bypasses, and
`bench.gpu_check`'s cache shared by two users on a GPU. `two_users` makes them, `run_as`
runs a command as one of them."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def why_no_users() -> str | None:
    """Why two users cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making users needs root"
    missing = [tool for tool in ("groupadd", "useradd", "userdel", "groupdel")
               if not shutil.which(tool)]
    return f"no {', '.join(missing)} here" if missing else None


def reachable(path: Path) -> bool:
    """Whether any user may read `path`: every dir above it, as given and where its links
    lead, searchable by all, and it readable by all."""
    try:
        return all(parent.stat().st_mode & stat.S_IXOTH
                   for each in (Path(os.path.abspath(path)), path.resolve())
                   for parent in each.parents) and bool(path.stat().st_mode & stat.S_IROTH)
    except OSError:
        return False


@contextmanager
def two_users() -> Iterator[tuple[str, str, str, Path]]:
    """(group, first user, second user, a 0755 base dir under /tmp holding each user's home
    `home-<user>`); all removed after. Call `why_no_users` first."""
    tag = f"{os.getpid() % 100000}"
    group, users = f"jwg{tag}", [f"jwa{tag}", f"jwb{tag}"]
    base = Path(tempfile.mkdtemp(prefix="jaxwarm-group-", dir="/tmp"))
    base.chmod(0o755)
    subprocess.run(["groupadd", group], check=True)
    try:
        for user in users:
            subprocess.run(["useradd", "-M", "-N", "-g", group, "-s", "/bin/sh", user],
                           check=True)
            home = base / f"home-{user}"
            home.mkdir()
            shutil.chown(home, user, group)
        yield group, users[0], users[1], base
    finally:
        for user in users:
            subprocess.run(["userdel", user], check=False)
        subprocess.run(["groupdel", group], check=False)
        shutil.rmtree(base, ignore_errors=True)


def run_as(user: str, base: Path, argv: list[str], env: dict[str, str],
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`argv` as `user`, in `base`, with the user's own group only (as a login gives it) and
    `env` with the user's home."""
    group = grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    return subprocess.run(argv, cwd=base, user=user, group=group, extra_groups=[group],
                          env={**env, "HOME": str(base / f"home-{user}")},
                          capture_output=True, text=True, timeout=timeout, check=False)

"""Two non-root users of one group, made for a test and removed after: for the rules about
who may write the cache dir and the run dir, which root (the suite's user here) bypasses.
`two_users` makes them (and skips the test where it cannot); `as_user` runs `jaxwarm ARGS`
(or any command) as one of them."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import REPO

SYSTEM_PYTHON = Path("/usr/bin/python3.11")  # the venv's python lives under /root (0700)
# The members' packages: this venv's, on PYTHONPATH (as an HPC module gives them).
SITE = os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]])

@contextmanager
def two_users() -> Iterator[tuple[str, str, str, Path]]:
    """(group, first user, second user, a 0755 base dir under /tmp holding each user's home
    `home-<user>`); all removed after."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not SYSTEM_PYTHON.exists():
        pytest.skip("needs root, useradd and /usr/bin/python3.11 to run two non-root users")
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


def as_user(user: str, base: Path, *args: str,
            command: tuple[str, ...] = (str(SYSTEM_PYTHON), "-m", "jaxwarm"),
            ) -> subprocess.CompletedProcess[str]:
    """`jaxwarm ARGS` (or `command ARGS`) as `user`, in `base`, with the user's own group
    only (as a login gives it)."""
    group = grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    env = {"PATH": "/usr/bin:/bin", "HOME": str(base / f"home-{user}"),
           "PYTHONPATH": SITE, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([*command, *args],
                          cwd=base, user=user, group=group, extra_groups=[group], env=env,
                          capture_output=True, text=True, timeout=900, check=False)

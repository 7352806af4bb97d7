"""Two non-root users of one group for a test (`testing.users`): for the rules about who may
write the cache dir and the run dir, which root (the suite's user here) bypasses.
`two_users` makes them (and skips the test where it cannot); `as_user` runs `jaxwarm ARGS`
(or any command) as one of them."""

from __future__ import annotations

import os
import subprocess
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testing import users
from tests.conftest import REPO

SYSTEM_PYTHON = Path("/usr/bin/python3.11")  # the venv's python lives under /root (0700)
# The members' packages: this venv's, on PYTHONPATH (as an HPC module gives them).
SITE = os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]])


@contextmanager
def two_users() -> Iterator[tuple[str, str, str, Path]]:
    """(group, first user, second user, a 0755 base dir under /tmp holding each user's home
    `home-<user>`); all removed after."""
    if users.why_no_users() or not SYSTEM_PYTHON.exists():
        pytest.skip("needs root, useradd and /usr/bin/python3.11 to run two non-root users")
    with users.two_users() as made:
        yield made


def as_user(user: str, base: Path, *args: str,
            command: tuple[str, ...] = (str(SYSTEM_PYTHON), "-m", "jaxwarm"),
            ) -> subprocess.CompletedProcess[str]:
    """`jaxwarm ARGS` (or `command ARGS`) as `user`, in `base`, with the user's own group
    only (as a login gives it)."""
    return users.run_as(user, base, [*command, *args],
                        {"PATH": "/usr/bin:/bin", "PYTHONPATH": SITE, "JAX_PLATFORMS": "cpu"})

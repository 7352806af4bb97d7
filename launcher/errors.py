"""The one line a command or a job ends with when its input is bad (or jaxwarm has a bug)."""

from __future__ import annotations

import subprocess

from launcher.config import ConfigError
from launcher.files import LockTimeout
from launcher.store.bundle import BundleError
from launcher.store.manifest import ManifestError

# Errors already phrased for the user: file, key and what was expected.
USER_ERRORS = (ConfigError, BundleError, LockTimeout, ManifestError,
               subprocess.CalledProcessError)


def one_line(exc: Exception) -> str:
    """jaxwarm's own errors as they are; a file system error with its file; anything else
    is a bug, and says so (the caller decides whether to show the traceback)."""
    if isinstance(exc, USER_ERRORS):
        text = str(exc)
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = f"unexpected {type(exc).__name__}: {exc} (a jaxwarm bug; -v shows the traceback)"
    return " ".join(text.splitlines())

"""Exit codes, and the one line a command or a job ends with when its input is bad.

Every end of jaxwarm goes through here: the `jaxwarm` CLI, each job's main (`python -m
jaxwarm.job.prewarm`, `jaxwarm.job.verify`, `jaxwarm-train`) and the entry-point guard on an
untested jax. So a bad config, a stuck lock or a full disk reads the same wherever it surfaces, and
the exit code says which kind of end it was. This module imports nothing of jaxwarm, so every layer
(the JAX adapter included) may use it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

EXIT_OK = 0
# `jaxwarm verify`: some function is COLD.
EXIT_COLD = 1
# A job that did not complete; `jaxwarm cache verify` found (and quarantined) a bad entry.
EXIT_FAILED = 1
# The key self-check (`jaxwarm doctor`, `jaxwarm.jaxkey.selfcheck`): the prediction of a
# key is not exact.
EXIT_INEXACT = 1
# Bad input, said in one line (also an untested jax): nothing was started, written or lost.
# A job ends with it too when its input is bad, a step factory that raised included.
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
PREFIX = "jaxwarm: error: "


class UserError(Exception):
    """An error already phrased for the user: the file, the key and what was expected."""


class ConfigError(UserError, ValueError):
    """Bad input (a config, a state file read back), already phrased as the one line the
    user sees: the file, the key and what was expected."""


def is_user_error(exc: BaseException) -> bool:
    """A mistake in the input or the environment (a file system error included: a full
    disk, a permission), not a bug in jaxwarm."""
    return isinstance(exc, (UserError, subprocess.CalledProcessError, OSError))


def one_line(exc: BaseException) -> str:
    """jaxwarm's own errors as they are; a file system error with its file; anything else
    is a bug, and says so (the caller decides whether to show the traceback)."""
    if isinstance(exc, OSError) and not isinstance(exc, UserError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
    elif is_user_error(exc):
        text = str(exc)
    else:
        text = f"unexpected {type(exc).__name__}: {exc} (a jaxwarm bug; -v shows the traceback)"
    return " ".join(text.splitlines())


def say(message: str) -> int:
    """Print the one line to stderr; returns EXIT_ERROR for `return say(...)`."""
    print(PREFIX + " ".join(message.splitlines()), file=sys.stderr, flush=True)
    return EXIT_ERROR


def error_line(log: str) -> str | None:
    """The last one line (`jaxwarm: error: ...`, without the prefix) in a job process's
    log text: what a process of a failed job stopped for, when it said so."""
    lines = [line for line in log.splitlines() if line.startswith(PREFIX)]
    return lines[-1][len(PREFIX):] if lines else None


def run_main(main: Callable[[], int], *, bugs_as_one_line: bool = False) -> int:
    """Run a command's or a job's main: a user error ends with its one line and EXIT_ERROR,
    Ctrl-C with EXIT_INTERRUPTED. A bug keeps its traceback unless `bugs_as_one_line` (the
    CLI without -v), where it is named as a bug."""
    try:
        return main()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise  # the reader of stdout went away: no error, the caller ends quietly
    except Exception as exc:
        if not (bugs_as_one_line or is_user_error(exc)):
            raise
        return say(one_line(exc))

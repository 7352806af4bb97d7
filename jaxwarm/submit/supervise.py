"""The supervisor of one local job process: its command runs in a process group of its own,
and the whole group ends when the command does, when the supervisor is told to stop, or
when the launcher dies.

Why a process and not only signals from the launcher: a trainer behind a shell wrapper that
does not `exec` is a grandchild. A signal to the direct child reaches only the shell, and the
kernel's parent-death signal covers only the direct child, so a killed launcher would leave
the trainer running with parent 1. The supervisor is the launcher's direct child (it gets
SIGTERM when the launcher dies, PR_SET_PDEATHSIG), and it signals the command's whole group:
forwarded signals, then SIGKILL after the grace period for a group that ignores SIGTERM or
SIGINT, and whatever of the group outlives the command itself. As the group's subreaper it
also reaps what the shell left behind. Its output goes to the launcher's pipe (process 0's
echo), which breaks when the launcher dies: a failed write is dropped, and however the
supervisor stops, it SIGKILLs and reaps the group on the way out. While the command runs
it sleeps until a signal comes (the command's end is one, SIGCHLD), never on a timer: one
wake-up 20 times a second per rank was a context switch the ranks' compiles paid for, on a
machine with fewer cores than ranks. It imports nothing from
jaxwarm but the exit codes and that sleep (`jaxwarm.core.errors`,
`jaxwarm.core.childwait`, which import nothing of jaxwarm): it starts at once.

    python -m jaxwarm.submit.supervise GRACE_S -- ARGV...
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import subprocess
import sys
import time

from jaxwarm.core.childwait import signal_pipe, sleep_until_signal
from jaxwarm.core.errors import EXIT_ERROR

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value)
    except (OSError, AttributeError):
        pass


def say(line: str) -> None:
    """One line to stderr, which may be a pipe to a launcher that is gone: a failed write
    is dropped, never allowed to stop the supervisor before it has ended the group."""
    try:
        print(f"jaxwarm: {line}", file=sys.stderr, flush=True)
    except OSError:
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def reap(pgid: int) -> None:
    """Collect the exit status of every finished member of the group that is our child
    (as subreaper, orphans of the group become ours)."""
    while True:
        try:
            if os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG) is None:
                return
        except ChildProcessError:
            return


def kill_group(pgid: int) -> None:
    """SIGKILL whatever is left of the group and reap it (bounded: a process stuck in the
    kernel dies when it leaves it)."""
    signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while group_alive(pgid) and time.monotonic() < deadline:
        reap(pgid)
        time.sleep(POLL_S)


def end_group(pgid: int, grace_s: float, name: str) -> None:
    """SIGTERM what is left of the group, SIGKILL it after `grace_s`; reap it."""
    if not group_alive(pgid):
        return
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_alive(pgid) and time.monotonic() < deadline:
        reap(pgid)
        time.sleep(POLL_S)
    if group_alive(pgid):
        say(f"{name} exited, but processes it started did not stop within {grace_s:g} s of "
            f"SIGTERM; killing its process group")
    kill_group(pgid)


def supervise(argv: list[str], grace_s: float) -> int:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    stop_at: list[float] = []
    pipe = signal_pipe()
    child = subprocess.Popen(argv, process_group=0)

    def forward(signum: int, _frame: object) -> None:
        if signum in STOPPING and not stop_at:
            stop_at.append(time.monotonic() + grace_s)
        signal_group(child.pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        if os.getppid() == 1:  # the launcher died before PDEATHSIG was set
            forward(signal.SIGTERM, None)
        while child.poll() is None:
            if stop_at and time.monotonic() > stop_at[0]:
                stop_at[0] = float("inf")
                signal_group(child.pid, signal.SIGKILL)
                say(f"{argv[0]} did not stop within {grace_s:g} s of the signal; killing its "
                    f"process group")
            sleep_until_signal(pipe, max(0.0, stop_at[0] - time.monotonic()) if stop_at
                               else math.inf)
        end_group(child.pid, grace_s, argv[0])
    finally:  # whatever stopped the supervisor, nothing of the group outlives it
        kill_group(child.pid)
    code = child.returncode
    return 128 - code if code < 0 else code


def main() -> int:
    grace, separator, *argv = sys.argv[1:]
    if separator != "--" or not argv:
        print("usage: python -m jaxwarm.submit.supervise GRACE_S -- ARGV...",
              file=sys.stderr)
        return EXIT_ERROR
    return supervise(argv, float(grace))


if __name__ == "__main__":
    sys.exit(main())

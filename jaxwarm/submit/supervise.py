"""The supervisor of one local job process: its command runs in a process group of its own,
and the whole group ends when the command does, when the supervisor is told to stop, or
when the launcher dies.

Why a process and not only signals from the launcher: a trainer behind a shell wrapper that
does not `exec` is a grandchild. A signal to the direct child reaches only the shell, and the
kernel's parent-death signal covers only the direct child, so a killed launcher would leave
the trainer running with parent 1. The supervisor is the launcher's direct child (it gets
SIGTERM when the launcher dies, PR_SET_PDEATHSIG), and it signals the command's whole group:
forwarded signals, then SIGKILL after the grace period for a group that ignores SIGTERM or
SIGINT, and whatever the command started that outlives it, in its group or not: as a child
subreaper it adopts what left the group or the session (`start_new_session=True`, a
daemon), and ends and reaps everything below itself (`childwait.end_descendants`). Its
output goes to the launcher's pipe (process 0's echo), which breaks when the launcher dies:
a failed write is dropped, and however the supervisor stops, it SIGKILLs and reaps
everything below it on the way out. While the command runs
it sleeps until a signal comes (the command's end is one, SIGCHLD), never on a timer: one
wake-up 20 times a second per rank was a context switch the ranks' compiles paid for, on a
machine with fewer cores than ranks. It imports nothing from
jaxwarm but the exit codes and that sleep (`jaxwarm.core.errors`,
`jaxwarm.core.childwait`, which import nothing of jaxwarm): it starts at once.

With `--init-budget S` (verify --trainer) the command's time limit runs out S s after its
start: the command is told when (`childwait.DEADLINE`, its own answer at the limit), and
killed with one line if it has not ended GRACE_S after it.

    python -m jaxwarm.submit.supervise GRACE_S [--init-budget S] -- ARGV...
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

from jaxwarm.core.childwait import (
    DEADLINE,
    become_subreaper,
    end_descendants,
    limit_line,
    prctl,
    reap_orphans,
    signal_pipe,
    sleep_until_signal,
)
from jaxwarm.core.errors import EXIT_ERROR

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1


def say(line: str) -> None:
    """One line to stderr, which may be a pipe to a launcher that is gone: a failed write
    is dropped, never allowed to stop the supervisor before it has ended the group."""
    try:
        print(f"jaxwarm: {line}", file=sys.stderr, flush=True)
    except OSError:
        pass


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(argv: list[str], grace_s: float, init_budget_s: float | None = None) -> int:
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    become_subreaper()
    stop_at: list[float] = []
    pipe = signal_pipe()
    env, limit_at, killed_at_limit = None, math.inf, False
    if init_budget_s is not None:
        env = {**os.environ, DEADLINE: repr(time.time() + init_budget_s)}
        limit_at = time.monotonic() + init_budget_s + grace_s
    child = subprocess.Popen(argv, process_group=0, env=env)

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
            if time.monotonic() > limit_at:
                limit_at, killed_at_limit = math.inf, True
                signal_group(child.pid, signal.SIGKILL)
                say(f"error: {limit_line(argv[0], init_budget_s or 0.0, grace_s)}")
            wake_at = min(stop_at[0] if stop_at else math.inf, limit_at)
            sleep_until_signal(pipe, max(0.0, wake_at - time.monotonic()))
            reap_orphans(keep=child.pid)
        if end_descendants(grace_s):
            say(f"{argv[0]} exited, but processes it started did not stop within {grace_s:g} "
                f"s of SIGTERM; killed them")
    finally:  # whatever stopped the supervisor, nothing it started outlives it
        end_descendants(0.0)
    if killed_at_limit:
        return EXIT_ERROR
    code = child.returncode
    return 128 - code if code < 0 else code


def main() -> int:
    grace, *rest = sys.argv[1:]
    budget = None
    if rest[:1] == ["--init-budget"]:
        budget, rest = float(rest[1]), rest[2:]
    separator, *argv = rest
    if separator != "--" or not argv:
        print("usage: python -m jaxwarm.submit.supervise GRACE_S [--init-budget S] -- ARGV...",
              file=sys.stderr)
        return EXIT_ERROR
    return supervise(argv, float(grace), budget)


if __name__ == "__main__":
    sys.exit(main())

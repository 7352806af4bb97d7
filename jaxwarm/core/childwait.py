"""Waiting on a child process without a timer: sleep until a signal comes.

The local supervisor (`jaxwarm.submit.supervise`) and the SLURM task wrapper
(`jaxwarm.job.start.task`) run one per rank for the whole job, waiting on their command
and on the signals they forward. Polling the command a few times a second costs little on a
node with a core per rank, but where ranks outnumber cores every wake-up is a context switch
the ranks' compiles wait for (`bench.wakeups`: the supervisors' 20 a second were 27,000 of
them at 32 ranks on 2 cores). So they sleep on a pipe that every signal with a Python handler
writes to (`signal.set_wakeup_fd`), the command's end included (SIGCHLD), and wake only to
look again. A signal's handler has run by the time the sleep returns, and one that comes
between a look and the sleep is already in the pipe, so none is missed.

Both also end what their command leaves behind, however it detached: each is a child
subreaper (`become_subreaper`), so a process the command starts in a session or process
group of its own (`start_new_session=True`, a daemon's double fork) is re-parented to it
when its parent ends, not to pid 1, and `end_descendants` finds it below itself in /proc
and ends it with the rest (SIGTERM, the grace, SIGKILL), then reaps it.
"""

from __future__ import annotations

import ctypes
import math
import os
import select
import signal
import time

_PR_SET_CHILD_SUBREAPER = 36
# Set by a wrapper given verify --trainer's time limit (`init_budget_s`), for its command:
# when the limit runs out (epoch seconds), counted from the command's start. The trainer's
# own answer at the limit (`jaxwarm.job.start.jaximport`) counts to it too; the wrapper kills
# a command that has not ended `stop_grace_s` after it (`limit_line`).
DEADLINE = "JAXWARM_VERIFY_DEADLINE"
POLL_S = 0.05
# How long SIGKILLed processes get to leave (one stuck in the kernel dies when it leaves it).
KILL_WAIT_S = 5.0


def limit_line(command: str, limit_s: float, grace_s: float) -> str:
    """The one line of a command the wrapper killed at verify --trainer's time limit: it
    did not answer at the limit itself (it had not reached Python with jaxwarm's recorder:
    a shell script still sleeping, a Python started with -S)."""
    return (f"verify --trainer: stopped at the time limit (init_budget_s {limit_s:g} s from "
            f"the trainer's start, and stop_grace_s {grace_s:g} s more): {command} had not "
            f"reached Python with jaxwarm's recorder; killed it; the answer is unknown")


def prctl(option: int, value: int) -> None:
    """prctl(2) through libc; a platform without it (not Linux) goes without."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value)
    except (OSError, AttributeError):
        pass


def become_subreaper() -> None:
    """Adopt this process's descendants orphaned below it (PR_SET_CHILD_SUBREAPER), so
    none escapes to pid 1 by leaving its parent's process group or session."""
    prctl(_PR_SET_CHILD_SUBREAPER, 1)


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (field 3; the parent is field 4); None when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name (in parentheses) may hold anything, spaces and ')' too.
            return stat.read().rpartition(b")")[2].decode().split()
    except OSError:
        return None


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process /proc shows."""
    table = {}
    for entry in os.scandir("/proc"):
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None:  # else gone meanwhile
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def zombie_status(pid: int) -> int | None:
    """How an ended process that its parent has not reaped ended, as waitpid says it
    (/proc/PID/stat's exit_code, field 52, Linux 3.5+); None when it is not such a one."""
    fields = stat_fields(pid)
    if fields is None or fields[0] != "Z" or len(fields) < 50:
        return None
    return int(fields[49])


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """The processes below `root` that have not ended (zombies left out), parents first,
    found by parent pid (the kernel's own children lists, CONFIG_PROC_CHILDREN, are not
    built everywhere)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, state) in (process_table() if table is None else table).items():
        if state != "Z":
            children.setdefault(parent, []).append(pid)
    found, queue = [], [root]
    while queue:
        below = children.get(queue.pop(), [])
        found += below
        queue += below
    return found


def signal_each(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def reap_orphans(keep: int | None = None) -> None:
    """Collect the status of every ended child of this process (orphans adopted as their
    subreaper included), but leave `keep` (the command, whose status its Popen collects)."""
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None or ended.si_pid == keep:
            return
        try:
            os.waitpid(ended.si_pid, 0)
        except ChildProcessError:
            pass


def end_descendants(grace_s: float) -> bool:
    """SIGTERM every process below this one, and SIGKILL what is left after `grace_s` (what
    started meanwhile too), reaping them; bounded. True when some had to be killed."""
    termed: set[int] = set()
    left = descendants(os.getpid())
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        new = [pid for pid in left if pid not in termed]
        signal_each(new, signal.SIGTERM)
        signal_each(new, signal.SIGCONT)  # a stopped process hears SIGTERM only once resumed
        termed.update(new)
        time.sleep(POLL_S)
        reap_orphans()
        left = descendants(os.getpid())
    killed = bool(left)
    deadline = time.monotonic() + KILL_WAIT_S
    while left and time.monotonic() < deadline:
        signal_each(left, signal.SIGKILL)
        time.sleep(POLL_S)
        reap_orphans()
        left = descendants(os.getpid())
    reap_orphans()
    return killed


def signal_pipe() -> int:
    """A pipe every signal with a Python handler writes a byte to (`signal.set_wakeup_fd`),
    the command's end (SIGCHLD) included: its read end, to sleep on until one comes."""
    read, write = os.pipe()
    for end in (read, write):
        os.set_blocking(end, False)
    signal.set_wakeup_fd(write)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    return read


def sleep_until_signal(pipe: int, timeout_s: float) -> None:
    """Until a signal came since the last call (its handler has run), or `timeout_s` passed
    (math.inf: no timeout)."""
    if select.select([pipe], [], [], None if timeout_s == math.inf else timeout_s)[0]:
        try:
            while os.read(pipe, 512):
                pass
        except BlockingIOError:
            pass

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
"""

from __future__ import annotations

import math
import os
import select
import signal


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

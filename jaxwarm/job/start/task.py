"""What runs in every SLURM task of a submitit job: the job's argv as a child process.

SLURM's warning signal (USR2, `signal_lead_s` ahead of the time limit, or on preemption)
reaches every process of the step. The child ignores it (an ignored signal stays ignored
across exec), so a trainer that only knows SIGTERM is not killed by it; this wrapper forwards
the config's signal instead, on every rank, and once the trainer has checkpointed and exited,
rank 0 requeues the job, at most `max_requeues` times. A job with nothing to checkpoint (a
prewarm: `forward_signal` None) is not told: the warning is logged and the job runs on, to
its end or its time limit, which SLURM reports (forwarded, the prewarm died of the signal
and the task returned as if it had finished: training then started cold). A SIGTERM
(scancel, `scontrol requeue` from outside, the hard time limit) is forwarded the same way.

Why not submitit's own requeue: submitit handles the warning by calling `checkpoint()` on the
pickled Python callable, in rank 0 only, and requeues. jaxwarm's trainer is an argv child
(`jsp-train`), not a callable, and every rank's child must hear the signal to agree on a
checkpoint step, so the forwarding has to live here; submitit still submits the job, runs
this wrapper in each task and follows the job (its timeout requeue is turned off).

What the command leaves running when it exits (a helper in a session of its own, which a
`proctrack/pgid` SLURM does not track) is ended by the wrapper, a child subreaper as the
local supervisor is: SIGTERM, `stop_grace_s`, SIGKILL (`jaxwarm.core.childwait`). With
`init_budget_s` (verify --trainer), a command that has not ended `stop_grace_s` after its
time limit is killed with one line, as the local supervisor does.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from jaxwarm.core.childwait import (
    DEADLINE,
    become_subreaper,
    end_descendants,
    limit_line,
    reap_orphans,
    signal_pipe,
    sleep_until_signal,
)
from jaxwarm.core.errors import say
from jaxwarm.job.start.place import Place

log = logging.getLogger(__name__)

WARNING = signal.SIGUSR2


def killed_by(signum: int, suffix: str = "") -> str:
    """`was killed by SIGKILL`, or how else a process ended with that status."""
    try:
        return f"was killed by {signal.Signals(signum).name}{suffix}"
    except ValueError:  # not a signal's number
        return f"ended with signal {signum}{suffix}"


class TaskFailed(RuntimeError):
    """The wrapped command exited non-zero without having been asked to stop."""


def _ignore_warning() -> None:
    signal.signal(WARNING, signal.SIG_IGN)


@dataclass
class TaskCommand:
    argv: list[str]
    # What SLURM's warning becomes for the command (a training job's `slurm.signal`); None:
    # the command is not told (it has no checkpoint to write).
    forward_signal: str | None = None
    max_requeues: int = 0
    grace_s: float = 30.0
    init_budget_s: float | None = None

    def __call__(self) -> int:
        pipe = signal_pipe()
        become_subreaper()
        env, limit_at, killed_at_limit = None, math.inf, ""
        if self.init_budget_s is not None:
            env = {**os.environ, DEADLINE: repr(time.time() + self.init_budget_s)}
            limit_at = time.monotonic() + self.init_budget_s + self.grace_s
        self._child = subprocess.Popen(self.argv, preexec_fn=_ignore_warning, env=env)
        self._stopping: int | None = None
        signal.signal(WARNING, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        # poll(), not wait(): wait() holds a lock a signal handler could need. Between two
        # looks, asleep until a signal (the child's end is SIGCHLD) or the time limit.
        while self._child.poll() is None:
            if time.monotonic() > limit_at:
                limit_at = math.inf
                self._child.kill()
                killed_at_limit = limit_line(self.argv[0], self.init_budget_s or 0.0,
                                             self.grace_s)
                say(killed_at_limit)
            sleep_until_signal(pipe, max(0.0, limit_at - time.monotonic()))
            reap_orphans(keep=self._child.pid)
        code = self._child.returncode
        if end_descendants(self.grace_s):
            log.warning("jaxwarm: %s exited, but processes it started did not stop within "
                        "%g s of SIGTERM; killed them", self.argv[0], self.grace_s)
        if killed_at_limit:
            raise TaskFailed(killed_at_limit)
        if self._stopping == WARNING and Place.here().process_id == 0:
            self._requeue()
        if code != 0 and self._stopping is None:
            if code < 0:  # nothing in the child could say why: this is the one line
                say(f"{Path(self.argv[0]).name} {killed_by(-code)}")
            raise TaskFailed(f"{self.argv[0]} exited with status {code}")
        return code

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == WARNING and self.forward_signal is None:
            log.warning("jaxwarm: got %s (SLURM's time-limit warning); %s has nothing to "
                        "checkpoint and runs on", signal.Signals(signum).name, self.argv[0])
            return
        forwarded = getattr(signal, f"SIG{self.forward_signal}") if signum == WARNING \
            else signal.SIGTERM
        log.warning("jaxwarm: got %s, forwarding %s to %s", signal.Signals(signum).name,
                    forwarded.name, self.argv[0])
        self._stopping = signum
        if self._child.poll() is None:
            self._child.send_signal(forwarded)

    def _requeue(self) -> None:
        place = Place.here()
        job_id, restarts = place.slurm_job_id, place.restart
        if job_id is None:  # a task started by hand, not by SLURM: no job to requeue
            log.warning("jaxwarm: not requeueing: this task is not part of a SLURM job")
            return
        if restarts >= self.max_requeues:
            log.warning("jaxwarm: not requeueing job %s: it already restarted %d time(s), "
                        "max_requeues=%d", job_id, restarts, self.max_requeues)
            return
        log.warning("jaxwarm: requeueing job %s (restart %d of at most %d)", job_id,
                    restarts + 1, self.max_requeues)
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)

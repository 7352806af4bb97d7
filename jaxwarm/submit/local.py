"""The local runner: a job as nodes x processes_per_node processes on this machine.

Each process gets the job environment plus its place in `jax.distributed` (coordinator on
127.0.0.1, a free port), exactly what a SLURM task gets from the job script. The processes
run in their own session so that a terminal's Ctrl-C reaches them once, through the runner,
which forwards INT/TERM/USR1/USR2 to every process and stops the rest when one fails. Each
process runs under `jaxwarm.submit.supervise`, which signals its whole process group (a
shell wrapper's children too), escalates to SIGKILL after `stop_grace_s`, and ends the group
when the launcher dies. A training job whose first step does not come within
`train.first_step_timeout_s` is stopped the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from jaxwarm.core.childwait import (
    descendants,
    process_table,
    signal_each,
    stat_fields,
    zombie_status,
)
from jaxwarm.core.config import Config, TopologyConfig
from jaxwarm.core.environment import merge_environment
from jaxwarm.core.errors import EXIT_ERROR, EXIT_FAILED, ConfigError, error_line, one_line
from jaxwarm.core.files import atomic_write, fresh_file, is_held, make_dirs, read_tail
from jaxwarm.core.gputarget import gpus_here, job_topology, no_gpu
from jaxwarm.core.jsonio import dumps, read_record
from jaxwarm.core.records import PREWARM, TRAIN, VERIFY, LocalJobState, LocalLaunch
from jaxwarm.core.rundir import has_checkpoint, local_jobs_path, lock_path, log_path, report_path
from jaxwarm.core.words import duration, human_size
from jaxwarm.job.start.place import process_variables
from jaxwarm.job.start.task import killed_by
from jaxwarm.submit.backend import Outcome, Run
from jaxwarm.submit.jobs import JobSpec

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# A local job's states in `jaxwarm status` (LOST: RUNNING in the record, but the launch that
# ran it is gone).
RUNNING, COMPLETED, FAILED, STOPPED, LOST = "RUNNING", "COMPLETED", "FAILED", "STOPPED", "LOST"
SUPERVISOR = "jaxwarm.submit.supervise"
# Less free space than this under a failed process's empty log: its disk is taken for full.
FULL_DISK_BYTES = 1 << 20


@dataclass(frozen=True)
class JobResult:
    name: str
    returncode: int
    failed_process: int | None = None
    log_tail: str = ""
    signal_received: int | None = None
    # Why jaxwarm stopped the job itself (no first step in time).
    problem: str | None = None
    # The one error line the failed process said (a job's `jaxwarm: error: ...`), if any.
    error: str | None = None
    # Whether the run dir held a checkpoint when it ended: what a relaunch may resume from.
    checkpointed: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(read_tail(path).splitlines()[-lines:])
    except OSError:
        return ""


def first_failure(failed: list[int], logs: list[Path]) -> int:
    """Which of the processes seen failed at one look is the one to name: the first that
    said why in a jaxwarm error line (the others were usually taken down by it: a rank
    that stops the job, then the ranks that lost it), else the lowest index."""
    return next((index for index, path in zip(failed, logs, strict=True)
                 if error_line(tail(path, 200)) is not None), failed[0])


def ended(code: int) -> str:
    """How a process ended, in words: the supervisor reports a signal as 128 + its number."""
    if code - 128 in {signum.value for signum in signal.Signals}:
        return killed_by(code - 128, f" (exit {code})")
    return f"exited with {code}"


def full_disk(log: Path) -> str | None:
    """The one line for a process that failed without saying why while its log's disk is
    full: its own writes there failed (its output, a checkpoint), and with them its word."""
    try:
        free = shutil.disk_usage(log.parent).free
    except OSError:
        return None
    if free >= FULL_DISK_BYTES:
        return None
    return (f"the run dir's disk is full ({human_size(free)} free under {log.parent}): the "
            f"process's writes there (its output, a checkpoint) fail, and its log {log} "
            f"may not say why it ended")


class Echo:
    """Copies process 0's output to its log and, prefixed, to the runner's stderr, until the
    process closes it. A line the log's disk refuses (full, a quota, a file size limit) is
    dropped from the log and counted, and the echo goes on: the process's pipe is always
    drained (a process writing to a pipe nobody reads blocks), and `dropped` says it once,
    at the end. A terminal that is gone is no reason to stop either."""

    def __init__(self, stream: IO[bytes], sink: IO[bytes], prefix: str) -> None:
        self.stream, self.sink, self.prefix = stream, sink, prefix
        self.lines = self.size = 0  # what the log did not get
        self.error: OSError | None = None

    def run(self) -> None:
        for line in iter(self.stream.readline, b""):
            try:
                written = os.write(self.sink.fileno(), line)
            except OSError as exc:
                written, self.error = 0, exc
            if written < len(line):  # a part written, at most: the rest is dropped
                self.lines, self.size = self.lines + 1, self.size + len(line) - written
            text = line.decode(errors="replace")
            try:  # a last line cut short (a killed process) still ends its own line
                sys.stderr.write(self.prefix + text + ("" if text.endswith("\n") else "\n"))
            except (OSError, ValueError):  # a closed or broken stderr
                pass
        self.stream.close()
        self.sink.close()

    def dropped(self, path: Path) -> str | None:
        """The one line for what the log did not get; None when it got everything."""
        if not self.lines:
            return None
        why = f": {self.error.strerror}" if self.error is not None else " (a short write)"
        return (f"{self.lines} line(s) ({human_size(self.size)}) of process 0's output could "
                f"not be written to its log {path}{why}; they were echoed here only")


class LocalJob:
    """The processes of one job; `run()` blocks until all exit."""

    def __init__(self, job: JobSpec, topology: TopologyConfig, run_dir: Path, echo: bool = True,
                 grace_s: float = 30.0, first_step_timeout_s: float | None = None):
        self.job = job
        self.topology = topology
        self.run_dir = run_dir
        self.echo = echo
        self.grace_s = grace_s
        self.first_step_timeout_s = first_step_timeout_s if job.name == TRAIN else None
        self.started = 0.0
        self.problem: str | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.echoes: list[threading.Thread] = []
        self.echo_of_0: Echo | None = None
        self.signal_received: int | None = None
        # Processes whose stopped supervisor the launcher ended (`_status`): their status,
        # and since when each still running one has been seen stopped.
        self.taken_over: dict[int, int] = {}
        self.stopped_since: dict[int, float] = {}

    def start(self) -> None:
        coordinator = f"127.0.0.1:{free_port()}"
        job_id = f"local-{uuid.uuid4().hex[:12]}"
        count = self.topology.num_processes
        self.started = time.time()
        limit = [] if self.job.init_budget_s is None else \
            ["--init-budget", repr(self.job.init_budget_s)]
        argv = [sys.executable, "-m", SUPERVISOR, f"{self.grace_s:g}", *limit, "--",
                *self.job.argv]
        base = merge_environment(dict(os.environ), self.job.env)
        for index in range(count):
            env = dict(base)
            if count > 1:
                env.update(process_variables(coordinator, count, index, job_id))
            path = log_path(self.run_dir, self.job.name, index)
            sink = fresh_file(make_dirs(path.parent) / path.name, "a job's log")
            echo = self.echo and index == 0
            proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if echo else sink, stderr=subprocess.STDOUT,
                start_new_session=True)  # the supervisor asks for PDEATHSIG itself
            if echo:
                assert proc.stdout is not None
                self.echo_of_0 = Echo(proc.stdout, sink, f"[{self.job.name} p0] ")
                thread = threading.Thread(target=self.echo_of_0.run, daemon=True)
                thread.start()
                self.echoes.append(thread)
            else:
                sink.close()
            self.procs.append(proc)
        log.info("%s: started %d process(es), logs in %s", self.job.name, count,
                 log_path(self.run_dir, self.job.name, 0).parent)

    def forward(self, signum: int, _frame: object = None) -> None:
        self.signal_received = signum
        log.warning("%s: forwarding %s to %d process(es)", self.job.name,
                    signal.Signals(signum).name, len(self.procs))
        self._send(signum)

    def _send(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    def _stop_rest(self) -> None:
        """SIGTERM every process; each supervisor SIGKILLs its group after the grace."""
        self._send(signal.SIGTERM)

    def _check_first_step(self) -> None:
        """Stop a training job whose process 0 has not reported its first step in time (the
        recorder writes the report at the first step; an older one is another launch's)."""
        if self.first_step_timeout_s is None or self.problem is not None or \
                time.time() < self.started + self.first_step_timeout_s:
            return
        try:
            if report_path(self.run_dir, self.job.name, 0, 0).stat().st_mtime >= self.started:
                self.first_step_timeout_s = None
                return
        except FileNotFoundError:
            pass
        self.problem = (f"{self.job.name}: no first step within {self.first_step_timeout_s:g} "
                        f"s (train.first_step_timeout_s); stopped the job")
        log.error("%s", self.problem)
        self._stop_rest()

    def _status(self, index: int, stopping: bool) -> int | None:
        """Process `index`'s exit status, None while it runs. Its supervisor ends it, but a
        supervisor stopped (SIGSTOP) can neither see its command end nor stop it: once its
        command has ended (or the job is stopping) and it is still stopped `grace_s` later,
        the launcher kills it and everything below it, and takes the command's own status
        (a zombie's, read in /proc) as the process's."""
        proc = self.procs[index]
        if index in self.taken_over or proc.poll() is not None:
            return self.taken_over.get(index, proc.returncode)
        fields = stat_fields(proc.pid)
        if fields is None or fields[0] not in ("T", "t"):
            self.stopped_since.pop(index, None)
            return None
        table = process_table()
        below = descendants(proc.pid, table)
        if not stopping and any(table[pid][0] == proc.pid for pid in below):
            return None  # its command still runs: the stop costs nothing yet
        since = self.stopped_since.setdefault(index, time.monotonic())
        if time.monotonic() - since < self.grace_s:
            return None
        status = next((zombie_status(pid) for pid, (parent, state) in table.items()
                       if parent == proc.pid and state == "Z"), None)
        signal_each([proc.pid, *below], signal.SIGKILL)
        proc.wait()
        code = 1 if status is None else os.waitstatus_to_exitcode(status)
        self.taken_over[index] = 128 - code if code < 0 else code
        log.warning("%s: process %d's supervisor (pid %d) was stopped (SIGSTOP?) %s; killed it "
                    "and what it started after %g s (stop_grace_s); process %d %s",
                    self.job.name, index, proc.pid, "while the job was stopping" if stopping
                    else "after its command ended", self.grace_s, index,
                    ended(self.taken_over[index]))
        return self.taken_over[index]

    def wait(self) -> JobResult:
        result = self._wait_processes()
        for thread in self.echoes:  # the last lines of process 0 reach the terminal too
            thread.join(timeout=10)
        dropped = self.echo_of_0.dropped(log_path(self.run_dir, self.job.name, 0)) \
            if self.echo_of_0 is not None else None
        if dropped is not None:
            log.warning("%s: %s", self.job.name, dropped)
        return dataclasses.replace(result, checkpointed=has_checkpoint(self.run_dir))

    def _wait_processes(self) -> JobResult:
        while True:
            self._check_first_step()
            stopping = self.signal_received is not None or self.problem is not None
            codes = [self._status(index, stopping) for index in range(len(self.procs))]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                if self.signal_received is None:
                    self._stop_rest()
                first = first_failure(failed, [log_path(self.run_dir, self.job.name, i)
                                               for i in failed])
                while any(self._status(index, True) is None
                          for index in range(len(self.procs))):
                    time.sleep(0.1)
                path = log_path(self.run_dir, self.job.name, first)
                return JobResult(self.job.name, codes[first] or 1, first,
                                 f"{path}:\n{tail(path)}", self.signal_received, self.problem,
                                 error_line(tail(path, 200)) or full_disk(path))
            if all(c == 0 for c in codes):
                return JobResult(self.job.name, 0, signal_received=self.signal_received,
                                 problem=self.problem)
            time.sleep(0.1)

    def run(self) -> JobResult:
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, self.forward) for s in FORWARDED_SIGNALS}
        try:
            self.start()
            return self.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def run_job(job: JobSpec, config: Config, echo: bool = True) -> JobResult:
    return LocalJob(job, job_topology(config, job.name), config.run_dir, echo=echo,
                    grace_s=config.stop_grace_s,
                    first_step_timeout_s=config.train.first_step_timeout_s).run()


# What to do after a job stopped by a signal the launcher forwarded (Ctrl-C), by job: only a
# training job has checkpoints to resume from.
AFTER_A_STOP = {
    TRAIN: "relaunch the same command to resume from its last checkpoint",
    PREWARM: "relaunch the same command: its prewarm compiles only what is not cached yet",
    VERIFY: "it gave no answer; run the verify again",
}
NO_CHECKPOINT = ("relaunch the same command to run it again (no checkpoint in the run dir: it "
                 "starts over unless the trainer keeps its own)")


def outcome(result: JobResult) -> Outcome:
    if result.problem is not None:
        return Outcome(result.name, False, result.problem, 1)
    if result.signal_received is not None:
        # A resume is promised only where the run dir holds a checkpoint to resume from.
        after = AFTER_A_STOP[result.name] if result.name != TRAIN or result.checkpointed \
            else NO_CHECKPOINT
        return Outcome(result.name, False,
                       f"{result.name} stopped after a forwarded signal; {after}",
                       128 + result.signal_received)
    if not result.ok:
        # A job that rejected its input (config, step factory) exits 2, and so does jaxwarm.
        what = f"{result.name} failed: process {result.failed_process} {ended(result.returncode)}"
        detail = f"{what}: {result.error}" if result.error else \
            f"{what}; last lines of its log {result.log_tail}"
        return Outcome(result.name, False, detail,
                       EXIT_ERROR if result.returncode == EXIT_ERROR else EXIT_FAILED)
    return Outcome(result.name, True)


class LocalBackend:
    """Runs a run's jobs here, one after the other, until one does not complete."""

    name = "this machine"
    runs_in_foreground = True

    def refuse_platform(self, config: Config) -> None:
        """The jobs run here: a GPU target on a machine without a GPU cannot compile."""
        if config.topology.platform == "gpu" and not gpus_here():
            raise ConfigError(no_gpu(config, "this machine (the local runner starts the jobs "
                                             "here)", "no /dev/nvidia<N>"))

    def refuse_busy(self, config: Config) -> None:
        """Nothing outlives a local launch, which holds the run dir's lock all along."""

    def submit(self, runs: list[Run]) -> list[list[JobResult]]:
        return [self.run(run.config, run.jobs) for run in runs]

    def run(self, config: Config, jobs: list[JobSpec]) -> list[JobResult]:
        """The jobs in order, until one does not complete; each one's state is kept in the
        run dir as it starts and ends (`jaxwarm status` from another shell). A verify job's
        is not: verify asks about the run, and the record stays its latest launch's."""
        results: list[JobResult] = []
        states: list[LocalJobState] = []
        record = any(job.name != VERIFY for job in jobs)
        for job in jobs:
            states.append(LocalJobState(job.name, RUNNING, job_topology(
                config, job.name).num_processes, str(log_path(config.run_dir, job.name, 0))))
            if record:
                record_states(config.run_dir, states)
            results.append(run_job(job, config))
            states[-1] = ended_state(states[-1], outcome(results[-1]), results[-1])
            if record:
                record_states(config.run_dir, states, ended=True)
            if not results[-1].ok or results[-1].signal_received is not None or \
                    results[-1].problem is not None:
                break
        return results

    def follow(self, results: list[JobResult]) -> list[Outcome]:
        return [outcome(result) for result in results]

    def hints(self, config: Config, results: list[JobResult]) -> list[str]:
        return []

    def job_lines(self, run_dir: Path) -> list[str]:
        """Each job of the run dir's latest local launch: running since when, or how it
        ended. A job still RUNNING in the record while no launch holds the run dir lost its
        launch (killed with it) and is said so."""
        path = local_jobs_path(run_dir)
        launch = read_record(LocalLaunch, path, what="the local launch's job states")
        if launch is None:
            return []
        held = is_held(lock_path(run_dir))
        now = time.time()
        lines = []
        for job in launch.jobs:
            state, detail = job.state, f"{job.processes} process(es)"
            if job.state == RUNNING and not held:
                state, detail = LOST, "its launch ended without recording how (killed?)"
            elif job.state == RUNNING:
                detail += (f", since {time.strftime('%H:%M:%S', time.localtime(job.started))}"
                           f" ({duration(max(now - job.started, 0.0))})")
            else:
                detail += f", exit {job.exit_code} after " \
                          f"{duration(max((job.ended or job.started) - job.started, 0.0))}"
            lines.append(f"{job.name:<8} {'local':<12} {state:<11} {detail}  log {job.log}")
        return lines


def record_states(run_dir: Path, states: list[LocalJobState], ended: bool = False) -> None:
    """The launch's job states, written whole (`atomic_write`). How a job `ended` is not lost
    to a full disk, which refuses the new copy: the record (a few hundred bytes, within the
    block the old one has) is rewritten in place, and where even that fails it is removed,
    so that no ended job reads as RUNNING; one line says which."""
    path = local_jobs_path(run_dir)
    text = dumps(LocalLaunch(list(states)), indent=1) + "\n"
    try:
        atomic_write(path, text, what="the local launch's job states")
    except OSError as exc:
        if not ended:
            raise
        try:
            rewrite_in_place(path, text.encode())
            how = "rewrote it in place"
        except OSError:
            path.unlink(missing_ok=True)
            how = "removed it, so that no ended job reads as running"
        log.warning("%s (how %s ended); %s", one_line(exc), states[-1].name, how)


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Overwrite an existing file's bytes in its own blocks (no new file: a full disk has no
    room for one), not following a final symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def ended_state(state: LocalJobState, how: Outcome, result: JobResult) -> LocalJobState:
    """How a job ended, as status says it: COMPLETED, STOPPED (a forwarded signal) or FAILED."""
    name = COMPLETED if how.ok else STOPPED if result.signal_received is not None else FAILED
    return dataclasses.replace(state, state=name, ended=time.time(),
                               exit_code=0 if how.ok else how.exit_code)

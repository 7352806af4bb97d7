"""The SLURM runner: a run's jobs submitted through submitit, chained and followed.

Each job is one submitit job of nodes x processes_per_node tasks, each task running the job's argv
through `jaxwarm.job.start.task.TaskCommand`. The job environment is in the job script's setup
lines (`jaxwarm.submit.sbatch.setup_lines`), so requeues re-export it. The training job
depends on the prewarm job (`afterok`, killed if the dependency fails). Submissions are recorded in
`<run dir>/slurm/jobs.json` so `jaxwarm status` can find them later. Every question about a job's
state goes through submitit's batched sacct watcher: one `sacct` call for all the jobs asked about.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jaxwarm.core.config import Config
from jaxwarm.core.decode import convert
from jaxwarm.core.errors import ConfigError, UserError, error_line
from jaxwarm.core.files import atomic_write, make_dirs, read_bounded, read_tail
from jaxwarm.core.jsonio import RECORD_CAP, load_json
from jaxwarm.core.records import PREWARM, TRAIN
from jaxwarm.core.rundir import slurm_dir, submitted_jobs_path
from jaxwarm.job.start.task import TaskCommand
from jaxwarm.submit.backend import Outcome, Run
from jaxwarm.submit.jobs import JobSpec
from jaxwarm.submit.sbatch import (
    SRUN_OPTIONS,
    array_layout,
    array_setup_lines,
    directives,
    setup_lines,
)

log = logging.getLogger(__name__)

# States in which a job may still start, run or come back (submitit's "not done" ones).
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "PREEMPTED",
                           "CONFIGURING", "RESIZING", "SUSPENDED", "REQUEUE_HOLD",
                           "REQUEUE_FED"})
# The longest wait between two sacct calls while following jobs.
WATCH_MAX_DELAY_S = 15.0
# srun's line for tasks that ended badly (`tasks 0-1: Killed`, `task 3: Exited with exit
# code 1`), and submitit's first line of each attempt in the batch output (a requeued job
# appends to the same log).
SRUN_TASK_ERROR = re.compile(r"^srun: error: [^:\n]+: tasks? (?P<tasks>[\d,-]+): (?P<words>.+)$",
                             re.MULTILINE)
ATTEMPT_START = "- Starting with JobEnvironment("
# One `Name=value` of `scontrol show job -o` (values may hold spaces: up to the next name).
SCONTROL_FIELD = re.compile(r"(?:^|(?<=\s))(?P<name>[A-Za-z][A-Za-z0-9_:/]*)="
                            r"(?P<value>.*?)(?=\s+[A-Za-z][A-Za-z0-9_:/]*=|\s*$)")


@dataclass(frozen=True)
class SubmittedJob:
    name: str
    job_id: str
    log_dir: str
    submitted: float

    def log_path(self, task: int = 0) -> Path:
        return Path(self.log_dir) / f"{self.job_id}_{task}_log.out"

    def tasks_ended(self) -> frozenset[tuple[str, int]]:
        """submitit's result file of each task that has ended (written by the task as it
        ends, again at each attempt), with its time: a change says a task just ended."""
        ended = set()
        for path in Path(self.log_dir).glob(f"{self.job_id}_*_result.pkl"):
            with contextlib.suppress(OSError):  # replaced as we look
                ended.add((path.name, path.stat().st_mtime_ns))
        return frozenset(ended)


@dataclass(frozen=True)
class JobState:
    """What `jaxwarm status` shows of one job (restarts None: no one could say)."""

    state: str
    restarts: int | None
    reason: str


def executor_parameters(config: Config, job: str, after: str | None) -> dict[str, object]:
    """submitit's `additional_parameters`: the shared sbatch directives, underscored."""
    options = directives(config, job)
    if after is not None:
        options["dependency"] = f"afterok:{after}"
        options["kill-on-invalid-dep"] = "yes"
    return {name.replace("-", "_"): True if value is None else value
            for name, value in options.items()}


def make_executor(config: Config, folder: Path, setup: list[str],
                  options: dict[str, object]) -> Any:
    """A submitit executor whose job script exports `setup` and logs one file per task.
    Requeues are jaxwarm's (jaxwarm.job.start.task), so submitit's own timeout requeue is
    off. The folder is made here, with the run dir's modes (`make_dirs`), not by submitit
    under the umask: its jobs unpickle what is there."""
    import submitit

    executor = submitit.SlurmExecutor(folder=make_dirs(folder), max_num_timeout=0)
    executor.update_parameters(setup=setup, signal_delay_s=config.slurm.signal_lead_s,
                               stderr_to_stdout=True, additional_parameters=options,
                               srun_args=list(SRUN_OPTIONS))
    return executor


def last_words(text: str) -> str:
    """A SLURM command's last line of stderr: its reason, in its words."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class SubmitRefused(UserError):
    """sbatch did not take a job (slurmctld down or unreachable, a partition or account it
    refuses): said in one line with sbatch's own words, exit 2."""


@contextlib.contextmanager
def submitting(config: Config, what: str, before: list[SubmittedJob]) -> Iterator[None]:
    """Around one submission through submitit: sbatch's refusal becomes one line (submitit
    would also echo sbatch's stderr, which the line already quotes) that names the jobs of
    this launch SLURM took before it (`before`, already recorded), so that they can be
    followed or cancelled."""
    from submitit.core.utils import FailedJobError

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    except FailedJobError as exc:
        taken = "nothing was submitted" if not before else \
            "it took " + ", ".join(f"{job.name} job {job.job_id}" for job in before) + \
            " before (jaxwarm status shows it; scancel drops it)"
        raise SubmitRefused(f"{config.source}: SLURM did not take the {what} job: "
                            f"{last_words(str(exc)) or 'sbatch failed'}; {taken}") from None


def submit_jobs(config: Config, jobs: list[JobSpec]) -> list[SubmittedJob]:
    """Submit the jobs in order, each depending on the previous one; each is recorded once
    SLURM took it, so a refusal of a later one leaves the earlier ones findable."""
    submitted: list[SubmittedJob] = []
    for job in jobs:
        folder = slurm_dir(config.run_dir, job.name)
        after = submitted[-1].job_id if submitted else None
        executor = make_executor(config, folder, setup_lines(job.env),
                                 executor_parameters(config, job.name, after))
        # Only a training job checkpoints on SLURM's warning and is requeued.
        training = job.name == TRAIN
        with submitting(config, job.name, submitted):
            handle = executor.submit(TaskCommand(
                job.argv, config.slurm.signal if training else None,
                config.slurm.max_requeues if training else 0, config.stop_grace_s,
                job.init_budget_s))
        submitted.append(SubmittedJob(job.name, str(handle.job_id), str(folder), time.time()))
        record_jobs(config.run_dir, submitted[-1:])
        log.info("submitted %s job %s (logs: %s)", job.name, handle.job_id,
                 submitted[-1].log_path())
    return submitted


def run_command(command: TaskCommand) -> int:
    """One task of a job array (submitit's map_array calls a function with each item)."""
    return command()


def submit_prewarm_array(pinned: list[tuple[Config, JobSpec]]) -> list[SubmittedJob]:
    """Prewarm several configs: one job array per group of configs with the same sbatch
    layout (nodes, tasks, time, partition...), one array task per config. The submitted
    jobs come back in the order of `pinned`."""
    groups: dict[tuple, list[int]] = {}
    for index, (config, _) in enumerate(pinned):
        groups.setdefault(array_layout(config), []).append(index)
    submitted: dict[int, SubmittedJob] = {}
    for indices in groups.values():
        members = [pinned[index] for index in indices]
        if len(members) == 1:
            submitted[indices[0]] = submit_jobs(members[0][0], [members[0][1]])[0]
            continue
        first = members[0][0]
        folder = slurm_dir(first.run_dir, f"{PREWARM}-array")
        options = executor_parameters(first, PREWARM, None)
        options["job_name"] = f"jaxwarm-prewarm-array-{len(members)}"
        executor = make_executor(first, folder,
                                 array_setup_lines([job.env for _, job in members]), options)
        with submitting(first, f"{PREWARM} array", list(submitted.values())):
            handles = executor.map_array(run_command,
                                         [TaskCommand(job.argv, grace_s=config.stop_grace_s)
                                          for config, job in members])
        for index, (config, _), handle in zip(indices, members, handles, strict=True):
            job = SubmittedJob(PREWARM, str(handle.job_id), str(folder), time.time())
            record_jobs(config.run_dir, [job])
            log.info("submitted prewarm of %s as array task %s (logs: %s)", config.source,
                     handle.job_id, job.log_path())
            submitted[index] = job
    return [submitted[index] for index in range(len(pinned))]


def record_jobs(run_dir: Path, jobs: list[SubmittedJob]) -> None:
    path = submitted_jobs_path(run_dir)
    known = read_jobs(run_dir)
    make_dirs(path.parent)
    atomic_write(path, json.dumps([asdict(j) for j in known + jobs], indent=1) + "\n")


def read_jobs(run_dir: Path) -> list[SubmittedJob]:
    path = submitted_jobs_path(run_dir)
    if not path.exists():
        return []
    try:
        return convert(list[SubmittedJob], load_json(read_bounded(
            path, RECORD_CAP, "a list of submitted jobs")), "", str(path))
    except ValueError as exc:  # ConfigError, or not JSON
        raise ConfigError(exc if isinstance(exc, ConfigError) else f"{path}: not valid JSON "
                          f"({exc}); it lists the jobs jaxwarm submitted") from None


def watcher(delay_s: float = WATCH_MAX_DELAY_S) -> Any:
    """submitit's sacct watcher: one `sacct -j A -j B ...` call for every job being followed,
    at 2, 4, 8 ... s after the last submission, then at most every `delay_s`. It also asks
    each job's reason, and with --duplicates gets one record per attempt, so a requeued job's
    restarts are counted from the same call. A call that fails (slurmdbd down) is kept in
    `failure`, sacct's own words, for the caller to say once; submitit would log a warning
    at every call, with sacct's stderr on the terminal, and leave every job UNKNOWN with
    0 restarts as if that were known."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class RunWatcher(SlurmInfoWatcher):
        failure: str | None = None

        def update(self) -> None:
            command = self._make_command()
            if command is None:
                return
            self._last_status_check = time.time()
            try:
                answer = subprocess.run(command, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.failure = str(exc)
                return
            self.failure = None if answer.returncode == 0 else \
                last_words(answer.stderr) or f"exit status {answer.returncode}"
            if self.failure is None:
                self._info_dict.update(self.read_info(answer.stdout))
                self._finished.update(job_id for job_id in self._registered
                                      if self.is_done(job_id, mode="cache"))

        def _make_command(self) -> list[str] | None:
            command = super()._make_command()
            if command is None:
                return None
            command[command.index("-o") + 1] += ",Reason"
            return [*command, "--duplicates"]

        def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
            text = string if isinstance(string, str) else string.decode()
            attempts = Counter(line.split("|", 1)[0] for line in text.splitlines()[1:]
                               if line and "." not in line.split("|", 1)[0])
            # The last record of a job is its latest attempt, and wins in submitit's dict.
            return {job_id: {**stats, "Restarts": str(max(attempts[job_id] - 1, 0))}
                    for job_id, stats in super().read_info(text).items()}

    return RunWatcher(delay_s=int(delay_s))


def job_states(job_ids: list[str]) -> dict[str, JobState]:
    """The state, restarts and reason of each job, from one batched sacct call. A job that
    accounting does not know (yet, or any more) is UNKNOWN. When accounting does not answer,
    slurmctld's word for the jobs it still holds (scontrol), said as such; when neither
    does, UNKNOWN with restarts unknown, never a count of 0 it did not read."""
    sacct = watcher()
    for job_id in job_ids:
        sacct.register_job(job_id)
    sacct.update()
    if sacct.failure is not None:
        held = controller_states()
        log.warning("SLURM accounting did not answer (%s); %s", sacct.failure,
                    "job states and restarts are slurmctld's (scontrol)" if held is not None
                    else "nor did slurmctld (scontrol): states and restarts are unknown")
        return {job_id: (held or {}).get(job_id, JobState("UNKNOWN", None, "None"))
                for job_id in job_ids}
    states = {}
    for job_id in job_ids:
        info = sacct.get_info(job_id, mode="cache")
        states[job_id] = JobState((info.get("State") or "UNKNOWN").split()[0],
                                  int(info.get("Restarts") or 0), info.get("Reason") or "None")
    return states


def controller_states() -> dict[str, JobState] | None:
    """Every job slurmctld still holds (finished ones for MinJobAge), by job id (an array
    task as `<array job>_<task>`), from one `scontrol show job -o`; None if it does not
    answer."""
    try:
        shown = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True,
                               text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if shown.returncode != 0:
        return None
    states = {}
    for line in shown.stdout.splitlines():
        fields = {match["name"]: match["value"] for match in SCONTROL_FIELD.finditer(line)}
        job_id = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}" \
            if "ArrayTaskId" in fields and "ArrayJobId" in fields else fields.get("JobId")
        restarts = fields.get("Restarts", "")
        if job_id:
            states[job_id] = JobState(fields.get("JobState", "UNKNOWN"),
                                      int(restarts) if restarts.isdigit() else None,
                                      fields.get("Reason", "None"))
    return states


def still_queued(job_ids: list[str]) -> set[str]:
    """Of jobs accounting does not know yet (just submitted), those SLURM has queued or runs:
    one squeue call."""
    if not job_ids:
        return set()
    listed = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)],
                            capture_output=True, text=True)
    return set(listed.stdout.split()) & set(job_ids)


def follow(jobs: list[SubmittedJob], timeout_s: float | None = None) -> dict[str, str]:
    """Wait until every job is done, logging each state change; final states by job id.
    When a task of a job ends (its result file appears or changes), sacct is asked again at
    once and then at 2, 4, 8 s (the watcher's back-off starts over), so the wait ends
    seconds after the job does, not up to `WATCH_MAX_DELAY_S` later."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    sacct = watcher()
    seen: dict[str, str] = {}
    ended = {job.job_id: job.tasks_ended() for job in jobs}
    said: str | None = None
    while True:
        for job in jobs:
            if (now := job.tasks_ended()) != ended[job.job_id]:
                ended[job.job_id] = now
                sacct.register_job(job.job_id)
            state = sacct.get_state(job.job_id).split()[0]
            if seen.get(job.job_id) != state:
                log.info("%s job %s: %s", job.name, job.job_id, state)
                seen[job.job_id] = state
        if sacct.failure is not None and sacct.failure != said:
            log.warning("SLURM accounting did not answer (%s); still waiting",
                        sacct.failure)
        said = sacct.failure
        if all(sacct.is_done(job.job_id, mode="cache") for job in jobs):
            return seen
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"jobs still running after {timeout_s:.0f} s: "
                               + ", ".join(f"{j.name} {j.job_id}" for j in jobs))
        time.sleep(1.0)


def srun_failures(batch_log: str) -> list[tuple[int, str]]:
    """The tasks srun said ended badly in the job's last attempt, in the order it said so,
    with its words (`srun: error: n2: task 3: Exited with exit code 1`). With
    `--kill-on-bad-exit` the first is the task that ended the job: the others were ended by
    SLURM, or by losing the first, and may have written their own line before they went."""
    attempt = batch_log.rsplit(ATTEMPT_START, 1)[-1]
    ended = []
    for match in SRUN_TASK_ERROR.finditer(attempt):
        for part in match["tasks"].split(","):
            first, _, last = part.partition("-")
            ended += [(task, match["words"]) for task in range(int(first), int(last or first) + 1)]
    return ended


def task_line(path: Path) -> str | None:
    """A task log's jaxwarm error line; None if it has none or cannot be read."""
    try:
        return error_line(read_tail(path))
    except OSError:
        return None


def failed_task(job: SubmittedJob) -> tuple[int, str] | None:
    """The task that ended a failed job, and its line: the first task srun said ended badly (the
    batch script's output is task 0's log), with its jaxwarm line (a rank that stopped the job,
    `jaxwarm.job.ranks`; a job's bad input; a trainer killed by a signal, said by the
    task wrapper) or else srun's words. Without srun's account, the lowest task that said why
    (reading every task's log: a last resort at 64 ranks)."""
    try:
        ended = srun_failures(read_tail(job.log_path(0)))
    except OSError:
        ended = []
    if ended:
        task, words = ended[0]
        return task, task_line(job.log_path(task)) or f"srun: {words}"
    said = []
    for path in Path(job.log_dir).glob(f"{job.job_id}_*_log.out"):
        number = path.name[len(job.job_id) + 1:].split("_")[0]
        if number.isdigit() and (line := task_line(path)) is not None:
            said.append((int(number), line))
    return min(said) if said else None


def why_cancelled(jobs: list[SubmittedJob], states: dict[str, str]) -> str | None:
    """When a job did not complete, name the first job that failed, the task that said why
    (with its line), and where its log is."""
    for job in jobs:
        state = states[job.job_id]
        if state != "COMPLETED":
            task = failed_task(job) if state == "FAILED" else None
            said = "" if task is None else f": task {task[0]}: {task[1]}"
            return (f"{job.name} job {job.job_id} ended {state}{said}"
                    + f"; its log: {job.log_path(task[0] if task else 0)}"
                    + "".join(f"; so {later.name} job {later.job_id} was cancelled"
                              for later in jobs[jobs.index(job) + 1:]
                              if states[later.job_id] == "CANCELLED"))
    return None


class SlurmBackend:
    """Submits a run's jobs as one afterok chain (several configs of one prewarm: job arrays);
    follows them through sacct."""

    name = "SLURM"
    runs_in_foreground = False

    def refuse_platform(self, config: Config) -> None:
        """The nodes are elsewhere: a GPU-target job on a node without a GPU refuses itself,
        in one line in its log (jaxwarm.job.start.gpu), and the chain stops there. Here
        only SLURM's own commands must be: submitit submits with sbatch and runs each task
        with srun (its executor refuses to exist without it)."""
        missing = [name for name in ("sbatch", "srun") if shutil.which(name) is None]
        if missing:
            raise ConfigError(f"{config.source}: SLURM jobs need sbatch and srun on PATH, "
                              f"and {' and '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} not here (SLURM's "
                              f"client commands are not installed on this machine): submit "
                              f"from a login node of the cluster, or run with --local")

    def refuse_busy(self, config: Config) -> None:
        refuse_active_jobs(config)

    def submit(self, runs: list[Run]) -> list[list[SubmittedJob]]:
        if len(runs) == 1:
            submitted = [submit_jobs(runs[0].config, runs[0].jobs)]
        else:  # one prewarm of several configs: one job each, in arrays by sbatch layout
            submitted = [[job] for job in submit_prewarm_array(
                [(run.config, run.jobs[0]) for run in runs])]
        for jobs in submitted:
            print_submitted(jobs)
        return submitted

    def follow(self, submitted: list[SubmittedJob]) -> list[Outcome]:
        states = follow(submitted)
        reason = why_cancelled(submitted, states)
        return [Outcome(job.name, states[job.job_id] == "COMPLETED", reason or "")
                for job in submitted]

    def hints(self, config: Config, submitted: list[SubmittedJob]) -> list[str]:
        return [f"follow with: jaxwarm status {config.run_dir}   "
                f"or: tail -f {submitted[-1].log_path()}"]

    def job_lines(self, run_dir: Path) -> list[str]:
        jobs = read_jobs(run_dir)
        states = job_states([job.job_id for job in jobs])
        lines = []
        for job in jobs:
            state = states[job.job_id]
            restarts = "?" if state.restarts is None else state.restarts
            lines.append(f"{job.name:<8} job {job.job_id:<8} {state.state:<11} restarts "
                         f"{restarts}  reason {state.reason}  log {job.log_path()}")
        return lines


def refuse_active_jobs(config: Config) -> None:
    """A SLURM launch's own life ends at submission, but its jobs go on: a second launch of
    the run dir while they are queued or running would train into the same checkpoints.
    One batched sacct call; a job accounting does not know yet (just submitted) is looked
    for in the queue (one squeue call), and one that neither knows does not block."""
    jobs = read_jobs(config.run_dir)
    if not jobs:
        return
    states = {job_id: state.state for job_id, state in
              job_states([job.job_id for job in jobs]).items()}
    queued = still_queued([job_id for job_id, state in states.items() if state == "UNKNOWN"])
    states.update({job_id: "QUEUED" for job_id in queued})
    active = [f"{job.name} job {job.job_id} ({states[job.job_id]})" for job in jobs
              if states[job.job_id] in ACTIVE_STATES | {"QUEUED"}]
    if active:
        raise ConfigError(f"{config.source}: run.name: run dir {config.run_dir} still has "
                          f"SLURM jobs queued or running: {', '.join(active)}; wait for them "
                          f"(jaxwarm status {config.run_dir}), scancel them, or use another "
                          f"run.name")


def print_submitted(jobs: list[SubmittedJob]) -> None:
    for job in jobs:
        print(f"{job.name}: SLURM job {job.job_id}, log {job.log_path()}")

"""The run directory's layout: the one module that knows where a run's files go.

`<out_dir>/<run name>/` holds config.yaml (the pinned config every job reads),
logs/<job>-p<process>.log (local runner), reports/<job>-r<restart>-p<process>.json (init
reports), first-steps.jsonl (every training attempt's time to first step, across launches),
verify/p0.json (verify's verdicts: process 0 decides for the run), verify/config.yaml (the
config the latest verify's job read: a verify with overrides leaves the run's own as it was),
prewarm-decision.json (whether the launch ran the prewarm job, and why),
prewarm-progress.json (what it compiles), local-jobs.json (a local launch's jobs and their
state), mlperf-r<restart>.log (MLPerf's lines, with
report.mlperf), slurm/<job>/ (submitit's job folders) with slurm/jobs.json (what was
submitted), checkpoints/ and metrics.jsonl (the trainer's), stage/<attempt>-n<node>.json
(what each node's staging of the cache did, `cache.stage`), and launch.lock (held by the
launch that owns the run dir).
Pure paths: both the submit side and the code inside a job import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from jaxwarm.core.files import read_tail
from jaxwarm.core.jsonio import load_json
from jaxwarm.core.records import PREWARM, TRAIN, VERIFY

JOBS = (VERIFY, PREWARM, TRAIN)
PINNED_CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
# The trainer's own dirs in a run dir: what is in them is the trainer's (orbax makes and
# renames its step dirs there), and one may be a link to a bigger file system; the run-dir
# check (`core.trust.check_run_dir`) does not walk them.
TRAINER_DIRS = (CHECKPOINTS,)


def pinned_config(run_dir: str | Path) -> Path:
    return Path(run_dir) / PINNED_CONFIG


def verify_config(run_dir: str | Path) -> Path:
    """The config a verify pins for its own job: a verify asks about a would-be run (its
    overrides included), so the run's own pinned config, which its report reads, stays."""
    return Path(run_dir) / VERIFY / PINNED_CONFIG


def lock_path(run_dir: str | Path) -> Path:
    """Held by a launch for its whole life: one launch per run dir at a time."""
    return Path(run_dir) / "launch.lock"


def logs_dir(run_dir: str | Path) -> Path:
    """The local runner's job logs (a SLURM job's are in its `slurm_dir`)."""
    return Path(run_dir) / "logs"


def log_path(run_dir: str | Path, job: str, process: int) -> Path:
    return logs_dir(run_dir) / f"{job}-p{process}.log"


def traceback_path(run_dir: str | Path, job: str, process: int) -> Path:
    """The traceback of what the step factory raised in that process: kept out of the
    process's log, which the terminal shows, and named by the one line it ends with."""
    return logs_dir(run_dir) / f"{job}-p{process}-traceback.log"


def reports_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "reports"


def first_steps_path(run_dir: str | Path) -> Path:
    """Each training attempt's time to first step, kept across launches of the run (an init
    report is replaced by the next launch's): cold and warm launches side by side."""
    return Path(run_dir) / "first-steps.jsonl"


@dataclass(frozen=True)
class ReportName:
    """Whose init report a file is: the job, its attempt (SLURM's restart count), the process."""

    job: str
    restart: int
    process: int

    @property
    def order(self) -> tuple[int, int, int]:
        """verify, prewarm, train (the order they run), then attempt, then process."""
        return (JOBS.index(self.job) if self.job in JOBS else len(JOBS), self.restart,
                self.process)


# The report file name, spelled once: `report_path` formats it, `parse_report_path` reads it.
_REPORT_FILE = "{job}-r{restart}-p{process}.json"
_REPORT_NAME = re.compile(_REPORT_FILE.replace(".", r"\.").format(
    job=r"(?P<job>[a-z]+)", restart=r"(?P<restart>\d+)", process=r"(?P<process>\d+)"))


def report_path(run_dir: str | Path, job: str, restart: int, process: int) -> Path:
    return reports_dir(run_dir) / _REPORT_FILE.format(job=job, restart=restart, process=process)


def parse_report_path(path: str | Path) -> ReportName | None:
    """The inverse of `report_path`: whose report the file is, or None when it is not one."""
    match = _REPORT_NAME.fullmatch(Path(path).name)
    if match is None:
        return None
    return ReportName(match["job"], int(match["restart"]), int(match["process"]))


def report_paths(run_dir: str | Path) -> list[tuple[ReportName, Path]]:
    """Every init report file of the run with whose report it is, in run order (verify,
    prewarm, train; then attempt, then process); other files there are not reports."""
    found = [(name, path) for path in reports_dir(run_dir).glob("*.json")
             if (name := parse_report_path(path)) is not None]
    return sorted(found, key=lambda item: item[0].order)


def verify_result_path(run_dir: str | Path) -> Path:
    """The verify job's verdicts: process 0 decides for the run (`jaxwarm.job.warm`)."""
    return Path(run_dir) / VERIFY / "p0.json"


def verify_fingerprint_path(run_dir: str | Path) -> Path:
    """The fingerprint a verify computed (as a launch's decision records its own): a miss
    is explained against a prewarm of the same fingerprint before other runs'."""
    return Path(run_dir) / VERIFY / "fingerprint.json"


def prewarm_decision_path(run_dir: str | Path) -> Path:
    """Whether the latest launch ran the prewarm job, why, and under which fingerprint."""
    return Path(run_dir) / "prewarm-decision.json"


def prewarm_progress_path(run_dir: str | Path) -> Path:
    """Which target the running prewarm job compiles, for `jaxwarm status`."""
    return Path(run_dir) / "prewarm-progress.json"


def mlperf_log_path(run_dir: str | Path, restart: int) -> Path:
    """The MLPerf lines of one attempt of the training job (a relaunch writes it afresh)."""
    return Path(run_dir) / f"mlperf-r{restart}.log"


def mlperf_logs(run_dir: str | Path) -> list[Path]:
    """The run's MLPerf logs, the latest attempt's last (by the time of the name itself: a
    planted link is ordered, not followed)."""
    return sorted(Path(run_dir).glob("mlperf-r*.log"), key=lambda path: path.lstat().st_mtime)


def local_jobs_path(run_dir: str | Path) -> Path:
    """The jobs of the latest local launch and their state (`jaxwarm status`)."""
    return Path(run_dir) / "local-jobs.json"


def slurm_dir(run_dir: str | Path, job: str) -> Path:
    """submitit's folder for one job (or `prewarm-array`): its job scripts and task logs."""
    return Path(run_dir) / "slurm" / job


def submitted_jobs_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "slurm" / "jobs.json"


def stage_notes_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "stage"


def stage_note_path(run_dir: str | Path, attempt: str, node: int) -> Path:
    """What one node's staging of the cache did in one attempt of the training job
    (`jaxwarm.job.start.place.Place.attempt`): the node's other processes wait for it."""
    return stage_notes_dir(run_dir) / f"{attempt}-n{node}.json"


def join_note_path(run_dir: str | Path, attempt: str, process: int) -> Path:
    """That one process of one attempt of a job has reached its `jax.distributed` join (and
    waits there): a rank whose join times out names the ranks without one. Removed once
    the join succeeds."""
    return Path(run_dir) / "join" / f"{attempt}-p{process}"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether the run dir holds a checkpoint (jaxwarm-train's; a trainer of its own may
    keep its checkpoints elsewhere): what a relaunch after a stop may promise to resume."""
    try:
        return any(checkpoints_dir(run_dir).iterdir())
    except OSError:
        return False


def earlier_reports_dir(run_dir: str | Path, launch: int) -> Path:
    """Where a relaunch moves the init reports of the `launch`-th launch before it (1, 2,
    ...): its jobs write theirs under the same names, and none is overwritten."""
    return reports_dir(run_dir) / f"earlier-{launch}"


def metrics_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "metrics.jsonl"


def step_reached(run_dir: str | Path) -> int | None:
    """The last step the trainer logged in the run's metrics (jaxwarm-train logs every
    `log_every` steps, the last step, and the step it checkpoints at when told to stop);
    None when it logged none (another trainer, or no step run)."""
    try:
        lines = read_tail(metrics_path(run_dir)).splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            step = load_json(line).get("step")
        except (ValueError, AttributeError):
            continue  # a torn or foreign line
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


def unfinished(run_dir: str | Path, steps: int, ended: bool = True) -> str | None:
    """Why a training job did not do its configured steps, as its metrics say; None if it
    did (or its trainer logs no steps). `ended`: its job is known to have ended (exit 0
    before the last step, e.g. its requeues ran out, which SLURM calls COMPLETED); else it
    may still be running, and the line says only what was logged."""
    reached = step_reached(run_dir)
    if reached is None or reached >= steps:
        return None
    if not ended:
        return (f"training is unfinished: its last logged step is {reached} of {steps} "
                f"(metrics in {metrics_path(run_dir)}); once its job has ended, relaunch the "
                f"same command to resume from its last checkpoint")
    return (f"training is unfinished: it stopped at step {reached} of {steps} (metrics in "
            f"{metrics_path(run_dir)}); relaunch the same command to resume from its last "
            f"checkpoint")

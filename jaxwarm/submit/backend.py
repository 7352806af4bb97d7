"""The contract between the launch flow (`jaxwarm.submit.flow`) and a backend (local, SLURM).

A backend answers five questions and does one thing: can its machines run the config's jobs
at all (a GPU target needs a GPU), may this run dir be used (no jobs of
an earlier launch still queued or running in it), submit a launch's jobs, how did each end,
what should the user run to follow them, and what state are a run's jobs in now (`jaxwarm
status`). Everything else (checks, run-dir lock, pinning, cache check, report) is the flow's,
the same for every backend.

A backend's handles on submitted jobs are its own type (`H`: the local runner's results,
SLURM's submitted job ids); the flow only hands them back to the backend that made them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from jaxwarm.core.config import Config
from jaxwarm.core.errors import EXIT_FAILED
from jaxwarm.submit.jobs import JobSpec

H = TypeVar("H")


@dataclass(frozen=True)
class Run:
    """One config's part of a launch, as the flow hands it to a backend: the config (paths
    resolved), where its pinned copy is (the run's own, or a verify's), and its jobs in
    order (each starts only when the one before completed)."""

    config: Config
    pinned: Path
    jobs: list[JobSpec]


@dataclass(frozen=True)
class Outcome:
    """How one job ended, as the backend tells it."""

    job: str
    ok: bool
    # One line for the user when the job did not complete (which process/job, its log).
    detail: str = ""
    # What `jaxwarm` exits with when this is the first job that did not complete.
    exit_code: int = EXIT_FAILED


class Backend(Protocol[H]):
    name: str
    # True when submit() already ran the jobs to their end (local), False when it only
    # queued them (SLURM): then the flow follows them only when asked to wait.
    runs_in_foreground: bool

    def refuse_platform(self, config: Config) -> None:
        """Raise ConfigError when the machines this backend runs jobs on plainly cannot run
        the config's (a GPU target where there is no GPU). Called before anything is
        written; where it cannot tell, the job itself refuses (jaxwarm.job.start.gpu)."""

    def refuse_busy(self, config: Config) -> None:
        """Raise ConfigError when jobs of an earlier launch may still run in the run dir.
        Called under the run dir's lock, before anything is written."""

    def submit(self, runs: list[Run]) -> list[list[H]]:
        """Submit each run's jobs (each starts only when the one before completed); one
        list of handles per run, in order. Several runs are one `prewarm` of many configs."""
        ...

    def follow(self, handles: list[H]) -> list[Outcome]:
        """Wait until a run's jobs ended; how each ended."""
        ...

    def hints(self, config: Config, handles: list[H]) -> list[str]:
        """What to run to follow jobs that the launch leaves running."""
        ...

    def job_lines(self, run_dir: Path) -> list[str]:
        """The state of each job recorded for the run dir, one line each (`jaxwarm status`)."""
        ...


def recorded_backend(run_dir: Path) -> Backend[Any] | None:
    """The backend of the run dir's latest launch that recorded jobs (`jaxwarm status`): a
    local launch's `local-jobs.json` or a SLURM launch's `slurm/jobs.json`, whichever was
    written last; None when neither is there."""
    from jaxwarm.core.rundir import local_jobs_path, submitted_jobs_path

    written = {}
    for name, path in (("local", local_jobs_path(run_dir)),
                       ("slurm", submitted_jobs_path(run_dir))):
        try:
            written[name] = path.lstat().st_mtime
        except FileNotFoundError:
            continue
    return choose_backend(max(written, key=written.__getitem__)) if written else None


def choose_backend(requested: str | None) -> Backend[Any]:
    """`--local`, `--slurm`, or by default SLURM where `sbatch` is on PATH. Its handles are
    `Any` to the caller, which only hands them back to this same backend (the flow is
    generic in them)."""
    import shutil

    from jaxwarm.submit import local, slurm

    if requested is None:
        requested = "slurm" if shutil.which("sbatch") else "local"
    return slurm.SlurmBackend() if requested == "slurm" else local.LocalBackend()

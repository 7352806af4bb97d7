"""The bodies of the commands that launch nothing: `jaxwarm status`, `render` and `report`.
They read a run dir (and ask its backend how its jobs are); `jaxwarm.cli.main` parses their
arguments.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TypeVar

from jaxwarm.core.config import load_config
from jaxwarm.core.errors import EXIT_OK, ConfigError
from jaxwarm.core.files import make_dirs
from jaxwarm.core.jsonio import dumps, read_record
from jaxwarm.core.records import PREWARM, TRAIN, PrewarmProgress
from jaxwarm.core.rundir import (
    local_jobs_path,
    pinned_config,
    prewarm_progress_path,
    slurm_dir,
    submitted_jobs_path,
    unfinished,
)
from jaxwarm.job.progress import progress_line
from jaxwarm.report.read import PrewarmedFunctions, load_reports
from jaxwarm.report.render import attempt_summaries
from jaxwarm.store.store import open_store
from jaxwarm.submit.backend import Backend
from jaxwarm.submit.jobs import prewarm_job, train_job
from jaxwarm.submit.prepare import adopt_run_dir, holding_run_dir, resolve_run
from jaxwarm.submit.results import print_report
from jaxwarm.submit.sbatch import render
from jaxwarm.submit.slurm import ACTIVE_STATES

log = logging.getLogger(__name__)

H = TypeVar("H")  # the handle type of the run dir's backend (`Backend`)


def status(run_dir: Path, backend: Backend[H] | None) -> int:
    """`jaxwarm status`: the state of each job of the run dir's latest launch, as its
    backend (`backend.recorded_backend`: local or SLURM) recorded them, what a running
    prewarm job compiles, then each training attempt's init summary."""
    lines = backend.job_lines(run_dir) if backend is not None else []
    if not lines:
        raise ConfigError(f"{run_dir}: no jobs recorded for this run dir (a launch records "
                          f"them: {local_jobs_path(run_dir).name} locally, "
                          f"{submitted_jobs_path(run_dir).relative_to(run_dir)} on SLURM)")
    for line in lines + prewarm_progress(run_dir, lines) + \
            attempt_summaries(load_reports(run_dir)):
        print(line)
    pinned = pinned_config(run_dir)
    train = job_state(lines, TRAIN)
    if pinned.is_file() and train is not None and train not in ACTIVE_STATES:
        # sacct says COMPLETED for a trainer that exits 0 early (its requeues ran out)
        # UNKNOWN: the backend cannot tell whether it ended; say what it logged so far.
        problem = unfinished(run_dir, load_config(pinned).train.steps,
                             ended=train != "UNKNOWN")
        if problem:
            print(f"{TRAIN}: {problem}")
    return EXIT_OK


def job_state(job_lines: list[str], name: str) -> str | None:
    """The state of the run's latest job `name` in the backend's job lines (SLURM's
    `<name> job <id> <state> ...`, the local runner's `<name> local <state> ...`); None if
    it has none."""
    states = [words[3] if words[1] == "job" else words[2]
              for words in map(str.split, job_lines)
              if len(words) > 3 and words[0] == name and words[1] in ("job", "local")]
    return states[-1] if states else None


def prewarm_progress(run_dir: Path, job_lines: list[str]) -> list[str]:
    """For a prewarm job that is running: what it compiles, since when, and its ETA (its
    process 0 keeps `prewarm-progress.json` up to date)."""
    running = job_state(job_lines, PREWARM) == "RUNNING"
    path = prewarm_progress_path(run_dir)
    progress = read_record(PrewarmProgress, path) if running else None
    if progress is None or progress.done:
        return []
    return [f"  {progress_line(progress, now=time.time())}"]


def render_script(config_path: str, overrides: list[str], job_name: str) -> int:
    """`jaxwarm render`: print a job's sbatch script. Of the run dir it writes only what the
    script needs into a new one (pinned config, log folder), never over a run that exists
    (`adopt_run_dir`)."""
    config, pinned = resolve_run(load_config(config_path, overrides))
    job = prewarm_job(config, pinned) if job_name == PREWARM else train_job(config, pinned)
    log_dir = slurm_dir(config.run_dir, job.name)
    with holding_run_dir(config):
        job = job.pinned(adopt_run_dir(config))
        make_dirs(log_dir)
    print(render(config, job.name, job.argv, job.env, log_dir), end="")
    return EXIT_OK


def show_report(run_dir: Path, as_json: bool = False, show_all: bool = False,
                plot: Path | None = None) -> int:
    """`jaxwarm report`: a run's init reports, as the table or as one JSON list; with
    `plot`, also its init phases drawn into a PNG."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run dir (expected <out_dir>/<run name>)")
    if plot is not None:
        from jaxwarm.report.plot import plot_init, plot_path

        plot_path(plot, run_dir)
        config = load_config(pinned_config(run_dir))
        plot_init(load_reports(run_dir),
                  PrewarmedFunctions.of(open_store(config.cache.dir).manifest(strict=False)),
                  config.init_budget_s, plot, f"run {config.run.name}")
        log.info("init phases drawn into %s", plot)
    if as_json:
        print(dumps(load_reports(run_dir), indent=1))
        return EXIT_OK
    pinned = pinned_config(run_dir)
    if not (pinned.exists() or pinned.is_symlink()):  # anything else there: load_config says
        raise ConfigError(f"{run_dir}: no {pinned.name}: not a run dir made by jaxwarm")
    print_report(run_dir, load_config(pinned), show_all=show_all, looking_back=True)
    return EXIT_OK

"""The one launch flow, for every backend: checks -> cache check -> prewarm -> train -> report.

The prewarm job verifies before it compiles (`prewarm.job`): a function whose entry is
already in the cache is not compiled again, so a warm relaunch pays one short job (imports,
lowering) on either backend, and `launch --slurm` keeps its one prewarm -> train chain.
A backend only submits the jobs, follows them and tells how each ended (`Outcome`); the
local one runs them here, the SLURM one through submitit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launcher.config import Config
from launcher.report import (
    Targets,
    format_table,
    format_verdicts,
    load_reports,
    load_verdicts,
    missing_train_report,
    summarize,
)
from launcher.rundir import PREWARM, VERIFY
from launcher.selfcheck import selfcheck
from launcher.store.manifest import read_manifest
from launcher.submit.jobs import JobSpec, prewarm_job, train_job, verify_job

log = logging.getLogger("jaxwarm.flow")

EXIT_COLD = 1
EXIT_ERROR = 2


@dataclass(frozen=True)
class Outcome:
    """How one job ended, as the backend tells it."""

    job: str
    ok: bool
    # One line for the user when the job did not complete (which process/job, its log).
    detail: str = ""
    # What `jaxwarm` exits with when this is the first job that did not complete.
    exit_code: int = 1


class Backend(Protocol):
    name: str
    # True when submit() already ran the jobs to their end (local), False when it only
    # queued them (SLURM): then the flow follows them only when asked to wait.
    runs_in_foreground: bool

    def submit(self, config: Config, jobs: list[JobSpec]) -> list[Any]: ...

    def follow(self, handles: list[Any]) -> list[Outcome]: ...

    def hints(self, config: Config, handles: list[Any]) -> list[str]: ...


def plan(command: str, config: Config, pinned: Path, prewarm: bool = True) -> list[JobSpec]:
    """The jobs of a command, in order; each starts only when the one before completed.
    Every job is built before any starts, so a missing entrypoint stops the launch first."""
    if command == VERIFY:
        return [verify_job(config, pinned)]
    jobs = [prewarm_job(config, pinned)] if prewarm or command == PREWARM else []
    if command == "launch":
        jobs.append(train_job(config, pinned))
    return jobs


def run(command: str, config: Config, jobs: list[JobSpec], backend: Backend, *,
        wait: bool = False) -> int:
    """Submit the planned jobs (`plan`) and follow them as the command asks."""
    if command != VERIFY:
        return run_jobs(command, config, backend, jobs, wait)
    # Beside the verify job: is the key prediction its verdicts rest on exact on this JAX?
    with selfcheck(jobs[0].env) as check:
        code = run_jobs(command, config, backend, jobs, wait)
        return code if code == EXIT_ERROR else max(code, check.finish())


def run_jobs(command: str, config: Config, backend: Backend, jobs: list[JobSpec],
             wait: bool) -> int:
    handles = backend.submit(config, jobs)
    if not (backend.runs_in_foreground or wait or command == VERIFY):
        for line in backend.hints(config, handles):
            print(line)
        return 0
    outcomes = backend.follow(handles)
    failed = next((outcome for outcome in outcomes if not outcome.ok), None)
    if failed is not None:
        log.error("%s", failed.detail)
        return EXIT_ERROR if command == VERIFY and failed.exit_code == 1 else failed.exit_code
    if command == VERIFY:
        return print_verdicts(config)
    print_report(config.run_dir, config, trained=command == "launch")
    return 0


def print_report(run_dir: Path, config: Config, show_all: bool = False,
                 trained: bool = False) -> None:
    """The headline first (the prewarmed targets: hit or why not), then the table. A training
    job that ran and wrote no report is said as that, with what it means."""
    reports = load_reports(run_dir)
    manifest = read_manifest(config.cache.dir, strict=False)
    lines = summarize(reports, manifest, config.run.name)
    if trained:
        lines += missing_train_report(reports)
    for line in lines:
        print(line)
    print(format_table(reports, Targets.of(manifest), config.cache.min_compile_time_secs,
                       show_all))


def print_verdicts(config: Config) -> int:
    """Process 0's verify result: WARM/COLD lines; 0 when every function is warm, else 1."""
    result = load_verdicts(config.run_dir)
    for line in format_verdicts(result.functions):
        print(line)
    return 0 if result.warm else EXIT_COLD

"""The one launch flow, for every backend and for one config or several.

checks -> run-dir lock -> pin -> cache check -> jobs -> report. Every input is checked
before anything is written or started (config, overrides, entrypoint, run dirs, jobs of an
earlier launch still in the run dir); each run dir is held by its lock for the launch's whole
life; the config is pinned into the run dir, the cache entries this run expects are checked,
then the backend (`launcher.submit.backend`) submits the jobs and tells how each ended.

The prewarm job verifies before it compiles (`prewarm.job`): a function whose entry is
already in the cache is not compiled again, so a warm relaunch pays one short job (imports,
lowering) on either backend, and `launch --slurm` keeps its one prewarm -> train chain.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config import Config, ConfigError, load_config
from launcher.errors import EXIT_COLD, EXIT_ERROR, EXIT_FAILED, EXIT_OK
from launcher.records import dumps
from launcher.report import (
    Targets,
    attempt_summaries,
    first_step_lines,
    format_table,
    format_verdicts,
    load_first_steps,
    load_reports,
    load_verdicts,
    missing_train_report,
    summarize,
    with_cache_check,
)
from launcher.rundir import PREWARM, TRAIN, VERIFY, pinned_config, slurm_dir, unfinished
from launcher.selfcheck import selfcheck
from launcher.store.manifest import read_manifest
from launcher.submit.backend import Backend
from launcher.submit.jobs import JobSpec, check_modules, prewarm_job, train_job, verify_job
from launcher.submit.prepare import (
    adopt_run_dir,
    holding_run_dir,
    prepare_cache,
    resolve_run,
    write_run_dir,
)
from launcher.submit.sbatch import render

log = logging.getLogger("jaxwarm.flow")

LAUNCH = "launch"


@dataclass(frozen=True)
class Request:
    """What the command line asked for: `launch`, `prewarm` (one config or several) or
    `verify`, with the options that change the flow."""

    command: str
    configs: list[str]
    overrides: list[str]
    prewarm: bool = True
    check_cache: bool = True
    wait: bool = False


def launch(request: Request, backend: Backend) -> int:
    """The whole flow; the exit code of the command (the worst of its configs)."""
    if len(request.configs) > 1 and request.command != PREWARM:
        raise ConfigError(f"{request.configs[1]}: '{request.command}' takes one config "
                          f"(only 'prewarm' takes several); overrides look like KEY.SUB=VALUE")
    # Every config is checked and every job built before anything is written or started.
    configs = [load_config(path, request.overrides) for path in request.configs]
    for config in configs:
        check_modules(config)
    runs = [resolve_run(config) for config in configs]
    refuse_shared_run_dirs([config for config, _ in runs])
    plans = [(config, plan(request.command, config, pinned, request.prewarm))
             for config, pinned in runs]
    with ExitStack() as held:
        for config, _ in plans:
            held.enter_context(holding_run_dir(config))
            backend.refuse_busy(config)
        for config, _ in plans:
            write_run_dir(config)
            log.info("%s: run dir %s, cache %s, on %s", config.source, config.run_dir,
                     config.cache.dir, backend.name)
            bad = prepare_cache(config, request.check_cache, repair=request.command != VERIFY)
        if request.command == VERIFY:
            # Beside the verify job: is the key prediction its verdicts rest on exact here?
            with selfcheck(plans[0][1][0].env) as check:
                code = finish(request, plans[0][0], backend, backend.submit(plans)[0], bad)
                return code if code == EXIT_ERROR else max(code, check.finish())
        handles = backend.submit(plans)
        return max(finish(request, config, backend, jobs)
                   for (config, _), jobs in zip(plans, handles, strict=True))


def refuse_shared_run_dirs(configs: list[Config]) -> None:
    """Two configs of one `prewarm` in one run dir would pin over each other's config."""
    seen: dict[Path, Config] = {}
    for config in configs:
        first = seen.setdefault(config.run_dir, config)
        if first is not config:
            raise ConfigError(f"{config.source}: run.name: run dir {config.run_dir} is also "
                              f"the run dir of {first.source}; give each config its own "
                              f"run.name")


def plan(command: str, config: Config, pinned: Path, prewarm: bool = True) -> list[JobSpec]:
    """The jobs of a command, in order; each starts only when the one before completed.
    Every job is built before any starts, so a missing entrypoint stops the launch first."""
    if command == VERIFY:
        return [verify_job(config, pinned)]
    jobs = [prewarm_job(config, pinned)] if prewarm or command == PREWARM else []
    if command == LAUNCH:
        jobs.append(train_job(config, pinned))
    return jobs


def finish(request: Request, config: Config, backend: Backend, handles: list[Any],
           bad: dict[str, str] | None = None) -> int:
    """Follow one config's submitted jobs as the command asks, then report (verify's
    verdicts with the entries the cache check found `bad`)."""
    command = request.command
    if not (backend.runs_in_foreground or request.wait or command == VERIFY):
        for line in backend.hints(config, handles):
            print(line)
        return EXIT_OK
    outcomes = backend.follow(handles)
    failed = next((outcome for outcome in outcomes if not outcome.ok), None)
    if failed is not None:
        log.error("%s", failed.detail)
        return EXIT_ERROR if command == VERIFY and failed.exit_code == EXIT_FAILED \
            else failed.exit_code
    if command == VERIFY:
        return print_verdicts(config, bad or {})
    print_report(config.run_dir, config, trained=command == LAUNCH)
    return EXIT_OK


def status(run_dir: Path, backend: Backend) -> int:
    """`jaxwarm status`: the state of each job the backend recorded, then each training
    attempt's init summary."""
    lines = backend.job_lines(run_dir)
    if not lines:
        raise ConfigError(f"{run_dir}: no {backend.name} jobs recorded for this run dir")
    for line in lines + attempt_summaries(load_reports(run_dir)):
        print(line)
    pinned = pinned_config(run_dir)
    if pinned.is_file():
        problem = unfinished(run_dir, load_config(pinned).train.steps)
        if problem:  # sacct says COMPLETED for a trainer that exits 0 early
            print(f"{TRAIN}: {problem}")
    return EXIT_OK


def render_script(config_path: str, overrides: list[str], job_name: str) -> int:
    """`jaxwarm render`: print a job's sbatch script. Of the run dir it writes only what the
    script needs into a new one (pinned config, log folder), never over a run that exists
    (`adopt_run_dir`)."""
    config, pinned = resolve_run(load_config(config_path, overrides))
    job = prewarm_job(config, pinned) if job_name == PREWARM else train_job(config, pinned)
    log_dir = slurm_dir(config.run_dir, job.name)
    with holding_run_dir(config):
        adopt_run_dir(config)
        log_dir.mkdir(parents=True, exist_ok=True)
    print(render(config, job.name, job.argv, job.env, log_dir), end="")
    return EXIT_OK


def show_report(run_dir: Path, as_json: bool = False, show_all: bool = False) -> int:
    """`jaxwarm report`: a run's init reports, as the table or as one JSON list."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run dir (expected <out_dir>/<run name>)")
    if as_json:
        print(dumps(load_reports(run_dir), indent=1))
        return EXIT_OK
    pinned = pinned_config(run_dir)
    if not pinned.is_file():
        raise ConfigError(f"{run_dir}: no {pinned.name}: not a run dir made by jaxwarm")
    print_report(run_dir, load_config(pinned), show_all=show_all)
    return EXIT_OK


def print_report(run_dir: Path, config: Config, show_all: bool = False,
                 trained: bool = False) -> None:
    """The headline first (the prewarmed targets: hit or why not), then the table. A training
    job that ran and wrote no report is said as that, with what it means."""
    reports = load_reports(run_dir)
    manifest = read_manifest(config.cache.dir, strict=False)
    lines = summarize(reports, manifest, config.run.name, config.cache.dir) + \
        first_step_lines(load_first_steps(run_dir))
    if trained:
        lines += missing_train_report(reports)
    for line in lines:
        print(line)
    print(format_table(reports, Targets.of(manifest), config.cache.min_compile_time_secs,
                       show_all))


def print_verdicts(config: Config, bad: dict[str, str]) -> int:
    """Process 0's verify result, with the entries the cache check read in full and found
    `bad` COLD: WARM/COLD lines; 0 when every function is warm, else 1."""
    verdicts = with_cache_check(load_verdicts(config.run_dir).functions, bad)
    for line in format_verdicts(verdicts):
        print(line)
    return 0 if all(v.warm for v in verdicts) else EXIT_COLD

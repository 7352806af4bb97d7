"""The one launch flow, for every backend and for one config or several.

checks -> run-dir lock -> pin -> cache check -> prewarm decision -> jobs -> report. Every
input is checked
before anything is written or started (config, overrides, entrypoint, run dirs, jobs of an
earlier launch still in the run dir); each run dir is held by its lock for the launch's whole
life; the config is pinned into the run dir, the cache entries this run expects are checked,
then the backend (`jaxwarm.launcher.submit.backend`) submits the jobs and tells how each ended.

The prewarm job verifies before it compiles (`jaxwarm.prewarm.job`): a function whose entry is
already in the cache is not compiled again. Better still, with `--prewarm auto` (the
default) a launch whose fingerprint (`jaxwarm.launcher.submit.fingerprint`: what the login node can
know that enters the keys) matches a completed prewarm's, with its entries intact, submits
the training job alone: on SLURM no allocation, no queue wait, for a prewarm that would
have found everything warm.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxwarm.launcher import mlperf
from jaxwarm.launcher.config import Config, ConfigError, load_config
from jaxwarm.launcher.doctor import selfcheck
from jaxwarm.launcher.environment import dropped_variables
from jaxwarm.launcher.errors import EXIT_COLD, EXIT_ERROR, EXIT_FAILED, EXIT_OK
from jaxwarm.launcher.files import atomic_write
from jaxwarm.launcher.records import (
    Fingerprint,
    PrewarmDecision,
    PrewarmProgress,
    dumps,
    read_record,
)
from jaxwarm.launcher.report import (
    PrewarmedFunctions,
    attempt_summaries,
    duration,
    first_step_lines,
    format_table,
    format_verdicts,
    load_first_steps,
    load_reports,
    load_verdicts,
    missing_train_report,
    phase_table,
    progress_line,
    summarize,
    trainer_cost,
    warm_start_lines,
    with_cache_check,
)
from jaxwarm.launcher.rundir import (
    PREWARM,
    TRAIN,
    VERIFY,
    local_jobs_path,
    mlperf_logs,
    pinned_config,
    prewarm_decision_path,
    prewarm_progress_path,
    slurm_dir,
    step_reached,
    submitted_jobs_path,
    unfinished,
    verify_fingerprint_path,
)
from jaxwarm.launcher.store.commands import human_size
from jaxwarm.launcher.store.integrity import FULL_CHECK_BYTES
from jaxwarm.launcher.store.store import CacheStore, open_store
from jaxwarm.launcher.submit.backend import Backend
from jaxwarm.launcher.submit.fingerprint import changed_reads, differences, fingerprint, listed
from jaxwarm.launcher.submit.jobs import (
    JobSpec,
    check_modules,
    prewarm_job,
    train_job,
    verify_job,
    verify_trainer_job,
)
from jaxwarm.launcher.submit.prepare import (
    adopt_run_dir,
    holding_run_dir,
    prepare_cache,
    resolve_run,
    write_run_dir,
)
from jaxwarm.launcher.submit.sbatch import render
from jaxwarm.launcher.submit.slurm import ACTIVE_STATES
from jaxwarm.launcher.words import plural

log = logging.getLogger("jaxwarm.flow")

LAUNCH = "launch"
ALWAYS, AUTO, NEVER = "always", "auto", "never"
PREWARM_MODES = (ALWAYS, AUTO, NEVER)


@dataclass(frozen=True)
class Request:
    """What the command line asked for: `launch`, `prewarm` (one config or several) or
    `verify`, with the options that change the flow."""

    command: str
    configs: list[str]
    overrides: list[str]
    # always, auto (without it when a completed prewarm had this fingerprint), never.
    prewarm: str = AUTO
    check_cache: bool = True
    wait: bool = False
    # verify --trainer: ask the trainer's own code, not the step factory; `until_all`: past
    # the trainer's first step, until every prewarmed function is looked up.
    trainer: bool = False
    until_all: bool = False


def launch(request: Request, backend: Backend) -> int:
    """The whole flow; the exit code of the command (the worst of its configs)."""
    if len(request.configs) > 1 and request.command != PREWARM:
        raise ConfigError(f"{request.configs[1]}: '{request.command}' takes one config "
                          f"(only 'prewarm' takes several); overrides look like KEY.SUB=VALUE")
    # Every config is checked and every job built before anything is written or started.
    configs = [load_config(path, request.overrides) for path in request.configs]
    for config in configs:
        check_modules(config)
        backend.refuse_platform(config)
    runs = [resolve_run(config, verify=request.command == VERIFY) for config in configs]
    refuse_shared_run_dirs([config for config, _ in runs])
    if request.until_all and not request.trainer:
        raise ConfigError("verify: --until-all-looked-up goes with --trainer (it lets the "
                          "trainer run past its first step)")
    plans = [(config, plan(request.command, config, pinned, request.prewarm != NEVER,
                           request.trainer, request.until_all))
             for config, pinned in runs]
    say_dropped(sorted({name for _, jobs in plans for job in jobs
                        for name in dropped_variables(os.environ, job.env)}))
    prints = {config.run_dir: fingerprint(config, pinned, backend.name)
              for config, pinned in runs}
    with ExitStack() as held:
        for config, _ in plans:
            held.enter_context(holding_run_dir(config))
            backend.refuse_busy(config)
        decided = []
        for (config, jobs), (_, pinned) in zip(plans, runs, strict=True):
            write_run_dir(config, pinned)
            log.info("%s: run dir %s, cache %s, on %s", config.source, config.run_dir,
                     config.cache.dir, backend.name)
            store = open_store(config.cache.dir)  # one per run: its usage log read once
            bad = prepare_cache(config, store, request.check_cache,
                                repair=request.command != VERIFY)
            if request.command != VERIFY:
                decision = decide_prewarm(request, config, store, prints[config.run_dir])
                write_decision(config.run_dir, decision)
                local = store.local
                if decision.keys and local is not None:  # as if its own prewarm found them
                    manifest = local.manifest(strict=False)
                    local.uses_entries([manifest[key] for key in decision.keys
                                        if key in manifest], config.run.name)
                jobs = [job for job in jobs if job.name != PREWARM or decision.prewarm]
            else:  # its misses are said against a prewarm of this fingerprint first
                atomic_write(verify_fingerprint_path(config.run_dir),
                             dumps(prints[config.run_dir], indent=1) + "\n")
            decided.append((config, jobs))
        plans = decided
        if request.command == VERIFY:
            # Beside the verify job: is the key prediction its verdicts rest on exact here?
            # verify --trainer predicts nothing (it hears the keys JAX computes): no check.
            with nullcontext() if request.trainer else selfcheck(plans[0][1][0].env) as check:
                code = finish(request, plans[0][0], backend, backend.submit(plans)[0], bad)
                return code if code == EXIT_ERROR or check is None else \
                    max(code, check.finish())
        handles = backend.submit(plans)
        return max(finish(request, config, backend, jobs)
                   for (config, _), jobs in zip(plans, handles, strict=True))


def say_dropped(names: list[str]) -> None:
    """One line naming the variables of the launching shell the jobs do not get."""
    if names:
        log.warning("the shell's %s %s not passed on to the jobs: jaxwarm gives every job its "
                    "own (set them in the config's xla_flags, jax or env section)",
                    ", ".join(names), plural(len(names), "is", "are"))


def decide_prewarm(request: Request, config: Config, store: CacheStore,
                   found: Fingerprint) -> PrewarmDecision:
    """Whether this launch runs its prewarm job, and why (logged, kept in the run dir, shown
    by the report). With `auto`, not when a completed prewarm ran under the same
    fingerprint (everything the launcher can know that enters the keys) and every entry it
    left is intact: the training job's processes still look each function up under JAX's
    own key, and report a miss by component as always."""
    mode = ALWAYS if request.command == PREWARM else request.prewarm
    if mode == NEVER:
        # The mode is said beside the reason (`decision_lines`, the log): not again in it.
        decision = PrewarmDecision(mode, False, "the training job compiles what is not in "
                                                "the cache", found)
    elif mode == ALWAYS:
        why = "jaxwarm prewarm" if request.command == PREWARM else "asked for"
        decision = PrewarmDecision(mode, True, why, found)
    else:
        decision = auto_decision(config, store, found, request.check_cache)
    log.info("%s: prewarm job %s (%s): %s", config.source,
             "runs" if decision.prewarm else "skipped", decision.mode, decision.why)
    return decision


def auto_decision(config: Config, cache: CacheStore, found: Fingerprint,
                  full_check: bool) -> PrewarmDecision:
    """`auto`: a recorded prewarm of this fingerprint, the files its step factory read
    unchanged, whose entries would all load, checked in full where that is cheap
    (`check_relied`); anything else runs the prewarm job."""
    store = cache.local
    if store is None:
        return PrewarmDecision(AUTO, True, "a remote cache dir keeps no record of prewarms",
                               found)
    records = store.prewarms()
    match = records.get(found.digest)
    if match is None:
        earlier = [r for r in records.values() if r.run == config.run.name] or \
            list(records.values())
        why = f"no completed prewarm has this fingerprint ({found.digest})"
        if earlier:
            last = earlier[-1]
            why += (f"; since the prewarm of run {last.run!r} {ago(last.time)}: "
                    + ", ".join(differences(last.fingerprint, found)))
        return PrewarmDecision(AUTO, True, why, found)
    changed = changed_reads(match.fingerprint.reads)
    if changed:
        return PrewarmDecision(AUTO, True, f"the fingerprint matches the prewarm of run "
                                           f"{match.run!r}, but its step factory read "
                                           f"{listed(changed)}, changed since", found)
    relied = store.check_relied(match.keys, full_check)
    if relied.problem is not None:
        return PrewarmDecision(AUTO, True, f"the fingerprint matches the prewarm of run "
                                           f"{match.run!r}, but {relied.problem}", found)
    if relied.full:
        checked = (f"its {len(match.keys)} entries are intact (read in full: "
                   f"{human_size(relied.size)} in {1e3 * relied.seconds:.0f} ms)")
    else:
        why = "--no-check-cache" if not full_check else \
            f"more than the {human_size(FULL_CHECK_BYTES)} a launch reads in full"
        checked = (f"its {len(match.keys)} entries pass the quick check (size and first "
                   f"bytes only: {human_size(relied.size)}, {why}; one corrupted without "
                   f"changing its size is missed by the training job, whose report says why)")
    return PrewarmDecision(AUTO, False, (
        f"the fingerprint ({found.digest}) matches the prewarm of run {match.run!r} "
        f"{ago(match.time)} and {checked}; the training job's processes check their keys "
        f"as they load"), found, keys=match.keys)


def ago(when: float) -> str:
    return f"{duration(max(time.time() - when, 0.0))} ago"


def write_decision(run_dir: Path, decision: PrewarmDecision) -> None:
    atomic_write(prewarm_decision_path(run_dir), dumps(decision, indent=1) + "\n")


def decision_lines(run_dir: Path) -> list[str]:
    """What the latest launch decided about its prewarm job, for the report."""
    path = prewarm_decision_path(run_dir)
    decision = read_record(PrewarmDecision, path)
    if decision is None:
        return []
    return [f"prewarm job: {'ran' if decision.prewarm else 'skipped'} "
            f"(--prewarm {decision.mode}): {decision.why}"]


def refuse_shared_run_dirs(configs: list[Config]) -> None:
    """Two configs of one `prewarm` in one run dir would pin over each other's config."""
    seen: dict[Path, Config] = {}
    for config in configs:
        first = seen.setdefault(config.run_dir, config)
        if first is not config:
            raise ConfigError(f"{config.source}: run.name: run dir {config.run_dir} is also "
                              f"the run dir of {first.source}; give each config its own "
                              f"run.name")


def plan(command: str, config: Config, pinned: Path, prewarm: bool = True,
         trainer: bool = False, until_all: bool = False) -> list[JobSpec]:
    """The jobs of a command, in order; each starts only when the one before completed.
    Every job is built before any starts, so a missing entrypoint stops the launch first."""
    if command == VERIFY:
        return [verify_trainer_job(config, pinned, until_all) if trainer
                else verify_job(config, pinned)]
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
    if command == LAUNCH:  # the job ended well, but did it train? (exit 0 before its steps)
        problem = unfinished(config.run_dir, config.train.steps)
        if problem:
            log.error("%s: %s", TRAIN, problem)
            return EXIT_FAILED
    print_report(config.run_dir, config, trained=command == LAUNCH)
    return EXIT_OK


def status(run_dir: Path, backend: Backend | None) -> int:
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
        adopt_run_dir(config)
        log_dir.mkdir(parents=True, exist_ok=True)
    print(render(config, job.name, job.argv, job.env, log_dir), end="")
    return EXIT_OK


def show_report(run_dir: Path, as_json: bool = False, show_all: bool = False,
                plot: Path | None = None) -> int:
    """`jaxwarm report`: a run's init reports, as the table or as one JSON list; with
    `plot`, also its init phases drawn into a PNG."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run dir (expected <out_dir>/<run name>)")
    if plot is not None:
        from jaxwarm.launcher.plot import plot_init, plot_path

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


def print_report(run_dir: Path, config: Config, show_all: bool = False,
                 trained: bool = False, looking_back: bool = False) -> None:
    """The headline first (the prewarmed targets: hit or why not), then the table. A training
    job that ran and wrote no report is said as that, with what it means; `looking_back`
    (`jaxwarm report`, after the launch), training that has not reached its steps too."""
    reports = load_reports(run_dir)
    store = open_store(config.cache.dir)
    manifest = store.manifest(strict=False)
    lines = [*decision_lines(run_dir),
             *summarize(reports, manifest, config.run.name, store, run_dir),
             *warm_start_lines(reports), *first_step_lines(load_first_steps(run_dir))]
    if trained:
        lines += missing_train_report(reports)
    if looking_back:  # `jaxwarm report`: a training job may have stopped early, or still run
        problem = unfinished(run_dir, config.train.steps, ended=False)
        lines += [f"{TRAIN}: {problem}"] if problem else []
    for line in lines:
        print(line)
    targets = PrewarmedFunctions.of(manifest)
    print(format_table(reports, targets, config.cache.min_compile_time_secs, show_all))
    for line in phase_table(reports, targets):
        print(line)
    logs = mlperf_logs(run_dir)
    if config.report.mlperf and logs:  # the latest attempt's: its init against MLPerf's own checker
        print(mlperf.check_line(logs[-1], config.init_budget_s))


def print_verdicts(config: Config, bad: dict[str, str]) -> int:
    """Process 0's verify result, with the entries the cache check read in full and found
    `bad` COLD: WARM/COLD lines; 0 when every function is warm, else 1."""
    result = load_verdicts(config.run_dir)
    verdicts = with_cache_check(result.functions, bad)
    for line in format_verdicts(verdicts):
        print(line)
    if result.trainer_s is not None:
        print(trainer_cost(result))
        reached = step_reached(config.run_dir)
        if not result.warm and reached is not None and reached >= config.train.steps:
            # A trainer that resumes a finished run (the demo's, after `make demo`) ends
            # at its checkpoint before any step: COLD here says nothing of a new run.
            print(f"verify --trainer: run {config.run.name} has done its {config.train.steps} "
                  f"steps (its metrics reach step {reached}): a trainer that resumes it "
                  f"has nothing left to run; ask for a new run.name or more train.steps")
    return EXIT_OK if all(v.warm for v in verdicts) else EXIT_COLD

"""The one launch flow, for every backend and for one config or several.

checks -> run-dir lock -> pin -> cache check -> prewarm decision -> jobs -> report. Every
input is checked
before anything is written or started (config, overrides, entrypoint, run dirs, jobs of an
earlier launch still in the run dir); each run dir is held by its lock for the launch's whole
life; the config is pinned into the run dir, the cache entries this run expects are checked,
then the backend (`jaxwarm.submit.backend`) submits the jobs and tells how each ended.

The prewarm job verifies before it compiles (`jaxwarm.job.prewarm`): a function whose entry is
already in the cache is not compiled again. Better still, with `--prewarm auto` (the
default) a launch whose fingerprint (`jaxwarm.submit.fingerprint`: what the login node can
know that enters the keys) matches a completed prewarm's, with its entries intact, submits
the training job alone: on SLURM no allocation, no queue wait, for a prewarm that would
have found everything warm.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from jaxwarm.core.config import Config, load_config
from jaxwarm.core.environment import VERIFY_INVOCATION, dropped_variables
from jaxwarm.core.errors import EXIT_ERROR, EXIT_FAILED, EXIT_OK, ConfigError
from jaxwarm.core.files import atomic_write
from jaxwarm.core.jsonio import dumps
from jaxwarm.core.records import PREWARM, TRAIN, Fingerprint, PrewarmDecision, differences, listed
from jaxwarm.core.rundir import prewarm_decision_path, unfinished, verify_fingerprint_path
from jaxwarm.core.words import duration, human_size, plural
from jaxwarm.jaxkey.doctor import selfcheck
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.integrity import FULL_CHECK_BYTES
from jaxwarm.store.store import open_store
from jaxwarm.submit.backend import Backend, Outcome, Run
from jaxwarm.submit.fingerprint import changed_reads, fingerprint
from jaxwarm.submit.jobs import (
    JobSpec,
    check_modules,
    prewarm_job,
    train_job,
    verify_job,
    verify_trainer_job,
)
from jaxwarm.submit.prepare import (
    holding_run_dir,
    keep_earlier_reports,
    prepare_cache,
    resolve_run,
    write_run_dir,
)
from jaxwarm.submit.results import print_report, print_verdicts

log = logging.getLogger(__name__)

LAUNCH = "launch"
ALWAYS, AUTO, NEVER = "always", "auto", "never"
PREWARM_MODES = (ALWAYS, AUTO, NEVER)

H = TypeVar("H")  # a backend's handle on a submitted job: the flow hands it back unread


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


def launch(request: Request, backend: Backend[H]) -> int:
    """`jaxwarm launch` and `jaxwarm prewarm` (one config or several): the whole flow; the
    exit code of the command (the worst of its configs)."""
    configs = checked_configs(request, backend)
    resolved = [resolve_run(config) for config in configs]
    refuse_shared_run_dirs([config for config, _ in resolved])
    # Under --prewarm never the prewarm job is not even built; otherwise it is, and the
    # decision below (under the lock, once the cache is checked) may leave it out.
    runs = [Run(config, pinned, plan(request.command, config, pinned,
                                     request.prewarm != NEVER))
            for config, pinned in resolved]
    say_dropped(runs)
    prints = {run.config.run_dir: fingerprint(run.config, run.pinned, backend.name)
              for run in runs}
    with holding(runs, backend):
        decided = []
        for run in runs:
            config = run.config
            run, store = pinned_store(run, backend)
            # `jaxwarm prewarm` runs no training job: the run's training reports stay.
            keep_earlier_reports(config.run_dir,
                                 (PREWARM,) if request.command == PREWARM else None)
            # The entries it finds bad are quarantined here, so a job compiles them again;
            # verify only says them.
            prepare_cache(config, store, request.check_cache, repair=True)
            decision = decide_prewarm(request, config, store, prints[config.run_dir])
            write_decision(config.run_dir, decision)
            if decision.keys:  # as if its own prewarm found them
                manifest = store.manifest(strict=False)
                store.uses_entries([manifest[key] for key in decision.keys
                                    if key in manifest], config.run.name)
            decided.append(dataclasses.replace(run, jobs=[
                job for job in run.jobs if job.name != PREWARM or decision.prewarm]))
        handles = backend.submit(decided)
        return max(finish(request, run.config, backend, jobs)
                   for run, jobs in zip(decided, handles, strict=True))


def verify(request: Request, backend: Backend[H]) -> int:
    """`jaxwarm verify` (one config): the verify job (`verify --trainer`: the trainer's own
    run) asks about a would-be run and writes nothing of the run's own: its config is pinned
    beside its verdicts, the cache is checked but not repaired, no prewarm is decided. Exit 0
    when every function is warm, EXIT_COLD when one is not, EXIT_ERROR when the job gave no
    answer."""
    if request.until_all and not request.trainer:
        raise ConfigError("verify: --until-all-looked-up goes with --trainer (it lets the "
                          "trainer run past its first step)")
    [config] = checked_configs(request, backend)
    config, pinned = resolve_run(config, verify=True)
    run = Run(config, pinned, [verify_trainer_job(config, pinned, request.until_all)
                               if request.trainer else verify_job(config, pinned)])
    say_dropped([run])
    with holding([run], backend):
        run, store = pinned_store(run, backend)
        bad = prepare_cache(config, store, request.check_cache, repair=False)
        # Its misses are said against a prewarm of this fingerprint first, as a launch's.
        atomic_write(verify_fingerprint_path(config.run_dir),
                     dumps(fingerprint(config, pinned, backend.name), indent=1) + "\n")
        # Beside the verify job: is the key prediction its verdicts rest on exact here?
        # verify --trainer predicts nothing (it hears the keys JAX computes): no check.
        with nullcontext() if request.trainer else selfcheck(run.jobs[0].env) as check:
            [handles] = backend.submit([run])
            code = finish_verify(config, backend, handles, bad,
                                 run.jobs[0].env[VERIFY_INVOCATION], request.trainer)
            # No verdicts (EXIT_ERROR) is the answer whatever the self-check says; `check`
            # is None under --trainer.
            return code if code == EXIT_ERROR or check is None else max(code, check.finish())


def checked_configs(request: Request, backend: Backend[H]) -> list[Config]:
    """Every config loaded and checked (its step and entrypoint modules, the backend's
    machines) before anything is written or started."""
    if len(request.configs) > 1 and request.command != PREWARM:
        raise ConfigError(f"{request.configs[1]}: '{request.command}' takes one config "
                          f"(only 'prewarm' takes several); overrides look like KEY.SUB=VALUE")
    configs = [load_config(path, request.overrides) for path in request.configs]
    for config in configs:
        check_modules(config)
        backend.refuse_platform(config)
    return configs


@contextmanager
def holding(runs: list[Run], backend: Backend[H]) -> Iterator[None]:
    """Every run dir locked for the launch's whole life, and none busy with the jobs of an
    earlier launch (asked under the lock, so no other launch can start them meanwhile)."""
    with ExitStack() as held:
        for run in runs:
            held.enter_context(holding_run_dir(run.config))
            backend.refuse_busy(run.config)
        yield


def pinned_store(run: Run, backend: Backend[H]) -> tuple[Run, CacheStore]:
    """The run dir written (the pinned config) once every check passed: the run, its jobs
    given the sha256 of what was pinned (`JobSpec.pinned`), and the run's store."""
    digest = write_run_dir(run.config, run.pinned)
    log.info("%s: run dir %s, cache %s, on %s", run.config.source, run.config.run_dir,
             run.config.cache.dir, backend.name)
    pinned = dataclasses.replace(run, jobs=[job.pinned(digest) for job in run.jobs])
    return pinned, open_store(run.config.cache.dir)  # one per run: its usage log read once


def say_dropped(runs: list[Run]) -> None:
    """One line naming the variables of the launching shell the jobs do not get."""
    names = sorted({name for run in runs for job in run.jobs
                    for name in dropped_variables(os.environ, job.env)})
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


def auto_decision(config: Config, store: CacheStore, found: Fingerprint,
                  full_check: bool) -> PrewarmDecision:
    """`auto`: a recorded prewarm of this fingerprint, the files its step factory read
    unchanged, whose entries would all load, checked in full where that is cheap
    (`CacheStore.check_relied`); anything else runs the prewarm job (a remote cache dir
    records no prewarm: it always runs)."""
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
    """The jobs of `launch` or `prewarm`, in order; each starts only when the one before
    completed. Every job is built before any starts, so a missing entrypoint stops the
    launch first."""
    jobs = [prewarm_job(config, pinned)] if prewarm or command == PREWARM else []
    if command == LAUNCH:
        jobs.append(train_job(config, pinned))
    return jobs


def finish(request: Request, config: Config, backend: Backend[H], handles: list[H]) -> int:
    """Follow one config's submitted jobs as the command asks, then report."""
    if not (backend.runs_in_foreground or request.wait):
        for line in backend.hints(config, handles):
            print(line)
        return EXIT_OK
    failed = first_failure(backend, handles)
    if failed is not None:
        return failed.exit_code
    if request.command == LAUNCH:  # the jobs ended well, but did it train? (exit 0 early)
        problem = unfinished(config.run_dir, config.train.steps)
        if problem:
            log.error("%s: %s", TRAIN, problem)
            return EXIT_FAILED
    print_report(config.run_dir, config, trained=request.command == LAUNCH)
    return EXIT_OK


def finish_verify(config: Config, backend: Backend[H], handles: list[H],
                  bad: dict[str, str], invocation: str, trainer: bool) -> int:
    """Wait for the verify job (its verdicts are the command's answer, on every backend),
    then print those it wrote (`invocation`) with the entries the cache check found `bad`."""
    failed = first_failure(backend, handles)
    if failed is not None:
        # A job that failed gave no verdicts: an error, not the EXIT_COLD of a cold answer.
        return EXIT_ERROR if failed.exit_code == EXIT_FAILED else failed.exit_code
    return print_verdicts(config, bad, invocation, trainer)


def first_failure(backend: Backend[H], handles: list[H]) -> Outcome | None:
    """Wait until the jobs ended; the first that did not complete, logged, or None."""
    failed = next((outcome for outcome in backend.follow(handles) if not outcome.ok), None)
    if failed is not None:
        log.error("%s", failed.detail)
    return failed



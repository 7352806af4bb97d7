"""What a command prints when a run's jobs have ended: the init report (after `jaxwarm
launch` and `prewarm`, and for `jaxwarm report` later) and verify's verdicts. Shared by the
launch flow (`jaxwarm.submit.flow`) and the CLI's commands (`jaxwarm.cli.commands`); the
words themselves are `jaxwarm.report.render`'s.
"""

from __future__ import annotations

from pathlib import Path

from jaxwarm.core.config import Config
from jaxwarm.core.errors import EXIT_COLD, EXIT_OK, ConfigError
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import TRAIN, PrewarmDecision, VerifyResult, not_looked_up
from jaxwarm.core.rundir import (
    mlperf_logs,
    prewarm_decision_path,
    step_reached,
    unfinished,
    verify_result_path,
)
from jaxwarm.job.record import mlperf
from jaxwarm.report.read import PrewarmedFunctions, load_first_steps, load_reports, load_verdicts
from jaxwarm.report.render import (
    first_step_lines,
    format_table,
    format_verdicts,
    missing_train_report,
    phase_table,
    summarize,
    trainer_cost,
    warm_start_lines,
    with_cache_check,
)
from jaxwarm.store.store import open_store


def decision_lines(run_dir: Path) -> list[str]:
    """What the latest launch decided about its prewarm job, for the report."""
    path = prewarm_decision_path(run_dir)
    decision = read_record(PrewarmDecision, path)
    if decision is None:
        return []
    return [f"prewarm job: {'ran' if decision.prewarm else 'skipped'} "
            f"(--prewarm {decision.mode}): {decision.why}"]


def print_report(run_dir: Path, config: Config, show_all: bool = False,
                 trained: bool = False, looking_back: bool = False) -> None:
    """The headline first (the prewarmed targets: hit or why not), then the table. A training
    job that ran and wrote no report is said as that, with what it means; `looking_back`
    (`jaxwarm report`, after the launch), training that has not reached its steps too."""
    reports = load_reports(run_dir)
    store = open_store(config.cache.dir)
    manifest = store.manifest(strict=False)  # a broken one is logged: the report goes on
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


def print_verdicts(config: Config, bad: dict[str, str], invocation: str, trainer: bool) -> int:
    """Process 0's verify result, the one this verify's job wrote (`invocation`), with the
    entries the cache check read in full and found `bad` COLD: WARM/COLD lines; 0 when
    every function is warm, else 1."""
    result = load_verdicts(config.run_dir, invocation) or no_answer(config, trainer)
    verdicts = with_cache_check(result.functions, bad)
    for line in format_verdicts(verdicts):
        print(line)
    if result.trainer_s is not None:  # verify --trainer: the trainer's own time was spent
        print(trainer_cost(result))
    if trainer:
        reached = step_reached(config.run_dir)
        if not result.warm and reached is not None and reached >= config.train.steps:
            # A trainer that resumes a finished run (the demo's, after `make demo`) ends
            # at its checkpoint before any step: COLD here says nothing of a new run.
            print(f"verify --trainer: run {config.run.name} has done its {config.train.steps} "
                  f"steps (its metrics reach step {reached}): a trainer that resumes it "
                  f"has nothing left to run; ask for a new run.name or more train.steps")
    return EXIT_OK if all(v.warm for v in verdicts) else EXIT_COLD


def no_answer(config: Config, trainer: bool) -> VerifyResult:
    """The answer of a verify whose job ended well without writing one. The verify job
    always writes one, so from it that is an error; a trainer (verify --trainer) that ended
    before its recorder heard any prewarmed function (an exit before its first jit, or
    before it imported jax) leaves every function this run's prewarm compiled COLD."""
    if not trainer:
        raise ConfigError(f"{verify_result_path(config.run_dir)}: the verify job ended without "
                          f"writing its answer")
    prewarmed = {entry.function
                 for entry in open_store(config.cache.dir).run_entries(config.run.name)}
    return VerifyResult(0, not_looked_up(list(prewarmed), (
        "the trainer ended before it looked it up, and before it wrote any answer (it exited "
        "before its first compile of a function the prewarm compiled)")))

"""`jaxwarm`: launch, prewarm and report. The edge where config errors become exit codes.

Everything that can be wrong with the input is checked before the first process starts:
config, overrides, entrypoint lookup and the run dir all come first.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
from contextlib import ExitStack
from pathlib import Path

from launcher import flow, selfcheck
from launcher.config import Config, ConfigError, load_config
from launcher.errors import one_line
from launcher.flow import EXIT_ERROR, Backend
from launcher.records import dumps
from launcher.report import attempt_summaries, load_reports
from launcher.rundir import PREWARM, TRAIN, pinned_config, slurm_dir, unfinished
from launcher.store import commands as cache_commands
from launcher.submit import local, slurm
from launcher.submit.jobs import JobSpec, check_modules, prewarm_job, train_job
from launcher.submit.prepare import (
    adopt_run_dir,
    holding_run_dir,
    prepare_cache,
    resolve_run,
    write_run_dir,
)
from launcher.submit.sbatch import render

log = logging.getLogger("jaxwarm")


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="KEY.SUB=VALUE",
                        help="override config values (VALUE is read as YAML)")
    parser.add_argument("--no-check-cache", action="store_true",
                        help="skip checking the cache entries this run expects to load")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--local", dest="backend", action="store_const", const="local",
                       help="run on this machine (default when sbatch is not available)")
    where.add_argument("--slurm", dest="backend", action="store_const", const="slurm",
                       help="submit to SLURM (default when sbatch is available)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxwarm", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    launch = commands.add_parser("launch", help="prewarm the cache, then run the training job")
    _add_job_arguments(launch)
    launch.add_argument("--no-prewarm", action="store_true", help="skip the prewarm job")
    launch.add_argument("--wait", action="store_true",
                        help="SLURM: follow the jobs and print the init report at the end")
    prewarm = commands.add_parser(
        "prewarm", help="compile the step into the cache only (several configs: one job each)")
    _add_job_arguments(prewarm)
    prewarm.add_argument("--wait", action="store_true", help="SLURM: follow the jobs")
    verify = commands.add_parser(
        "verify", help="will the run hit? lower and predict keys, no compile "
                       "(exit 0 warm, 1 cold, 2 error)")
    _add_job_arguments(verify)
    render = commands.add_parser("render", help="print the sbatch script of a job")
    render.add_argument("config", help="YAML config file")
    render.add_argument("overrides", nargs="*", metavar="KEY.SUB=VALUE")
    render.add_argument("--job", choices=(PREWARM, TRAIN), required=True)
    report = commands.add_parser("report", help="show a run's init reports")
    report.add_argument("run_dir", type=Path, help="<out_dir>/<run name>")
    report.add_argument("--json", action="store_true", help="print one JSON list")
    report.add_argument("--all", action="store_true",
                        help="list every compile, also the small ones summed up in one line")
    status = commands.add_parser("status", help="a run's SLURM jobs, restarts and init summary")
    status.add_argument("run_dir", type=Path, help="<out_dir>/<run name>")
    cache_commands.add_parser(commands)
    commands.add_parser("doctor", help="is the cache-key prediction exact on this JAX? "
                                       "(exit 0 yes, 1 no, 2 untested or cannot check)")
    return parser


def choose_backend(requested: str | None) -> Backend:
    if requested is None:
        requested = "slurm" if shutil.which("sbatch") else "local"
    return slurm.SlurmBackend() if requested == "slurm" else local.LocalBackend()


def prewarm_many_on_slurm(args: argparse.Namespace, runs: list[tuple[Config, JobSpec]]) -> int:
    jobs = slurm.submit_prewarm_array(runs)
    slurm.print_submitted(jobs)
    if not args.wait:
        return 0
    states = slurm.follow(jobs)
    failed = [f"{job.job_id} {states[job.job_id]}" for job in jobs
              if states[job.job_id] != "COMPLETED"]
    if failed:
        log.error("prewarm jobs did not complete: %s", ", ".join(failed))
        return 1
    return 0


def split_positionals(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Config files and KEY=VALUE overrides, in any order after the first config."""
    configs = [args.config] + [item for item in args.overrides if "=" not in item]
    overrides = [item for item in args.overrides if "=" in item]
    if len(configs) > 1 and args.command != "prewarm":
        raise ConfigError(f"{configs[1]}: '{args.command}' takes one config "
                          f"(only 'prewarm' takes several); overrides look like KEY.SUB=VALUE")
    return configs, overrides


def cmd_jobs(args: argparse.Namespace) -> int:
    paths, overrides = split_positionals(args)
    # Every config is checked and every job built before anything is written or started.
    configs = [load_config(path, overrides) for path in paths]
    for config in configs:
        check_modules(config)
    backend = choose_backend(args.backend)
    runs = [resolve_run(config) for config in configs]
    refuse_shared_run_dirs([config for config, _ in runs])
    plans = [flow.plan(args.command, config, pinned, not getattr(args, "no_prewarm", False))
             for config, pinned in runs]
    with ExitStack() as held:
        for config, _ in runs:
            held.enter_context(holding_run_dir(config))
            if isinstance(backend, slurm.SlurmBackend):
                slurm.refuse_active_jobs(config)
        for config, _ in runs:
            write_run_dir(config)
            log.info("%s: run dir %s, cache %s, on %s", config.source, config.run_dir,
                     config.cache.dir, backend.name)
            prepare_cache(config, not args.no_check_cache)
        if isinstance(backend, slurm.SlurmBackend) and args.command == "prewarm" \
                and len(configs) > 1:
            return prewarm_many_on_slurm(
                args, [(config, jobs[0]) for (config, _), jobs in zip(runs, plans, strict=True)])
        worst = 0
        for (config, _), jobs in zip(runs, plans, strict=True):
            code = flow.run(args.command, config, jobs, backend,
                            wait=getattr(args, "wait", False))
            worst = max(worst, code)
            if code and args.command != "prewarm":
                break
        return worst


def refuse_shared_run_dirs(configs: list[Config]) -> None:
    """Two configs of one `prewarm` in one run dir would pin over each other's config."""
    seen: dict[Path, Config] = {}
    for config in configs:
        first = seen.setdefault(config.run_dir, config)
        if first is not config:
            raise ConfigError(f"{config.source}: run.name: run dir {config.run_dir} is also "
                              f"the run dir of {first.source}; give each config its own "
                              f"run.name")


def cmd_render(args: argparse.Namespace) -> int:
    """Prints the script. Of the run dir it writes only what the script needs into a new
    one (pinned config, log folder), never over a run that exists (`adopt_run_dir`)."""
    config, pinned = resolve_run(load_config(args.config, args.overrides))
    job = prewarm_job(config, pinned) if args.job == PREWARM else train_job(config, pinned)
    log_dir = slurm_dir(config.run_dir, job.name)
    with holding_run_dir(config):
        adopt_run_dir(config)
        log_dir.mkdir(parents=True, exist_ok=True)
    print(render(config, job.name, job.argv, job.env, log_dir), end="")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    jobs = slurm.read_jobs(args.run_dir)
    if not jobs:
        raise ConfigError(f"{args.run_dir}: no SLURM jobs recorded for this run dir")
    for job in jobs:
        state = slurm.job_state(job.job_id)
        print(f"{job.name:<8} job {job.job_id:<8} {state.state:<11} restarts {state.restarts}"
              f"  reason {state.reason}  log {job.log_path()}")
    for line in attempt_summaries(load_reports(args.run_dir)):
        print(line)
    pinned = pinned_config(args.run_dir)
    if any(job.name == TRAIN for job in jobs) and pinned.is_file():
        problem = unfinished(args.run_dir, load_config(pinned).train.steps)
        if problem:  # sacct says COMPLETED for a trainer that exits 0 early
            print(f"{TRAIN}: {problem}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        raise ConfigError(f"{args.run_dir}: no such run dir (expected <out_dir>/<run name>)")
    if args.json:
        print(dumps(load_reports(args.run_dir), indent=1))
        return 0
    pinned = pinned_config(args.run_dir)
    if not pinned.is_file():
        raise ConfigError(f"{args.run_dir}: no {pinned.name}: not a run dir made by jaxwarm")
    flow.print_report(args.run_dir, load_config(pinned), show_all=args.all)
    return 0


def closed_stdout() -> int:
    """The reader of stdout went away (`jaxwarm cache ls | head -1`): end quietly, as a
    command killed by SIGPIPE does, without Python's own complaint at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come after options too (`launch c.yaml --local a.b=1`): collect them here.
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if item.startswith("-") or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="jaxwarm: %(message)s")
    try:
        commands = {"report": cmd_report, "status": cmd_status, "render": cmd_render,
                    "cache": cache_commands.run, "doctor": lambda _: selfcheck.doctor()}
        return commands.get(args.command, cmd_jobs)(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return closed_stdout()
    except Exception as exc:
        if args.verbose:
            raise
        print(f"jaxwarm: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())

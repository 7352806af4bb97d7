"""`jaxwarm`: launch, prewarm and report. The edge where config errors become exit codes.

Everything that can be wrong with the input is checked before the first process starts:
config, overrides, entrypoint lookup and the run dir all come first.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

from launcher import cache_commands, local, slurm
from launcher.bundle import BundleError
from launcher.config import Config, ConfigError, load_config
from launcher.jobs import (JobSpec, check_modules, prewarm_job, train_job, verify_job,
                           verify_result_path)
from launcher.environment import is_remote
from launcher.integrity import check_and_quarantine
from launcher.manifest import latest_for_run, read_manifest
from launcher.store import ensure_atime_files
from launcher.report import (attempt_summaries, format_table, format_verdicts, load_reports,
                             summarize)
from launcher.rundir import PINNED_CONFIG, pin_config
from launcher.sbatch import render

log = logging.getLogger("jaxwarm")

EXIT_COLD = 1
EXIT_ERROR = 2


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
    render.add_argument("--job", choices=("prewarm", "train"), required=True)
    report = commands.add_parser("report", help="show a run's init reports")
    report.add_argument("run_dir", type=Path, help="<out_dir>/<run name>")
    report.add_argument("--json", action="store_true", help="print one JSON list")
    status = commands.add_parser("status", help="a run's SLURM jobs, restarts and init summary")
    status.add_argument("run_dir", type=Path, help="<out_dir>/<run name>")
    cache_commands.add_parser(commands)
    return parser


def choose_backend(requested: str | None) -> str:
    if requested is not None:
        return requested
    return "slurm" if shutil.which("sbatch") else "local"


def print_report(run_dir: Path, cache_dir: str) -> None:
    reports = load_reports(run_dir)
    print(format_table(reports))
    for line in summarize(reports, read_manifest(cache_dir)):
        print(line)


def print_submitted(jobs: list[slurm.SubmittedJob]) -> None:
    for job in jobs:
        print(f"{job.name}: SLURM job {job.job_id}, log {job.log_path()}")


def print_verdicts(config: Config) -> int:
    """Process 0's verify result: WARM/COLD lines; 0 when every function is warm, else 1."""
    verdicts = json.loads(verify_result_path(config.run_dir, 0).read_text())["functions"]
    for line in format_verdicts(verdicts):
        print(line)
    return 0 if all(v["warm"] for v in verdicts) else EXIT_COLD


def run_local_job(job: JobSpec, config: Config) -> local.JobResult:
    result = local.run_job(job, config.topology, config.run_dir)
    if result.signal_received is not None:
        log.warning("%s stopped after a forwarded signal; relaunch the same command to resume "
                    "from its last checkpoint", job.name)
    elif not result.ok:
        log.error("%s failed: process %s exited with %d; last lines of its log %s",
                  job.name, result.failed_process, result.returncode, result.log_tail)
    return result


def exit_code(result: local.JobResult) -> int:
    if result.signal_received is not None:
        return 128 + result.signal_received
    return 0 if result.ok else 1


def local_verify(config: Config, pinned: Path) -> int:
    if not run_local_job(verify_job(config, pinned), config).ok:
        return EXIT_ERROR
    return print_verdicts(config)


def run_local(args: argparse.Namespace, config: Config, pinned: Path) -> int:
    if args.command == "verify":
        return local_verify(config, pinned)
    # Built first: a missing entrypoint is reported before any job starts.
    train = train_job(config, pinned) if args.command == "launch" else None
    prewarm = args.command == "prewarm" or not args.no_prewarm
    if args.command == "launch" and prewarm:
        verdict = local_verify(config, pinned)
        if verdict == 0:
            log.info("verify: every function is WARM; skipping the prewarm job")
            prewarm = False
        elif verdict == EXIT_ERROR:
            log.warning("verify failed (see above); prewarming anyway")
    jobs = [prewarm_job(config, pinned)] if prewarm else []
    for job in jobs + ([train] if train else []):
        result = run_local_job(job, config)
        if not result.ok or result.signal_received is not None:
            return exit_code(result)
    print_report(config.run_dir, config.cache.dir)
    return 0


def run_slurm(args: argparse.Namespace, config: Config, pinned: Path) -> int:
    if args.command == "verify":
        jobs = [verify_job(config, pinned)]
    else:
        jobs = [] if args.command == "launch" and args.no_prewarm else [prewarm_job(config, pinned)]
        if args.command == "launch":
            jobs.append(train_job(config, pinned))
    submitted = slurm.submit_jobs(config, jobs)
    print_submitted(submitted)
    if args.command != "verify" and not args.wait:
        print(f"follow with: jaxwarm status {config.run_dir}   "
              f"or: tail -f {submitted[-1].log_path()}")
        return 0
    states = slurm.follow(submitted)
    reason = slurm.why_cancelled(submitted, states)
    if reason is not None:
        log.error("%s", reason)
        return EXIT_ERROR if args.command == "verify" else 1
    if args.command == "verify":
        return print_verdicts(config)
    print_report(config.run_dir, config.cache.dir)
    return 0


def prewarm_many_on_slurm(args: argparse.Namespace, pinned: list[tuple[Config, Path]]) -> int:
    jobs = slurm.submit_prewarm_array(
        [(config, prewarm_job(config, path)) for config, path in pinned])
    print_submitted(jobs)
    if not args.wait:
        return 0
    states = slurm.follow(jobs)
    failed = [f"{job.job_id} {states[job.job_id].state}" for job in jobs
              if states[job.job_id].state != "COMPLETED"]
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


def prepare_cache(config: Config, check: bool) -> None:
    """Before any job: size-capped caches get the atime files JAX's eviction needs, and the
    entries this run's prewarm recorded are checked (a corrupt one is quarantined, so the
    job compiles and rewrites it instead of crashing or missing forever)."""
    if is_remote(config.cache.dir):
        return
    if config.cache.max_size != -1:
        ensure_atime_files(config.cache.dir)
    if not check:
        return
    keys = [e.key for e in latest_for_run(read_manifest(config.cache.dir), config.run.name)]
    checks, seconds = check_and_quarantine(config.cache.dir, keys)
    bad = [c for c in checks if not c.ok]
    log.info("cache check: %d entr%s of run %s checked in %.0f ms, %d quarantined "
             "(--no-check-cache skips this)", len(checks), "y" if len(checks) == 1 else "ies",
             config.run.name, 1e3 * seconds, len(bad))


def cmd_jobs(args: argparse.Namespace) -> int:
    paths, overrides = split_positionals(args)
    # Every config is checked before any job of any of them starts.
    configs = [load_config(path, overrides) for path in paths]
    for config in configs:
        check_modules(config)
    backend = choose_backend(args.backend)
    if backend == "slurm" and args.command == "prewarm" and len(configs) > 1:
        pinned_configs = [pin_config(config) for config in configs]
        for config, _ in pinned_configs:
            prepare_cache(config, not args.no_check_cache)
        return prewarm_many_on_slurm(args, pinned_configs)
    worst = 0
    for config in configs:
        config, pinned = pin_config(config)
        log.info("%s: run dir %s, cache %s, on %s", config.source, config.run_dir,
                 config.cache.dir, backend)
        prepare_cache(config, not args.no_check_cache)
        code = (run_slurm if backend == "slurm" else run_local)(args, config, pinned)
        worst = max(worst, code)
        if code and args.command != "prewarm":
            break
    return worst


def cmd_render(args: argparse.Namespace) -> int:
    config, pinned = pin_config(load_config(args.config, args.overrides))
    job = prewarm_job(config, pinned) if args.job == "prewarm" else train_job(config, pinned)
    log_dir = config.run_dir / "slurm" / job.name
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
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        raise ConfigError(f"{args.run_dir}: no such run dir (expected <out_dir>/<run name>)")
    if args.json:
        print(json.dumps(load_reports(args.run_dir), indent=1))
        return 0
    pinned = args.run_dir / PINNED_CONFIG
    if not pinned.is_file():
        raise ConfigError(f"{args.run_dir}: no {PINNED_CONFIG}: not a run dir made by jaxwarm")
    print_report(args.run_dir, load_config(pinned).cache.dir)
    return 0


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
                    "cache": cache_commands.run}
        return commands.get(args.command, cmd_jobs)(args)
    except (ConfigError, BundleError) as exc:
        print(f"jaxwarm: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except subprocess.CalledProcessError as exc:
        print(f"jaxwarm: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())

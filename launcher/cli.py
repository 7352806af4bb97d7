"""`jaxwarm`: launch, prewarm and report. The edge where config errors become exit codes.

Everything that can be wrong with the input is checked before the first process starts:
config, overrides, entrypoint lookup and the run dir all come first.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path

from launcher import local
from launcher.config import Config, ConfigError, load_config
from launcher.jobs import JobSpec, prewarm_job, train_job, verify_job, verify_result_path
from launcher.manifest import read_manifest
from launcher.report import format_table, format_verdicts, load_reports, summarize
from launcher.rundir import PINNED_CONFIG, pin_config

log = logging.getLogger("jaxwarm")

EXIT_COLD = 1
EXIT_ERROR = 2


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="KEY.SUB=VALUE",
                        help="override config values (VALUE is read as YAML)")
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
    prewarm = commands.add_parser("prewarm", help="compile the step into the cache only")
    _add_job_arguments(prewarm)
    verify = commands.add_parser(
        "verify", help="will the run hit? lower and predict keys, no compile "
                       "(exit 0 warm, 1 cold, 2 error)")
    _add_job_arguments(verify)
    report = commands.add_parser("report", help="show a run's init reports")
    report.add_argument("run_dir", type=Path, help="<out_dir>/<run name>")
    report.add_argument("--json", action="store_true", help="print one JSON list")
    return parser


def choose_backend(requested: str | None) -> str:
    if requested is not None:
        return requested
    return "slurm" if shutil.which("sbatch") else "local"


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


def run_verify(config: Config, pinned: Path) -> int:
    """Run the verify job on the run's layout; print process 0's verdicts; 0 warm, 1 cold."""
    shutil.rmtree(config.run_dir / "verify", ignore_errors=True)
    result = run_local_job(verify_job(config, pinned), config)
    if not result.ok:
        return EXIT_ERROR
    verdicts = json.loads(verify_result_path(config.run_dir, 0).read_text())["functions"]
    for line in format_verdicts(verdicts):
        print(line)
    return 0 if all(v["warm"] for v in verdicts) else EXIT_COLD


def cmd_jobs(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    backend = choose_backend(args.backend)
    if backend == "slurm":
        raise ConfigError("SLURM submission is not available in this version of jaxwarm yet; "
                          "run with --local")
    config, pinned = pin_config(config)
    train = train_job(config, pinned) if args.command == "launch" else None
    log.info("run dir %s, cache %s", config.run_dir, config.cache.dir)
    if args.command == "verify":
        return run_verify(config, pinned)
    prewarm = args.command == "prewarm" or not args.no_prewarm
    if args.command == "launch" and prewarm:
        verdict = run_verify(config, pinned)
        if verdict == 0:
            log.info("verify: every function is WARM; skipping the prewarm job")
            prewarm = False
        elif verdict == EXIT_ERROR:
            log.warning("verify failed (see above); prewarming anyway")
    for job in ([prewarm_job(config, pinned)] if prewarm else []) + ([train] if train else []):
        result = run_local_job(job, config)
        if not result.ok or result.signal_received is not None:
            return exit_code(result)
    reports = load_reports(config.run_dir)
    print(format_table(reports))
    for line in summarize(reports, read_manifest(config.cache.dir)):
        print(line)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        raise ConfigError(f"{args.run_dir}: no such run dir (expected <out_dir>/<run name>)")
    reports = load_reports(args.run_dir)
    if args.json:
        print(json.dumps(reports, indent=1))
        return 0
    print(format_table(reports))
    pinned = args.run_dir / PINNED_CONFIG
    if pinned.is_file():
        for line in summarize(reports, read_manifest(load_config(pinned).cache.dir)):
            print(line)
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
        if args.command == "report":
            return cmd_report(args)
        return cmd_jobs(args)
    except ConfigError as exc:
        print(f"jaxwarm: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

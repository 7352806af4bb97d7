"""`jaxwarm`: the command line. It parses the arguments and hands them on: the launch flow
(checks, lock, pin, cache check, jobs, report) is `jaxwarm.submit.flow`, for every backend, and
errors become one line and an exit code in `jaxwarm.core.errors`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from jaxwarm.cli import cache as cache_commands
from jaxwarm.cli import commands
from jaxwarm.core.config import add_overrides_argument
from jaxwarm.core.errors import run_main
from jaxwarm.core.records import PREWARM, TRAIN, VERIFY
from jaxwarm.jaxkey import doctor
from jaxwarm.submit import flow
from jaxwarm.submit.backend import choose_backend, recorded_backend


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file")
    add_overrides_argument(parser, "override config values (VALUE is read as YAML)")
    parser.add_argument("--no-check-cache", action="store_true",
                        help="skip checking the cache entries this run expects to load")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--local", dest="backend", action="store_const", const="local",
                       help="run on this machine (default when sbatch is not available)")
    where.add_argument("--slurm", dest="backend", action="store_const", const="slurm",
                       help="submit to SLURM (default when sbatch is available)")


def installed_version() -> str:
    """jaxwarm's version as installed: pyproject.toml's, the one copy, from its metadata."""
    try:
        return metadata.version("jaxwarm")
    except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
        return "(not installed: pip install -e . gives it its version)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxwarm", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"jaxwarm {installed_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    launch = commands.add_parser("launch", help="prewarm the cache, then run the training job")
    _add_job_arguments(launch)
    launch.add_argument("--prewarm", choices=flow.PREWARM_MODES, default=flow.AUTO,
                        help="run the prewarm job always, never, or (auto, the default) "
                             "unless a completed prewarm had this launch's fingerprint and "
                             "its entries are intact")
    launch.add_argument("--no-prewarm", dest="prewarm", action="store_const",
                        const=flow.NEVER, help="the same as --prewarm never")
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
    verify.add_argument("--trainer", action="store_true",
                        help="run the real entrypoint with its real arguments up to the "
                             "lookup of each prewarmed function, and answer from the keys "
                             "its own lowering gives (compiles nothing it can avoid); it "
                             "stops before the trainer's first step runs")
    verify.add_argument("--until-all-looked-up", dest="until_all", action="store_true",
                        help="with --trainer: let the trainer run past its first step until "
                             "it has looked up every prewarmed function (one first called "
                             "at step 5 is answered, not UNKNOWN): the trainer trains and "
                             "writes its outputs (checkpoints, metrics) as in a launch")
    render = commands.add_parser("render", help="print the sbatch script of a job")
    render.add_argument("config", help="YAML config file")
    add_overrides_argument(render)
    render.add_argument("--job", choices=(PREWARM, TRAIN), required=True)
    report = commands.add_parser("report", help="show a run's init reports")
    report.add_argument("run_dir", type=Path, help="<out_dir>/<run name>")
    report.add_argument("--json", action="store_true", help="print one JSON list")
    report.add_argument("--all", action="store_true",
                        help="a row for every process (not folded into p1-p63) and every "
                             "compile, also the small ones summed up in one line")
    report.add_argument("--plot", type=Path, metavar="PNG",
                        help="also draw the init phases per process into a PNG "
                             "(needs matplotlib: pip install 'jaxwarm[plot]')")
    status = commands.add_parser("status", help="a run's SLURM jobs, restarts and init summary")
    status.add_argument("run_dir", type=Path, help="<out_dir>/<run name>")
    cache_commands.add_parser(commands)
    commands.add_parser("doctor", help="is the cache-key prediction exact on this JAX? "
                                       "(exit 0 yes, 1 no, 2 untested or cannot check)")
    return parser


def split_positionals(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Config files and KEY=VALUE overrides, in any order after the first config."""
    configs = [args.config] + [item for item in args.overrides if "=" not in item]
    overrides = [item for item in args.overrides if "=" in item]
    return configs, overrides


def cmd_jobs(args: argparse.Namespace) -> int:
    configs, overrides = split_positionals(args)
    request = flow.Request(args.command, configs, overrides,
                           prewarm=getattr(args, "prewarm", flow.AUTO),
                           check_cache=not args.no_check_cache,
                           wait=getattr(args, "wait", False),
                           trainer=getattr(args, "trainer", False),
                           until_all=getattr(args, "until_all", False))
    run = flow.verify if args.command == VERIFY else flow.launch
    return run(request, choose_backend(args.backend))


def cmd_render(args: argparse.Namespace) -> int:
    return commands.render_script(args.config, args.overrides, args.job)


def cmd_status(args: argparse.Namespace) -> int:
    return commands.status(args.run_dir, recorded_backend(args.run_dir))


def cmd_report(args: argparse.Namespace) -> int:
    return commands.show_report(args.run_dir, as_json=args.json, show_all=args.all,
                                plot=args.plot)


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
    commands = {"report": cmd_report, "status": cmd_status, "render": cmd_render,
                "cache": cache_commands.run, "doctor": lambda _: doctor.doctor()}
    command = commands.get(args.command, cmd_jobs)
    # -v shows a bug's traceback; without it a bug is one line that names itself a bug.
    return run_main(lambda: quietly(command, args), bugs_as_one_line=not args.verbose)


def quietly(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """The command, ending quietly when its stdout is closed (inside `run_main`, which would
    say a BrokenPipeError as an error line)."""
    try:
        return command(args)
    except BrokenPipeError:
        return closed_stdout()


if __name__ == "__main__":
    sys.exit(main())

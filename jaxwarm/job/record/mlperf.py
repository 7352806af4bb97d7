"""MLPerf's own measure of init: `:::MLLOG` lines a training job emits, and MLPerf's checker.

With `report.mlperf: true`, process 0 of the training job logs, through the `mlperf-logging`
package (the `mlperf` extra), only what it can honestly say: `init_start` at the process's
start (its time from /proc, so imports count), `init_stop` and `run_start` right before the
step's first execution: where its compile or cache load ended and, in a job of several
processes, after the ranks' meeting that follows it (waiting for ranks still compiling is
init too). Lines go to the job's log (stdout) and to `<run dir>/mlperf-r<restart>.log`.

MLPerf's compliance checker (`mlperf_logging.compliance_checker`) wants a whole benchmark's
keys (submission, eval, run_stop...), which a launcher cannot emit. `check_init` runs that
checker with the init-time rule of its own rule file, taken verbatim from the package
(`init_start`, `init_stop` exactly once, `run_start` exactly once, `init_stop` minus the
first `init_start` under the budget), the budget set to the run's `init_budget_s` (1800 s:
MLPerf's 30 minutes, the closed division).
"""

from __future__ import annotations

import io
import logging
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from jaxwarm.core.files import RefusedFile, fresh_file, make_dirs, stream_lines
from jaxwarm.core.jsonio import load_json

log = logging.getLogger(__name__)

PACKAGE = "mlperf-logging"
INSTALL = "pip install 'jaxwarm[mlperf]'"
# The keys of the init-time rule, as the package's common.yaml names them.
INIT_KEYS = ("init_start", "init_stop", "run_start")
TOKEN = ":::MLLOG "
# jaxwarm writes three lines; a log bigger than this is not one it wrote.
MLPERF_LOG_CAP = 16 << 20
# The rule wants each init key once: past this many of their lines it fails whatever follows.
MAX_INIT_LINES = 64


class MlperfUnavailable(ImportError):
    """mlperf-logging is not installed: one line saying how to get it."""


def _mllog() -> Any:
    try:
        from mlperf_logging import mllog
    except ImportError:
        raise MlperfUnavailable(f"report.mlperf needs the {PACKAGE} package: "
                                f"{INSTALL}") from None
    return mllog


class MlperfLog:
    """Process 0's MLPerf lines: `init_start` when made, `init_stop` and `run_start` at
    `stop()`. Its own logger (`jaxwarm.mlperf.lines`), so a trainer's own mllog set-up is
    left alone and nothing is printed twice."""

    def __init__(self, path: Path, start_time: float):
        mllog = _mllog()
        from mlperf_logging.mllog.mllog import MLLogger
        logger = logging.getLogger("jaxwarm.mlperf.lines")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        sink = io.TextIOWrapper(fresh_file(make_dirs(path.parent) / path.name,
                                           "an MLPerf log"), encoding="utf-8")
        for handler in (logging.StreamHandler(sys.stdout), logging.StreamHandler(sink)):
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
        self.constants = mllog.constants
        self.logger = MLLogger(logger=logger)
        self.logger.start(key=self.constants.INIT_START, value=None,
                          time_ms=_ms(start_time))

    def stop(self, init_end: float) -> None:
        """Init ended (the step is compiled or loaded) and the run starts, at `init_end`."""
        self.logger.end(key=self.constants.INIT_STOP, value=None, time_ms=_ms(init_end))
        self.logger.start(key=self.constants.RUN_START, value=None, time_ms=_ms(init_end))
        for handler in self.logger.logger.handlers:
            handler.flush()


def _ms(seconds: float) -> int:
    return int(round(seconds * 1e3))


@dataclass(frozen=True)
class InitCheck:
    """What MLPerf's checker said of a log's init: `ok`, the init it measured, its messages."""

    ok: bool
    init_s: float | None
    messages: list[str]
    ruleset: str
    version: str


def init_rules(budget_s: float, ruleset: str) -> list[dict[str, Any]]:
    """The package's own rules for the init keys (its BEGIN block and their KEY records,
    verbatim), with the budget its closed division sets (30 minutes) replaced by ours."""
    from mlperf_logging import compliance_checker

    folder = Path(compliance_checker.__file__).parent / f"training_{ruleset}"
    rules = yaml.load((folder / "common.yaml").read_text(), Loader=yaml.BaseLoader)
    kept = []
    for rule in rules:
        if "BEGIN" in rule:
            code = rule["BEGIN"]["CODE"]
            rule = {"BEGIN": {"CODE": f"{code}\ns['compile_time_mins'] = {budget_s / 60!r}"}}
        elif rule.get("KEY", {}).get("NAME") not in INIT_KEYS:
            continue
        kept.append(rule)
    return kept


def init_lines(path: Path) -> tuple[list[str], list[str]]:
    """The `:::MLLOG` lines of the init keys in an MLPerf log, and what is wrong with those
    that are not JSON: streamed, within MLPERF_LOG_CAP (`files.stream_lines`), each line's
    JSON within the nesting cap, at most MAX_INIT_LINES kept. Lines of other keys do not
    concern the init rule and are left out."""
    kept: list[str] = []
    problems: list[str] = []
    for number, line in enumerate(stream_lines(path, MLPERF_LOG_CAP, "an MLPerf log"), 1):
        _, token, record = line.partition(TOKEN)
        if not token:
            continue
        try:
            data = load_json(record)
        except ValueError as exc:
            problems.append(f"line {number}: not valid JSON ({exc})")
            continue
        if isinstance(data, dict) and data.get("key") in INIT_KEYS \
                and len(kept) < MAX_INIT_LINES:
            kept.append(TOKEN + record + "\n")
    return kept, problems


def check_init(path: Path, budget_s: float) -> InitCheck:
    """Run MLPerf's compliance checker with its init-time rule on an MLPerf log (its init
    lines, `init_lines`). Raises RefusedFile or OSError for a log that cannot be read."""
    from importlib.metadata import version

    _mllog()
    from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

    ruleset = mlp_compliance.get_parser().get_default("ruleset")
    checker = mlp_compliance.make_checker("training", ruleset, quiet=False, werror=False)
    kept, problems = init_lines(path)
    with tempfile.TemporaryDirectory(prefix="jaxwarm-mlperf-") as tmp:
        init_log = Path(tmp) / "init.log"
        init_log.write_text("".join(kept))
        lines, errors = mlp_parser.parse_file(str(init_log), ruleset=ruleset)
        rules = Path(tmp) / "init.yaml"
        rules.write_text(yaml.safe_dump(init_rules(budget_s, ruleset), sort_keys=False))
        checker.check_loglines(lines, str(rules))
    messages = problems + [f"line {line}: {error}" for line, error in errors]
    messages += [*checker.overwritable.values(), *checker.not_overwritable]
    times = {line.key: line.timestamp for line in reversed(lines)}  # the first of each key
    init_s = (times["init_stop"] - times["init_start"]) / 1e3 \
        if {"init_start", "init_stop"} <= set(times) else None
    return InitCheck(not messages, init_s, [_short(message) for message in messages],
                     ruleset, version(PACKAGE))


def _short(message: str) -> str:
    """The checker's message in one line: its first line and the test that failed."""
    lines = message.splitlines()
    failed = [line for line in lines[1:] if line.startswith("failed test:")]
    return lines[0].rstrip(":") + (f" ({failed[0]})" if failed else "")


def check_line(path: Path, budget_s: float) -> str:
    """One line for the report: what MLPerf's checker said of the run's init."""
    try:
        result = check_init(path, budget_s)
    except MlperfUnavailable as exc:
        return f"MLPerf log {path}: not checked ({exc})"
    except RefusedFile as exc:
        return f"MLPerf log {path}: not checked: {exc.why}"
    except OSError as exc:
        return f"MLPerf log {path}: not checked: cannot read it ({exc.strerror})"
    init = "-" if result.init_s is None else f"{result.init_s:.2f} s"
    verdict = "pass" if result.ok else "FAIL: " + "; ".join(result.messages)
    return (f"MLPerf log {path}: init (init_start to init_stop) {init}; {PACKAGE} "
            f"{result.version}'s compliance checker, training {result.ruleset} init rule, "
            f"{budget_s:g} s budget: {verdict}")

"""Where the suite's time goes: per test, wall and CPU seconds, written as a table.

    python -m pytest -p tests.cputime --cpu-times=times.tsv ...

On a shared, loaded machine wall time says little; CPU seconds say what a test costs.
Each row covers a test's setup, call and teardown (so a module fixture's cost lands on the
first test that uses it): wall seconds, this process's CPU, its reaped children's CPU
(JAX processes, the CLI), and the machine's busy CPU from /proc/stat, which also counts
what no child of ours runs (SLURM jobs, started by slurmd) and whatever else the machine
runs at the time. Not loaded by default: `make test` does not pay for it.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator
from pathlib import Path

import pytest

HEADER = "nodeid\toutcome\twall_s\tself_cpu_s\tchildren_cpu_s\tmachine_busy_s\n"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-times", metavar="FILE", default=None,
                     help="append one TSV row per test: wall and CPU seconds (tests/cputime.py)")


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every core, from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator:
    out = item.config.getoption("--cpu-times")
    if not out:
        yield
        return
    start = (time.monotonic(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN),
             machine_busy_s())
    outcomes: list[str] = []
    item.stash[_outcomes] = outcomes
    yield
    end = (time.monotonic(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN),
           machine_busy_s())
    outcome = "failed" if "failed" in outcomes else "skipped" if "skipped" in outcomes \
        else "passed"
    path = Path(out)
    new = not path.exists()
    with path.open("a") as f:
        if new:
            f.write(HEADER)
        f.write("\t".join([item.nodeid, outcome,
                           *(f"{b - a:.2f}" for a, b in zip(start, end, strict=True))]) + "\n")


_outcomes = pytest.StashKey[list[str]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator:
    report = (yield).get_result()
    if _outcomes in item.stash:
        item.stash[_outcomes].append(report.outcome)

"""Shared fixtures: run the real `jaxwarm` CLI in a subprocess against temp dirs (or, for
input it refuses before anything starts, in this process: `cli`); and how
`make test` spreads the suite over parallel workers (pytest-xdist, `--dist loadgroup`).

Most end-to-end tests wait on subprocesses (JAX start-up, a SLURM queue), so a few workers on
a 2-core machine overlap one test's waiting with another's compiling. Three rules keep that
sound; a new test follows them by being marked like its neighbours:

- Tests marked `slurm` share the one dev cluster (4 nodes) in two lanes, each on one worker
  in file order (xdist groups `slurm-1`, `slurm-2`; `@pytest.mark.slurm(lane=2)` picks the
  second, the first is the default). A test uses at most 2 nodes at a time, so the lanes
  never wait for each other's nodes; most of a SLURM test's time is waiting (queue, signals,
  a job's own pauses), which the other lane and the other workers fill.
- A module-scoped fixture exists to run something once for several tests: the tests that use
  one (per parameter) run on one worker, so it does run once (group `<file>::<fixture>[...]`).
  A fixture that is cheap to repeat should be function-scoped.
- The longest work is handed out first (the SLURM group, then the shared-fixture groups and
  `slow` tests, then other `e2e` tests, then the pure ones), so the workers end together
  instead of one starting a long test at the end.

Without xdist (`make check`, a plain `pytest`) the groups mean nothing and only the order
applies; no test depends on the order of the others.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import submitit  # noqa: F401  (imported before any test: see the comment below)
from filelock import FileLock

from bench.common import FAST_CHUNKWISE, LEGACY_CPU_FUSION, SMALL_STEP
from bench.common import TINY_CACHED as TINY_CACHED
from bench.common import with_xla_flag as with_xla_flag  # re-exported for the tests
from jaxwarm.jaxkey.versions import release

# submitit configures its logger with logging.config.dictConfig at its first import, which
# closes every logging handler that exists at that moment. Imported during a test (the
# SLURM backend imports it lazily), that closes pytest's log capture of the running test,
# and that test and every later one on the worker fail with "I/O operation on closed file".
# Imported here, at collection, there is no test's handler yet to close.

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo.yaml"

# The demo on one process of its 4 devices: for a test that checks nothing of several
# processes, a launch at half the CPU (on CPU the demo's second process only misses and
# compiles again).
ONE_PROCESS = ("topology.processes_per_node=1", "mesh.axes={data: 1, fsdp: 4}")
# TINY_CACHED: the tiny step, every compile cached however fast, for a test that needs the
# step compiled and in the cache (from bench.common, which the benchmarks share).
# FAST_STEP: the cheapest step there is, compiled the cheapest way, for a test of what
# happens around the compile (ranks, SLURM, signals, the store): the reference trainer's
# small step (2.7 CPU-s a one-process launch, against 6.8 for the tiny chunkwise step). A test
# that changes the chunkwise model (`step.args`) runs FAST_CHUNKWISE.
FAST_STEP = (*FAST_CHUNKWISE, SMALL_STEP)


def legacy_fusion(jax: str) -> tuple[str, ...]:
    """FAST_STEP's XLA flag of the older CPU fusion emitter where it still is (jax < 0.11):
    a small step compiles in a fraction of the time. None on a newer jax, which has no
    such flag."""
    return (LEGACY_CPU_FUSION,) if release(jax) < (0, 11) else ()


def ranks_layout(processes: int, data: int, fsdp: int) -> tuple[str, ...]:
    """Overrides for `processes` ranks of one CPU device each, the mesh data x fsdp, the
    smallest batch that mesh takes, FAST_STEP and one training step."""
    return (f"topology.processes_per_node={processes}", "topology.devices_per_process=1",
            f"mesh.axes={{data: {data}, fsdp: {fsdp}}}", f"step.args.global_batch={data * fsdp}",
            "train.steps=1", *FAST_STEP)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`jaxwarm ARGS...` as a user runs it; output captured as text."""
    return subprocess.run([sys.executable, "-m", "jaxwarm", *args], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# The `cli` fixture: `jaxwarm ARGS...` in this process, as run_cli's result.
Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """`jaxwarm ARGS...` called in this process (`jaxwarm.cli.main.main`, output from capsys),
    for input the CLI refuses before any job or JAX would start (a bad config, a broken state
    file): the same exit code and lines a user sees, without a process of its own. Its log
    lines go to pytest's log capture, not to stderr."""
    from jaxwarm.cli.main import main

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["jaxwarm", *args], code, out.out, out.err)

    return call


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for tests that only need a warm step, so the step is compiled once per
    run, not once per test. Under xdist every worker gets the same dir (beside the workers'
    own temp dirs): jaxwarm's cache store is safe for concurrent jobs."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    with FileLock(str(root / "shared-cache.lock")):
        cache = root / "shared-cache"
        cache.mkdir(exist_ok=True)
    return cache


SLURM_LANES = (1, 2)
# The order work is handed out in, first to last.
FIRST, SHARED, SLOW, E2E, PURE = range(5)


def module_fixture_group(item: pytest.Item) -> str | None:
    """`<file>::<fixtures>(<params>)`: the module-scoped fixtures this test uses that its own
    file defines, with their parameters (one group per fixture instance); None if none. Not
    `[...]`: xdist reads a node id ending in `]` as a parametrized test without a group."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    here = item.nodeid.split("::")[0]
    names = sorted(name for name, defs in info.name2fixturedefs.items()
                   if any(d.scope == "module" and d.baseid == here for d in defs))
    if not names:
        return None
    indices = getattr(getattr(item, "callspec", None), "indices", {})
    params = ",".join(f"{name}={indices[name]}" for name in names if name in indices)
    return f"{here}::{','.join(names)}" + (f"({params})" if params else "")


def slurm_group(marker: pytest.Mark) -> str:
    """`slurm-<lane>` for a test marked `slurm` (lane 1 unless `slurm(lane=N)` says)."""
    lane = marker.kwargs.get("lane", SLURM_LANES[0])
    if lane not in SLURM_LANES:
        raise pytest.UsageError(f"slurm(lane={lane!r}): the lanes are {SLURM_LANES}")
    return f"slurm-{lane}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group and order the tests for xdist's `loadgroup` scheduling (module docstring).
    First of the collection hooks: xdist's own turns each `xdist_group` mark into the node
    id's `@<group>` that its scheduler groups by, so a mark added after it groups nothing."""
    rank: dict[str, int] = {}
    for item in items:
        if (slurm := item.get_closest_marker("slurm")) is not None:
            group, order = slurm_group(slurm), FIRST
        elif (group := module_fixture_group(item)) is not None:
            order = SHARED
        else:
            order = SLOW if item.get_closest_marker("slow") else \
                E2E if item.get_closest_marker("e2e") else PURE
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        rank[item.nodeid] = order
    items.sort(key=lambda item: rank[item.nodeid])  # stable: file order within a rank

"""`python -m bench.startup [--workload reference|jsp|maxtext] [--layers N] [--tiny]
[--records N] [--arms ...] [--repeat N] [--loaded] [--prefetch auto|true] [--drop-caches]
[--png] [--json PATH]`: one startup
benchmark, the figures a user compares with a peer's: the time to first step and the init
phases of a training job started cold, right after its prewarm, warm, and warm with the page
cache dropped, each with and without `cache.prefetch`.

The workload: `reference`, the reference step (`step.args.scan_layers: false`, `--layers`
layers unrolled, so that loading its executable takes as long as users' do) in a trainer
with an init of its own (`trainer`: the reference start, the train state's init, a data
pipeline's start in pure Python over `--records` synthetic records, a batch feeder, one
step) on 1 process x 8 CPU devices (`--tiny`: the step at its smallest width, compiled the
cheapest way, as `bench.run --tiny`, for a test that the benchmark runs, not a figure to
compare); `jsp`, the jsp
example (`jsp-train`, a console script jaxwarm does not control); `maxtext`, MaxText in
`.venvs/maxtext` (`make legs`).

The arms, each a launch into a run dir of its own (`--no-prewarm`: the launch itself never
compiles ahead), with `cache.prefetch: false` and with prefetch (`--prefetch`: `auto`, the
default, which begins a load once a core is idle, or `true`, at once) one after the other,
in an order that flips each repetition (`--repeat`), so that the machine's load falls on both alike:

- `cold`: an empty cache, no prewarm (the first step compiles);
- `prewarmed`: a `jaxwarm prewarm` on an empty cache (its own wall time reported), then the
  first launch on it;
- `warm`: a relaunch on that cache (its entries in the page cache);
- `warm, page cache dropped`: the same, every file of the cache evicted from the page cache
  first: `posix_fadvise(POSIX_FADV_DONTNEED)` on each (after an fsync: only clean pages are
  dropped), or with `--drop-caches` the whole page cache (`/proc/sys/vm/drop_caches`, where
  this process may write it); the table says which. The Python and JAX installs stay cached
  (a requeued job's node has read them for its previous job, or reads them off a local disk).

`--loaded` runs one more JAX job beside the whole benchmark (a jitted matmul loop, CPU-bound
on every core), as on an oversubscribed node. Each figure is the median over repetitions;
the table shows each arm's time to first step and init phases (process 0's init report),
the targets (issue 40) below it; the JSON (`StartupResult`) goes under bench/results/,
`--png` draws the arms' phases beside it (never committed).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    FAST_CHUNKWISE,
    REPO,
    BenchError,
    Check,
    checks_table,
    machine,
    publish,
    read_json,
    run_launch,
    table,
)
from jaxwarm.core.jsonio import to_json
from jaxwarm.core.records import USED, InitReport
from jaxwarm.report.read import load_reports
from testing import jsp
from testing.legs import MAXTEXT, ready

RESULTS = REPO / "bench" / "results"
# The smallest size whose load takes 20 s or more on a quiet 2-core machine (issue 30): at
# 96 layers the load took 15.0 s, at 112 27.2 s.
DEFAULT_LAYERS = 112
# The data pipeline's start about as long as that load (issue 30: "an init of about the
# load's length"): 14M records, with the reference start, 25.4 s of init.
DEFAULT_RECORDS = 14_000_000
# One process, so that its keys are the prewarm's (on CPU a second process hashes its own
# devices and always compiles).
LAYOUT = ["topology.processes_per_node=1", "topology.devices_per_process=8",
          "mesh.axes={data: 2, fsdp: 4}", "cache.xla_caches=none"]
COLD, PREWARMED, WARM, DROPPED = "cold", "prewarmed", "warm", "warm, page cache dropped"
ARMS = {"cold": COLD, "prewarmed": PREWARMED, "warm": WARM, "dropped": DROPPED}
# A launch's cache.prefetch, without and with prefetch (`--prefetch` picks the latter).
PREFETCH_SETTINGS = ("auto", "true")
PHASES = ("imports", "trace", "lower", "compile", "cache load", "first step", "other")
FADVISE = "posix_fadvise(POSIX_FADV_DONTNEED) on each cache file"
DROP_CACHES = "the whole page cache (/proc/sys/vm/drop_caches)"
# The job beside a --loaded run: XLA's matmul keeps every core busy.
BUSY = ("import jax, jax.numpy as jnp\n"
        "x = jnp.ones((768, 768))\n"
        "step = jax.jit(lambda x: jnp.tanh(x @ x) * 0.5)\n"
        "while True:\n"
        "    x = step(x).block_until_ready()\n")


def trainer() -> int:
    """The reference workload's trainer: the reference trainer's start, the state's init,
    a data pipeline's start (STARTUP_RECORDS records), then one step."""
    import jax
    import numpy as np

    from jaxwarm.core.records import TRAIN
    from jaxwarm.job.start.jobstart import start_job
    from jaxwarm.job.start.pinned import config_from_env
    from jaxwarm.workload.data import make_global_batch

    config = config_from_env()
    recorder, mesh, bundle = start_job(config, TRAIN)
    assert bundle.train_step is not None and bundle.init_state is not None
    state = bundle.init_state(np.uint32(config.train.seed))
    token_index(int(os.environ["STARTUP_RECORDS"]))
    batches: list[Any] = []
    feeder = threading.Thread(target=lambda: batches.append(
        make_global_batch(config, mesh, 0)), daemon=True)
    feeder.start()
    feeder.join()
    state, _ = bundle.train_step(state, batches[0])
    jax.block_until_ready(state)
    recorder.mark_first_step()
    return 0


def token_index(records: int) -> dict[int, int]:
    """A data pipeline's start-up in pure Python: split each synthetic record into words and
    count each word's hashed token id (what building a vocabulary or a sample index costs)."""
    counts: dict[int, int] = {}
    for number in range(records):
        text = f"record {number} of the corpus with words {number % 97} and {number % 89}"
        for word in text.split():
            token = zlib.crc32(word.encode()) % 32000
            counts[token] = counts.get(token, 0) + 1
    return counts


@dataclass(frozen=True)
class Trainer:
    """How one workload is launched: its config, its run's name, the function its first
    step runs, and (given the work dir) the python, the working dir and the overrides."""

    config: Path
    run: str
    step: str
    setup: Callable[[Path], tuple[Path, Path, list[str]]]


def reference(layers: int, tiny: bool, work: Path) -> tuple[Path, Path, list[str]]:
    """The reference step at `layers` unrolled layers (with `tiny`, at its smallest width,
    compiled the cheapest way) in `trainer`."""
    return Path(sys.executable), REPO, [
        *LAYOUT, "run.name=startup", *(FAST_CHUNKWISE if tiny else ()),
        f"step.args.n_layers={layers}",
        "step.args.scan_layers=false", "entrypoint.command=null",
        "entrypoint.function=bench.startup:trainer", "train.steps=1",
        "train.checkpoint_every=0", "cache.min_compile_time_secs=0"]


def jsp_example(work: Path) -> tuple[Path, Path, list[str]]:
    pythonpath = jsp.install(work / "site")
    return Path(sys.executable), REPO, [f"env={{PYTHONPATH: {pythonpath!r}}}",
                                        f"entrypoint.args=[--out, {work / 'trainer'}]"]


def maxtext(work: Path) -> tuple[Path, Path, list[str]]:
    # From a working dir of its own: the example's relative paths (MaxText's output) land
    # there. MaxText's own cache dir goes there too (jaxwarm's stays in force).
    return MAXTEXT.python, work, [f"env.PYTHONPATH={REPO / 'examples' / 'maxtext'}",
                                  f"env.M_JAX_CACHE_DIR={work / 'maxtext-own-cache'}"]


def workload(name: str, layers: int, tiny: bool = False) -> Trainer:
    if name == "reference":
        return Trainer(REPO / "configs" / "demo.yaml", "startup", "jit_train_step",
                       functools.partial(reference, layers, tiny))
    if name == "jsp":
        return Trainer(REPO / "configs" / "jsp-example.yaml", "jsp-example", "jit_step",
                       jsp_example)
    return Trainer(REPO / "examples" / "maxtext" / "maxtext-cpu.yaml", "maxtext",
                   "jit_train_step", maxtext)


def cli(*args: str, env: dict[str, str], python: Path = Path(sys.executable),
        cwd: Path = REPO) -> None:
    """`jaxwarm ARGS...` run by `python` in `cwd`; a failure is a BenchError."""
    run_launch([str(python), "-m", "jaxwarm", *args], (env,), cwd=cwd, timeout=3600)


def train_report(run_dir: Path) -> InitReport:
    """Process 0's init report of the run's latest training attempt."""
    train = [r for r in load_reports(run_dir) if r.job == "train" and r.process_index == 0]
    if not train:
        raise BenchError(f"{run_dir}: no training init report of process 0")
    return max(train, key=lambda r: r.restart_count)


def summary(report: InitReport, step: str = "jit_train_step") -> dict[str, Any]:
    """What the init ledger's tables show of one launch: its phases, "other" by owner (the
    largest) and what no sample named, its `step`'s lookup, the prefetch and sampling."""
    phases = phase_seconds(report)
    owners = {p.function: p.seconds for p in report.phases if p.phase == "other" and p.function}
    found = next(f for f in report.functions if f.name == step)
    return {"time_to_first_step_s": report.time_to_first_step_s, "phases": phases,
            "other_by_owner": dict(sorted(owners.items(), key=lambda kv: -kv[1])[:8]),
            "other_unnamed_s": phases.get("other", 0.0) - sum(owners.values()),
            "step_hit": found.hit, "step_seconds": found.seconds,
            "prefetch": to_json(report.prefetch), "sampling": to_json(report.sampling)}


def phase_seconds(report: InitReport) -> dict[str, float]:
    phases: dict[str, float] = {}
    for phase in report.phases:
        phases[phase.phase] = phases.get(phase.phase, 0.0) + phase.seconds
    return phases


@dataclass(frozen=True)
class Launch:
    """One launch of an arm: its time to first step and phases (process 0's init report),
    whether its step hit, the prefetch's load of the step and the trainer's wait for it
    (None without prefetch), and for `prewarmed` its prewarm's own wall time."""

    arm: str
    prefetch: bool
    repeat: int
    time_to_first_step_s: float
    phases: dict[str, float]
    step_hit: bool
    step_load_s: float | None = None
    step_waited_s: float | None = None
    prewarm_wall_s: float | None = None


@dataclass(frozen=True)
class StartupResult:
    """What `bench.startup` wrote: read back with `read_result`."""

    machine: dict[str, Any]
    load_average: dict[str, list[float]]
    workload: str
    layers: int | None
    records: int | None
    repeat: int
    loaded: bool
    eviction: str
    # The cache.prefetch of the launches with prefetch. Results written before it was
    # recorded read as "true": their `auto` began every load at once, as `true` does now.
    prefetch_setting: str = "true"
    launches: list[Launch] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    # The reference step at its smallest width (`--tiny`); results before it read as False.
    tiny: bool = False


def read_result(path: Path) -> StartupResult:
    return as_result(read_json(path))


def as_result(data: dict[str, Any]) -> StartupResult:
    """The JSON `main` wrote, typed again."""
    return StartupResult(**{**data, "launches": [Launch(**row) for row in data["launches"]],
                            "checks": [Check(**check) for check in data["checks"]]})


def launch_figures(report: InitReport, arm: str, prefetch: bool, repeat: int, step: str,
                   prewarm_wall_s: float | None) -> Launch:
    if report.time_to_first_step_s is None:
        raise BenchError(f"{arm}: the launch reached no first step")
    hit = any(f.hit for f in report.functions if f.name == step)
    # The prefetch's load of the step, where it loaded it (with `auto` on a busy node it
    # may load nothing: then JAX's own load is in the phases, as without prefetch).
    fetched = [p for p in (report.prefetch.executables if report.prefetch else [])
               if p.function == step and p.outcome == USED]
    return Launch(arm, prefetch, repeat, report.time_to_first_step_s, phase_seconds(report),
                  hit, fetched[0].load_s if fetched else None,
                  fetched[0].waited_s if fetched else None, prewarm_wall_s)


def evict(cache: Path, drop_caches: bool) -> None:
    """Nothing of `cache` left in the page cache: each file fsynced (DONTNEED drops clean
    pages only) and advised out, or with `drop_caches` the whole page cache dropped."""
    if drop_caches:
        os.sync()
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
        except OSError as exc:
            raise BenchError(f"cannot write /proc/sys/vm/drop_caches ({exc.strerror}): run "
                             f"without --drop-caches (posix_fadvise on each entry)") from None
        return
    for path in sorted(cache.rglob("*")):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@contextmanager
def busy_neighbour(loaded: bool, env: dict[str, str]) -> Iterator[None]:
    """With `loaded`, one more JAX job, CPU-bound on every core, for the duration."""
    if not loaded:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", BUSY], env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


class Bench:
    """One workload's launches in a work dir: prewarms, launches, evictions."""

    def __init__(self, trainer: Trainer, work: Path, env: dict[str, str], drop_caches: bool,
                 prefetch_setting: str):
        self.trainer, self.work, self.env, self.drop_caches = trainer, work, env, drop_caches
        self.setting = {False: "false", True: prefetch_setting}
        self.python, self.cwd, self.overrides = trainer.setup(work)
        self.count = 0

    def jaxwarm(self, command: str, cache: Path, *extra: str) -> Path:
        """`jaxwarm COMMAND` of the workload on `cache` into a fresh run dir; that dir."""
        self.count += 1
        out = self.work / "runs" / f"{self.count:03d}"
        cli(command, str(self.trainer.config), "--local", f"run.out_dir={out}",
            f"cache.dir={cache}", "cache.xla_caches=none", *extra, *self.overrides,
            env=self.env, python=self.python, cwd=self.cwd)
        return out / self.trainer.run

    def prewarm(self, cache: Path) -> float:
        started = time.perf_counter()
        self.jaxwarm("prewarm", cache)
        return time.perf_counter() - started

    def launch(self, arm: str, prefetch: bool, repeat: int, cache: Path,
               prewarm_wall_s: float | None = None) -> Launch:
        if arm == DROPPED:
            evict(cache, self.drop_caches)
        run_dir = self.jaxwarm("launch", cache, "--no-prewarm",
                               f"cache.prefetch={self.setting[prefetch]}")
        return launch_figures(train_report(run_dir), arm, prefetch, repeat, self.trainer.step,
                              prewarm_wall_s)

    def repetition(self, repeat: int, arms: list[str]) -> list[Launch]:
        """Every arm once with and once without prefetch; which goes first flips with
        `repeat`. Each prefetch setting has its own prewarmed cache, whose first launch is
        the `prewarmed` arm."""
        order = [False, True] if repeat % 2 == 0 else [True, False]
        caches = {p: self.work / f"cache-{repeat}-{self.setting[p]}" for p in order}
        prewarms = ({p: self.prewarm(caches[p]) for p in order}
                    if set(arms) - {COLD} else {})
        launches = []
        for arm in arms:
            for prefetch in order:
                if arm == COLD:
                    cache = self.work / f"cold-{repeat}-{self.setting[prefetch]}"
                    launches.append(self.launch(arm, prefetch, repeat, cache))
                else:
                    launches.append(self.launch(arm, prefetch, repeat, caches[prefetch],
                                                prewarms[prefetch] if arm == PREWARMED
                                                else None))
        return launches


@dataclass(frozen=True)
class Row:
    """One arm with or without prefetch: the medians over its launches."""

    arm: str
    prefetch: bool
    launches: int
    time_to_first_step_s: float
    phases: dict[str, float]
    step_waited_s: float | None
    prewarm_wall_s: float | None


def median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def rows(launches: list[Launch]) -> list[Row]:
    """The medians of each arm and prefetch setting, in the arms' order."""
    found = []
    for arm in ARMS.values():
        for prefetch in (False, True):
            mine = [launch for launch in launches
                    if launch.arm == arm and launch.prefetch == prefetch]
            if mine:
                found.append(Row(
                    arm, prefetch, len(mine),
                    statistics.median(m.time_to_first_step_s for m in mine),
                    {p: statistics.median(m.phases.get(p, 0.0) for m in mine)
                     for p in PHASES},
                    median_or_none([m.step_waited_s for m in mine]),
                    median_or_none([m.prewarm_wall_s for m in mine])))
    return found


def pair_ratios(launches: list[Launch], arm: str) -> list[float]:
    """Each repetition's time to first step of `arm` with prefetch over without: the two ran
    one after the other, so a drift of the machine's load falls on both alike."""
    times = {(launch.repeat, launch.prefetch): launch.time_to_first_step_s
             for launch in launches if launch.arm == arm}
    return [times[repeat, True] / times[repeat, False]
            for repeat in sorted({repeat for repeat, _ in times})
            if (repeat, True) in times and (repeat, False) in times]


def goals(launches: list[Launch]) -> list[Check]:
    """Issue 40's targets, for the arms measured: warm with prefetch never slower than warm
    (the ratio of the medians, and the median of the alternated pairs' ratios), the
    trainer's own init ("other") within 5% of its time without prefetch, and the prefetch's
    ratio with the page cache dropped <= 0.6."""
    by = {(row.arm, row.prefetch): row for row in rows(launches)}
    checks = []
    for arm in (WARM, DROPPED):
        if (arm, False) not in by or (arm, True) not in by:
            continue
        plain, fetched = by[arm, False], by[arm, True]
        target, most = ("<= 1.0", 1.0) if arm == WARM else ("<= 0.6", 0.6)
        ratio = fetched.time_to_first_step_s / plain.time_to_first_step_s
        checks.append(Check(f"{arm}: with prefetch / without (time to first step)", target,
                            f"{ratio:.3f}", ratio <= most))
        pairs = pair_ratios(launches, arm)
        paired = statistics.median(pairs)
        checks.append(Check(f"{arm}: the same, per alternated pair (median of {len(pairs)})",
                            target, f"{paired:.3f} ({', '.join(f'{r:.3f}' for r in pairs)})",
                            paired <= most))
        own, own_fetched = plain.phases["other"], fetched.phases["other"]
        checks.append(Check(f"{arm}: the trainer's own init (other), with prefetch vs "
                            "without", "within 5%", f"{own_fetched:.2f} s vs {own:.2f} s",
                            own_fetched <= own * 1.05))
    return checks


def startup_table(result: StartupResult) -> str:
    """The arms' medians and the targets (`bench.tables` renders it too)."""
    width = " of the step at its smallest width" if result.tiny else ""
    size = f", {result.layers} unrolled layers{width}, {result.records} records" \
        if result.workload == "reference" else ""
    title = (f"bench.startup: {result.workload}{size}; medians of {result.repeat} "
             f"alternated repetitions{'; another JAX job beside it' if result.loaded else ''}"
             f"; page cache dropped: {result.eviction}; prefetch: "
             f"cache.prefetch {result.prefetch_setting}")
    found = rows(result.launches)
    # The targets from the launches, so that every result's table shows the same checks.
    checks = goals(result.launches)
    body = table(title, ["arm", "prefetch", "time to first step (s)", *PHASES,
                         "trainer waited for the load (s)", "prewarm (s)"],
                 [[row.arm, "yes" if row.prefetch else "no",
                   f"{row.time_to_first_step_s:.2f}",
                   *(f"{row.phases[p]:.2f}" for p in PHASES),
                   "" if row.step_waited_s is None else f"{row.step_waited_s:.2f}",
                   "" if row.prewarm_wall_s is None else f"{row.prewarm_wall_s:.1f}"]
                  for row in found])
    return body + ("\n\n" + checks_table(checks) if checks else "")


def warm_table(result: dict[str, Any]) -> str:
    """The committed `bench/results/warm-start.json`'s tables (`bench.warm_start`, which
    this benchmark replaced): its launches' phases, the demo's pairs, then the goals."""
    demo_rows = [[name, len(times), " ".join(f"{t:.2f}" for t in times),
                  f"{statistics.median(times):.2f}"]
                 for name, times in result.get("demo", {}).items()]
    return table(
        f"Warm start, {result['layers']} unrolled layers, {result['records']} records",
        ["start", "time to first step (s)", *PHASES, "other by owner"],
        [[name, f"{row['time_to_first_step_s']:.1f}",
          *(f"{row['phases'].get(p, 0.0):.1f}" for p in PHASES),
          ", ".join(f"{k} {v:.1f}" for k, v in list(row["other_by_owner"].items())[:3])]
         for name, row in result["runs"].items()]) + "\n\n" + (table(
            "The demo's warm start (its step and trainer), without and with prefetch",
            ["start", "launches", "time to first step (s)", "median (s)"],
            demo_rows) + "\n\n" if demo_rows else "") + checks_table(
        [Check(**check) for check in result["checks"]])


def draw(result: StartupResult, path: Path) -> bool:
    """The arms' median phases as bars (the report's own picture); False, nothing written,
    without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot

    from jaxwarm.report.plot import DPI
    from jaxwarm.report.plot import draw as draw_phases

    title = (f"bench.startup, {result.workload}, {result.machine['cpus']} CPUs, jax "
             f"{result.machine['jax']}{', loaded' if result.loaded else ''}")
    figure = draw_phases(pyplot, [(f"{row.arm}, {'prefetch' if row.prefetch else 'plain'}",
                                   row.phases) for row in rows(result.launches)], None, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, format="png")
    pyplot.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["reference", "jsp", "maxtext"],
                        default="reference")
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                        help="the reference step's unrolled layers")
    parser.add_argument("--tiny", action="store_true",
                        help="the reference step at its smallest width, compiled the "
                             "cheapest way (bench.common.FAST_CHUNKWISE): for a test that the "
                             "benchmark runs, not a figure to compare")
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS,
                        help="synthetic records the reference trainer's pipeline indexes")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loaded", action="store_true",
                        help="run another CPU-bound JAX job beside the benchmark")
    parser.add_argument("--prefetch", choices=PREFETCH_SETTINGS, default="auto",
                        help="the launches' cache.prefetch with prefetch (default: auto, "
                             "which waits for an idle core; true begins every load at once)")
    parser.add_argument("--drop-caches", action="store_true",
                        help="drop the whole page cache (root) instead of posix_fadvise")
    parser.add_argument("--png", action="store_true", help="draw the arms beside the JSON")
    parser.add_argument("--json", type=Path, default=None,
                        help="default: bench/results/startup-WORKLOAD[-loaded].json")
    args = parser.parse_args(argv)
    if args.workload == "maxtext" and not ready(MAXTEXT):
        print(f"bench.startup: {MAXTEXT.venv} is not built (or stale): `make legs` builds "
              f"it", file=sys.stderr)
        return 2
    path = args.json or RESULTS / f"startup-{args.workload}{'-loaded' if args.loaded else ''}.json"
    arms = [ARMS[name] for name in args.arms]
    env = {**os.environ, "STARTUP_RECORDS": str(args.records)}
    load_start = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="startup-") as tmp, \
                busy_neighbour(args.loaded, env):
            bench = Bench(workload(args.workload, args.layers, args.tiny), Path(tmp), env,
                          args.drop_caches, args.prefetch)
            launches = [launch for repeat in range(args.repeat)
                        for launch in bench.repetition(repeat, arms)]
    except BenchError as exc:
        print(f"bench.startup: {exc}", file=sys.stderr)
        return 1
    reference_run = args.workload == "reference"
    result = StartupResult(
        machine(), {"start": list(load_start), "end": list(os.getloadavg())}, args.workload,
        args.layers if reference_run else None, args.records if reference_run else None,
        args.repeat, args.loaded, DROP_CACHES if args.drop_caches else FADVISE, args.prefetch,
        launches, goals(launches), reference_run and args.tiny)
    publish(asdict(result), startup_table(result), path)
    if args.png and draw(result, path.with_suffix(".png")):
        print(f"picture: {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

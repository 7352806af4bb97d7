"""What every benchmark shares: fresh processes, the benchmark's config, medians, tables.

Every figure is taken in a fresh process, because what a job pays includes the Python and
JAX start-up and JAX keeps compiled programs in memory (a second compile in one process
measures nothing). Each figure is the median over repetitions, and each repetition starts
from its own empty directories, so a cold run is really cold.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from jaxwarm.core.config import Config, load_config
from jaxwarm.core.environment import VERIFY_INVOCATION, merge_environment
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import InitReport, VerifyResult
from jaxwarm.core.rundir import verify_result_path
from jaxwarm.report.read import load_verdicts
from jaxwarm.submit.jobs import JobSpec
from jaxwarm.submit.prepare import pin_config

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo.yaml"
# The demo's mesh (data=2 x fsdp=4) on 1 process x 8 fake CPU devices: on CPU only process 0
# can hit the cache, so one process is the whole job and nothing waits on a coordinator.
LAYOUT = "1 process x 8 CPU devices"
LAYOUT_OVERRIDES = ("topology.processes_per_node=1", "topology.devices_per_process=8")
PROCESS_TIMEOUT_S = 900.0
# The demo step at its smallest (one layer, width 32): for runs of many ranks, whose time
# goes to starting JAX and compiling in every process, not to the model.
TINY_STEP = ("step.args.n_layers=1", "step.args.d_model=32", "step.args.d_ff=32",
             "step.args.seq_len=8", "step.args.vocab_size=32", "step.args.chunks=1")
# XLA's older CPU fusion code generator: the demo step compiles in a quarter of the time the
# fusion emitters take at -O0 (0.7 s against 2.8 s, jax 0.10.2; at -O2 it is slower). For
# runs that check what compiles and what it computes, never for a figure of compile time.
LEGACY_CPU_FUSION = "--xla_cpu_use_fusion_emitters=false"


class BenchError(RuntimeError):
    """A benchmark process failed, or measured something other than what it should."""


@dataclass(frozen=True)
class Finished:
    """A process run to completion: wall time from spawn to exit, its own CPU time (user +
    system; less sensitive than wall time to other work on the machine) and peak RSS."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float


@dataclass(frozen=True)
class Check:
    """One target of the issue, next to what was measured."""

    measurement: str
    target: str
    measured: str
    met: bool


def run_process(argv: Sequence[str], env: dict[str, str],
                timeout: float = PROCESS_TIMEOUT_S) -> Finished:
    """Run `argv` in REPO and wait for it with os.wait4, which returns this child's own
    resource usage: RUSAGE_CHILDREN would be the maximum over every child ever waited for."""
    with tempfile.TemporaryFile() as sink:
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=subprocess.STDOUT)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        timer.cancel()
        if proc.returncode != 0:
            sink.seek(0)
            raise BenchError(f"{' '.join(argv)} exited with status {proc.returncode}:\n"
                             f"{sink.read().decode(errors='replace')[-3000:]}")
    # ru_maxrss is in KiB on Linux
    return Finished(wall_s, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


@dataclass(frozen=True)
class Launched:
    """A launch run to its end: each process's exit status and output (empty where it went
    to a log), and the wall time from the first spawn to the last exit."""

    returncodes: list[int]
    outputs: list[str]
    wall_s: float


def run_launch(argv: Sequence[str], envs: Sequence[dict[str, str] | None] = (None,), *,
               cwd: Path = REPO, log: Path | None = None,
               during: Callable[[list[subprocess.Popen[str]]], None] | None = None,
               check: bool = True, timeout: float | None = PROCESS_TIMEOUT_S) -> Launched:
    """`argv` run in `cwd` once per environment in `envs`, all at once, to the last exit: a
    launch (`jaxwarm launch`, one process) or a job's ranks started by hand (one each).
    `during(processes)` acts on them while they run (samples them, signals them). Their
    output goes to `log`, to be read while they run, or to a file each (a pipe per rank read
    one after the other could fill and stop a rank), kept. With `check`, a process that
    failed is a BenchError with the end of its output; past `timeout`, every one is killed."""
    with ExitStack() as files:
        shared = files.enter_context(log.open("w")) if log is not None else None
        sinks = [shared or files.enter_context(tempfile.TemporaryFile("w+")) for _ in envs]
        start = time.perf_counter()
        procs = [subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                  stdout=sink, stderr=subprocess.STDOUT, text=True)
                 for env, sink in zip(envs, sinks, strict=True)]
        try:
            if during is not None:
                during(procs)
            end = None if timeout is None else time.monotonic() + timeout
            codes = [proc.wait(None if end is None else max(0.0, end - time.monotonic()))
                     for proc in procs]
        except subprocess.TimeoutExpired:
            raise BenchError(f"{' '.join(argv[:4])} ran past {timeout:g} s") from None
        finally:
            for proc in procs:  # still running only when `during` failed or time ran out
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        wall_s = time.perf_counter() - start
        outputs = []
        for sink in sinks:
            sink.seek(0)
            outputs.append("" if sink is shared else sink.read())
    failed = [index for index, code in enumerate(codes) if code != 0]
    if check and failed:
        raise BenchError(f"{len(failed)} of {len(procs)} processes of {' '.join(argv[:4])} "
                         f"failed (exit {codes[failed[0]]}):\n"
                         f"{outputs[failed[0]][-4000:] or f'its output: {log}'}")
    return Launched(codes, outputs, wall_s)


def verify_answer(config: Config, job: JobSpec) -> VerifyResult:
    """What the verify job `job` answered for its run: the result of its own invocation."""
    result = load_verdicts(config.run_dir, job.env[VERIFY_INVOCATION])
    if result is None:
        raise BenchError(f"{verify_result_path(config.run_dir)}: the verify job wrote no answer")
    return result


def run_spec(job: JobSpec) -> Finished:
    """A job's argv with the environment the local runner gives it."""
    return run_process(job.argv, merge_environment(dict(os.environ), job.env))


def with_xla_flag(*flags: str) -> str:
    """The override `xla_flags=[...]` adding FLAGS to the demo's own flags (a list given on
    the command line replaces the config's), so the run keeps the demo's compile settings."""
    return f"xla_flags=[{', '.join([*load_config(DEMO).xla_flags, *flags])}]"


# The tiny step, every compile cached however fast: for a run that needs the step compiled
# and in the cache, whatever its compile time.
TINY_CACHED = (*TINY_STEP, "cache.min_compile_time_secs=0")
# The tiny chunkwise step compiled the cheapest way, every compile cached: for runs about
# what happens around the compile (many ranks), where neither the step's size nor its
# compile time is the point. XLA's older CPU fusion emitter, a flag of jax < 0.11 (the main
# venv's), compiles it in a quarter of the time and memory.
FAST_CHUNKWISE = (*TINY_CACHED, with_xla_flag(LEGACY_CPU_FUSION))
# The reference trainer's smallest step (`jaxwarm.workload.small`: the reference batch, one
# collective, a scalar learned): a one-process launch costs 2.7 CPU-s where FAST_CHUNKWISE
# costs 6.8 (the test suite's FAST_STEP).
SMALL_STEP = "step.factory=jaxwarm.workload.small:make_train_step"


def bench_config(work: Path, name: str, overrides: Iterable[str] = ()) -> tuple[Config, Path]:
    """The demo config on the benchmark layout, its run dir and (unless overridden) its
    cache under `work`, pinned like `jaxwarm launch` pins it (absolute paths, config.yaml in
    the run dir, the cache dir created)."""
    config = load_config(DEMO, [*LAYOUT_OVERRIDES, f"run.name={name}", f"run.out_dir={work}",
                                f"cache.dir={work / 'cache'}", *overrides])
    return pin_config(config)


def read_report(path: Path) -> InitReport:
    """The init report of a job the benchmark ran, typed (`jaxwarm.core.jsonio.read_record`);
    without one the figures would be of nothing, so it is an error."""
    report = read_record(InitReport, path)
    if report is None:
        raise BenchError(f"{path}: no readable init report (the job's log says why)")
    return report


def first_step_s(report: InitReport) -> float:
    """A job's time to first step: a job that ran no step measured nothing."""
    if report.time_to_first_step_s is None:
        raise BenchError(f"{report.label}: no first step")
    return report.time_to_first_step_s


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read {path}: {exc}") from None


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def publish(result: dict[str, Any], tables: str, path: Path) -> None:
    """Print a benchmark's tables and the load average it ran under, and write its JSON."""
    print(tables)
    print("load average (1, 5, 15 min): at start {}, at end {}".format(
        *(" ".join(f"{value:.2f}" for value in result["load_average"][when])
          for when in ("start", "end"))))
    write_json(path, result)
    print(f"figures: {path}")


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the repetitions (all samples have the same keys)."""
    return {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}


def per_layer(rows: list[dict[str, float]], key: str) -> float:
    """How `key` grows with layers: the least-squares slope over the measured sizes."""
    return statistics.linear_regression([row["layers"] for row in rows],
                                         [row[key] for row in rows]).slope


def verdict(met: bool) -> str:
    return "PASS" if met else "MISS"


def table(title: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table, padded so it also reads in a terminal; the title above it."""
    cells = [[str(cell) for cell in header], *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([title, "", line(cells[0]), rule, *(line(row) for row in cells[1:])])


def checks_table(checks: list[Check]) -> str:
    return table("Targets", ["measurement", "target", "measured", "result"],
                 [[c.measurement, c.target, c.measured, verdict(c.met)] for c in checks])


def checks_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [asdict(check) for check in checks]


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines
                 if line.startswith("model name")), "unknown")


def machine() -> dict[str, Any]:
    """What the figures were measured on. Versions come from the installed metadata: this
    process stays free of JAX, like the `jaxwarm` command whose children it times."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(),
            "memory_gb": round(memory / 2**30, 1), "python": platform.python_version(),
            "jax": version("jax"), "jaxlib": version("jaxlib"),
            "platform": platform.platform(), "layout": LAYOUT}

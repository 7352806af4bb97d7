"""`python -m bench.parallel_compile [--layers N] [--repeat N] [--tiny] [--json PATH]`: would a
prewarm gain from compiling its targets side by side? Measured before anything is built.

A prewarm compiles each target of the run's step bundle (the reference step: its train step
and its init) one after another. This benchmark compiles those same targets, lowered from
the demo config at `--layers` unrolled layers (1 process x 8 CPU devices, the persistent
cache off, in fresh processes), three ways:

- `serial`: one process compiles them one after another (what the prewarm does);
- `threads`: one process compiles them on one thread each, side by side (XLA's `compile()`
  releases the GIL);
- `processes`: one process per target, started together, each lowering and compiling its
  own.

For each way: the wall time of the compiles (from the first compile's start to the last
one's end, lowering excluded) and the CPU time of the process(es) from start to exit. The
ways are alternated across `--repeat` repetitions and the medians printed. A gain here is
`threads` or `processes` below `serial`; one XLA:CPU compile already uses more than one
core, so on a machine with few cores the ways compete for the same ones. One JSON under
bench/results/ (`ParallelCompile`). `--tiny` compiles the step at its smallest width the
cheapest way, as `bench.run --tiny` does: for a test that the benchmark runs, not a figure
to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    FAST_CHUNKWISE,
    REPO,
    BenchError,
    bench_config,
    machine,
    publish,
    read_json,
    table,
)
from bench.startup import DEFAULT_LAYERS
from bench.step_cost import bare_environment

RESULTS = REPO / "bench" / "results"
WAYS = ("serial", "threads", "processes")


def worker(pinned: str, way: str, only: str | None, out: str) -> int:
    """In a fresh process: lower the run's targets (or the one named `only`), then compile
    them `way` (serial or threads); write the compiles' start and end (epoch seconds)."""
    import jax

    from jaxwarm.core.config import load_config
    from jaxwarm.step import build_step

    config = load_config(pinned)
    for name, value in config.jax.items():
        jax.config.update(name, value)
    _, bundle = build_step(config)
    lowered = [(target.lower(), target.compiler_options) for target in bundle.compile_targets()
               if only is None or target.name == only]
    start = time.time()
    if way == "threads":
        with ThreadPoolExecutor(len(lowered)) as pool:
            list(pool.map(lambda pair: pair[0].compile(pair[1]), lowered))
    else:
        for low, options in lowered:
            low.compile(options)
    Path(out).write_text(json.dumps({"start": start, "end": time.time()}))
    return 0


@dataclass(frozen=True)
class Sample:
    """One way, once: the compiles' wall time and the processes' CPU time (user + system)."""

    way: str
    repeat: int
    compile_wall_s: float
    cpu_s: float


@dataclass(frozen=True)
class ParallelCompile:
    """What `bench.parallel_compile` wrote: read back with `read_result`."""

    machine: dict[str, Any]
    load_average: dict[str, list[float]]
    layers: int
    targets: list[str]
    repeat: int
    samples: list[Sample] = field(default_factory=list)
    # The step at its smallest width (`--tiny`); results written before it read as False.
    tiny: bool = False


def read_result(path: Path) -> ParallelCompile:
    return as_result(read_json(path))


def as_result(data: dict[str, Any]) -> ParallelCompile:
    """The JSON `main` wrote, typed again."""
    return ParallelCompile(**{**data, "samples": [Sample(**s) for s in data["samples"]]})


def run_ways(pinned: Path, env: dict[str, str], work: Path, way: str, targets: list[str],
             repeat: int) -> Sample:
    """`way` once, in fresh processes: the compiles' span and the processes' CPU time."""
    jobs = [(way if way != "processes" else "serial", name)
            for name in (targets if way == "processes" else [None])]
    procs = []
    for number, (mode, only) in enumerate(jobs):
        out = work / f"{way}-{repeat}-{number}.json"
        argv = [sys.executable, "-m", "bench.parallel_compile", "--worker", str(pinned), mode,
                str(out)] + ([only] if only else [])
        procs.append((subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
                      out))
    spans, cpu = [], 0.0
    for proc, out in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        assert proc.stdout is not None
        output = proc.stdout.read().decode(errors="replace")
        proc.stdout.close()
        if os.waitstatus_to_exitcode(status) != 0:
            raise BenchError(f"bench.parallel_compile --worker {way} failed:\n{output[-3000:]}")
        cpu += usage.ru_utime + usage.ru_stime
        spans.append(json.loads(out.read_text()))
    wall = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    return Sample(way, repeat, wall, cpu)


def compile_table(result: ParallelCompile) -> str:
    """Each way's median compile wall and CPU time, and its wall against serial's."""
    medians = {way: (statistics.median(s.compile_wall_s for s in result.samples if s.way == way),
                     statistics.median(s.cpu_s for s in result.samples if s.way == way))
               for way in WAYS}
    serial = medians["serial"][0]
    width = ", the step at its smallest width" if result.tiny else ""
    return table(f"A prewarm's compiles ({', '.join(result.targets)}, {result.layers} "
                 f"unrolled layers{width}) serially, on threads and in processes; medians of "
                 f"{result.repeat}", ["way", "compile wall (s)", "vs serial", "CPU (s)"],
                 [[way, f"{wall:.2f}", f"{wall / serial:.2f}x", f"{cpu:.1f}"]
                  for way, (wall, cpu) in medians.items()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.parallel_compile",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tiny", action="store_true",
                        help="the step at its smallest width, compiled the cheapest way "
                             "(bench.common.FAST_CHUNKWISE): for a test that the benchmark runs, "
                             "not a figure to compare")
    parser.add_argument("--json", type=Path, default=RESULTS / "parallel-compile.json")
    args = parser.parse_args(argv)
    if args.worker:
        pinned, way, out, *only = args.worker
        return worker(pinned, way, only[0] if only else None, out)
    load_start = os.getloadavg()
    samples = []
    with tempfile.TemporaryDirectory(prefix="parallel-compile-") as tmp:
        work = Path(tmp)
        config, pinned = bench_config(work, "parallel", [
            *(FAST_CHUNKWISE if args.tiny else ()), f"step.args.n_layers={args.layers}",
            "step.args.scan_layers=false"])
        env = bare_environment(config, pinned)
        targets = ["train_step", "init_state"]
        try:
            for repeat in range(args.repeat):
                order = WAYS[repeat % 3:] + WAYS[:repeat % 3]
                samples += [run_ways(pinned, env, work, way, targets, repeat) for way in order]
        except BenchError as exc:
            print(f"bench.parallel_compile: {exc}", file=sys.stderr)
            return 1
    result = ParallelCompile(machine(), {"start": list(load_start),
                                         "end": list(os.getloadavg())},
                             args.layers, targets, args.repeat, samples, args.tiny)
    publish(asdict(result), compile_table(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

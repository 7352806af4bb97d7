"""`python -m bench.wakeups [--ranks 32] [--repeats N] [--json PATH]`: where jaxwarm's added
time to first step goes when ranks outnumber cores (run it alone on the machine).

`bench.growth` measures what jaxwarm adds to a plain trainer's time to first step; at 32
ranks on 2 cores that was 45% before anything here was cut. This benchmark starts the same
two ways (`bench.growth.by_hand`, `bench.growth.with_jaxwarm`: the cheapest step, R
processes x 1 CPU device, a warm cache) and, while each runs, reads every thread of every
process from /proc twice a second: its CPU time (user + system) and its context switches
(voluntary + involuntary), last seen before it ended. They are summed by kind: the
trainers' main threads, the trainers' other threads (JAX's and XLA's, jaxwarm's ledger and
first-step watcher), the supervisors, the launcher. With R processes on fewer cores, every
wake-up of a thread is a context switch (and, for a Python thread, a pass of the GIL) that
the other ranks' compiles wait for: the count says how much of jaxwarm's added time is
waking up rather than working. From the init reports: what the ledger's sampling cost.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import DEMO, BenchError, machine, publish, table
from bench.growth import by_hand, cli, kind_of, overrides, run, with_jaxwarm
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import TRAIN, InitReport
from jaxwarm.core.rundir import report_path

RANKS = 32
REPEATS = 2
TICKS = os.sysconf("SC_CLK_TCK")
KINDS = ("trainer main", "trainer other", "supervisor", "launcher")


class Threads:
    """The threads of every Python process this one started (and theirs), read from /proc
    until stopped: the last CPU time and context-switch count each one showed, by (pid,
    tid). Only this benchmark's own: whatever else runs on the machine is not counted."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], tuple[str, float, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil
        me = psutil.Process()
        while not self._stop.wait(0.5):
            for child in me.children(recursive=True):
                self._read(child.pid)

    def _read(self, pid: int) -> None:
        try:
            argv = [part.decode() for part in
                    Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part]
            if not argv or "python" not in Path(argv[0]).name:
                return
            kind = kind_of(argv)
            for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                task = Path(f"/proc/{pid}/task/{tid}")
                stat = (task / "stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                cpu = (int(fields[11]) + int(fields[12])) / TICKS
                switches = sum(int(line.split()[1]) for line in
                               (task / "status").read_text().splitlines()
                               if "ctxt_switches" in line)
                where = f"{kind} main" if kind == "trainer" and tid == pid else \
                    f"{kind} other" if kind == "trainer" else kind
                self.seen[(pid, tid)] = (where, cpu, switches)
        except (OSError, ValueError, IndexError):
            return  # gone while read

    def stop(self) -> dict[str, dict[str, float]]:
        self._stop.set()
        self._thread.join()
        cpu: dict[str, float] = {}
        switches: Counter[str] = Counter()
        for where, seconds, count in self.seen.values():
            cpu[where] = cpu.get(where, 0.0) + seconds
            switches[where] += count
        return {"cpu_s": dict(cpu), "switches": dict(switches)}


def sampling(work: Path, runs: str, ranks: int) -> dict[str, int | float]:
    """What the ledger's samples were and cost, summed over the training job's ranks."""
    samples, cost = 0, 0.0
    for process in range(ranks):
        report = read_record(InitReport, report_path(work / runs / "demo", TRAIN, 0, process))
        if report is not None and report.sampling is not None:
            samples += report.sampling.samples
            cost += report.sampling.cost_s
    return {"samples": samples, "cost_s": cost}


def measure(ranks: int, repeats: int) -> list[dict[str, Any]]:
    pairs = []
    with tempfile.TemporaryDirectory(prefix="jaxwarm-wakeups-", dir="/tmp") as tmp:
        work = Path(tmp)
        run(cli("prewarm", str(DEMO), "--local", *overrides(work, ranks, "prewarm")))
        for repeat in range(repeats):
            pair: dict[str, Any] = {}
            # The launch without `jaxwarm report` after it: its processes would count as the
            # launcher's.
            for way, start in (("by hand", by_hand),
                               ("jaxwarm", functools.partial(with_jaxwarm, report=False))):
                threads = Threads()
                runs = f"{way.replace(' ', '-')}-{repeat}"
                out = start(work, ranks, runs)
                pair[way] = {"first_step_s": statistics.median(out["first_step_s"]),
                             "wall_s": out["wall_s"], **threads.stop()}
            pair["jaxwarm"]["sampling"] = sampling(work, f"jaxwarm-{repeat}", ranks)
            pairs.append(pair)
    return pairs


def wakeups_table(result: dict[str, Any]) -> str:
    """One row per way and repetition: time to first step, then CPU s and context switches
    (thousands) by kind."""
    rows = []
    for number, pair in enumerate(result["pairs"], 1):
        for way in ("by hand", "jaxwarm"):
            side = pair[way]
            rows.append([number, way, f"{side['first_step_s']:.1f}",
                         f"{sum(side['cpu_s'].values()):.1f}",
                         *(f"{side['cpu_s'].get(kind, 0.0):.1f}" for kind in KINDS),
                         f"{sum(side['switches'].values()) / 1e3:.0f}",
                         *(f"{side['switches'].get(kind, 0) / 1e3:.1f}" for kind in KINDS)])
    return table(
        f"{result['ranks']} ranks x 1 CPU device on {result['machine']['cpus']} CPUs, the "
        f"cheapest step, warm: CPU seconds and context switches (thousands) by kind",
        ["#", "way", "first step s", "CPU s", *(f"CPU {kind}" for kind in KINDS),
         "switches k", *(f"switches {kind}" for kind in KINDS)], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeups",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=RANKS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    path = args.json or Path(f"bench/results/wakeups-{args.ranks}.json")
    load_start = os.getloadavg()
    started = time.perf_counter()
    try:
        pairs = measure(args.ranks, args.repeats)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    result = {"machine": {**machine(), "layout": f"{args.ranks} processes x 1 CPU device"},
              "load_average": {"start": load_start, "end": os.getloadavg()},
              "seconds": time.perf_counter() - started, "ranks": args.ranks, "pairs": pairs}
    publish(result, wakeups_table(result), path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.growth [--ranks 1 8 32 64] [--repeats N] [--json PATH] [--png PATH]`: how
jaxwarm's own costs grow with the number of ranks (run it under the heavy lock).

At each rank count R the cheapest step (`bench.common.FAST_CHUNKWISE`) runs as R processes x 1
fake CPU device on this machine (mesh data=R x fsdp=1, global batch R), with one trainer,
`bench.plain_train`
(a trainer that knows nothing of jaxwarm), started two ways on the same warm cache:

- **by hand**: R processes started here, JAX's cache set through environment variables
  only (the `JAX_*` and `XLA_FLAGS` jaxwarm would give them, nothing else of jaxwarm), the
  coordinator named as the local runner names it;
- **jaxwarm**: `jaxwarm launch --local --no-prewarm` with the trainer as
  `entrypoint.function`: jaxwarm's runner, supervisors, recorder, cache hook and the ranks'
  meetings around it, and its job environment (on CPU `MALLOC_ARENA_MAX=2` too).

First one `jaxwarm prewarm --local` at R ranks fills the cache (its wall time is the cold
prewarm's). Then per repetition, each way once, in a fresh run dir:

- *time to first step per rank*: what the trainer itself measures, from its process start
  to the end of its first step (both ways the same code and clock); jaxwarm's added time is
  the difference of the medians over ranks (and of the slowest ranks);
- *wall*: from starting the command (or the R processes) to the last exit;
- *memory per rank*: the trainer's own peak RSS, and the peak RSS (VmHWM, sampled) of each
  jaxwarm process that is not a trainer: the per-rank supervisor and the launcher;
- *report time*: `jaxwarm report RUN_DIR` (the training job's R init reports), wall of a
  fresh process;
- *lock waits*: what the init reports of every rank say they waited for jaxwarm's locks
  (manifest, usage log, per-key writer locks), summed over ranks, prewarm and training.

On CPU only process 0 loads the step (JAX hashes each process's devices into the key);
every other rank compiles it, both ways. Each figure of the table is the median over the
repetitions (of each repetition's median or slowest rank), and jaxwarm's added time and
memory come with their spread: the least and the most any one repetition added. With
`--budget-s` a size gets fewer repetitions when the next would not end in time; its row
says how many it has.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.chart import save_figure
from bench.common import (
    DEMO,
    FAST_CHUNKWISE,
    BenchError,
    machine,
    publish,
    read_json,
    run_launch,
    table,
)
from jaxwarm.core.config import load_config
from jaxwarm.core.environment import job_environment, merge_environment
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import PREWARM, TRAIN, InitReport
from jaxwarm.core.rundir import pinned_config, report_path
from jaxwarm.job.start.place import process_variables
from jaxwarm.submit.local import free_port

RANKS = (1, 8, 32, 64)
REPEATS = 3
TIMEOUT_S = 3600.0
TRAINER = "bench.plain_train"


def overrides(work: Path, ranks: int, runs: str) -> list[str]:
    return [f"run.out_dir={work / runs}", f"cache.dir={work / 'cache'}",
            f"topology.processes_per_node={ranks}", "topology.devices_per_process=1",
            f"mesh.axes={{data: {ranks}, fsdp: 1}}", f"step.args.global_batch={ranks}",
            *FAST_CHUNKWISE, "train.steps=1", "stop_grace_s=60",
            f"entrypoint={{function: '{TRAINER}:main', args: ['{{config}}', "
            f"'{work / runs / 'first-step'}']}}"]


class PeakMemory:
    """Samples the peak RSS (VmHWM) of every process under a pid until stopped, by kind."""

    def __init__(self, root: int) -> None:
        import psutil
        self.psutil, self.root = psutil, root
        self.peaks: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            try:
                processes = [self.psutil.Process(self.root)]
                processes += processes[0].children(recursive=True)
            except self.psutil.Error:
                continue
            for process in processes:
                try:
                    argv = process.cmdline()
                    peak = high_water_mb(process.pid)
                except (self.psutil.Error, OSError):
                    continue
                # An exiting process that has let go of its memory (not yet a zombie) shows
                # no argv and no VmHWM: sampled then, it would lose its kind.
                if not argv or peak is None:
                    continue
                self.peaks[process.pid] = (kind_of(argv),
                                           max(peak, self.peaks.get(process.pid, ("", 0.0))[1]))

    def stop(self) -> dict[str, list[float]]:
        self._stop.set()
        self._thread.join()
        kinds: dict[str, list[float]] = {}
        for kind, peak in self.peaks.values():
            kinds.setdefault(kind, []).append(peak)
        return kinds


def kind_of(argv: list[str]) -> str:
    """What a process of a launch is, from the module its Python runs (`-m MODULE`)."""
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    return {"jaxwarm.submit.supervise": "supervisor",
            "jaxwarm.job.start.call": "trainer", TRAINER: "trainer",
            "jaxwarm": "launcher"}.get(module, "other")


def high_water_mb(pid: int) -> float | None:
    """The process's peak RSS; None while it has no memory (exiting, or a zombie)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def run(argv: list[str]) -> tuple[float, dict[str, list[float]]]:
    """Run a command to its end; its wall time and the peak RSS of its processes by kind."""
    memory: list[PeakMemory] = []
    try:
        done = run_launch(argv, during=lambda procs: memory.append(PeakMemory(procs[0].pid)),
                          timeout=TIMEOUT_S)
    finally:
        peaks = memory[0].stop() if memory else {}
    return done.wall_s, peaks


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "jaxwarm", *args]


def by_hand(work: Path, ranks: int, runs: str) -> dict[str, Any]:
    """R trainer processes started here with the cache set by environment variables."""
    config = load_config(pinned_config(work / "prewarm" / "demo"))
    env = {k: v for k, v in job_environment(config, "").items()
           if k.startswith("JAX_") or k == "XLA_FLAGS"}
    base = merge_environment(dict(os.environ), env)
    coordinator = f"127.0.0.1:{free_port()}"
    out = work / runs / "first-step"
    argv = [sys.executable, "-m", TRAINER, str(pinned_config(work / "prewarm" / "demo")),
            str(out)]
    places = [{k: v for k, v in process_variables(coordinator, ranks, index, "").items()
               if not k.startswith("JAXWARM_")} if ranks > 1 else {} for index in range(ranks)]
    done = run_launch(argv, [{**base, **place} for place in places], timeout=TIMEOUT_S)
    return {"wall_s": done.wall_s, **first_steps(out, ranks)}


def first_steps(out: Path, ranks: int) -> dict[str, Any]:
    rows = [read_json(out / f"p{process}.json") for process in range(ranks)]
    return {"first_step_s": [row["first_step_s"] for row in rows],
            "trainer_rss_mb": [row["peak_rss_mb"] for row in rows]}


def lock_waits(run_dir: Path, job: str, ranks: int) -> float:
    total = 0.0
    for process in range(ranks):
        report = read_record(InitReport, report_path(run_dir, job, 0, process))
        if report is not None:
            total += sum(report.lock_wait_s.values())
    return total


def with_jaxwarm(work: Path, ranks: int, runs: str, report: bool = True) -> dict[str, Any]:
    """`jaxwarm launch`; with `report`, then `jaxwarm report` of its run, timed 3 times
    (`bench.wakeups` counts the launch's threads only)."""
    wall, peaks = run(cli("launch", str(DEMO), "--local", "--no-prewarm",
                          *overrides(work, ranks, runs)))
    run_dir = work / runs / "demo"
    report_times = [run(cli("report", str(run_dir)))[0] for _ in range(3 if report else 0)]
    return {"wall_s": wall, **first_steps(work / runs / "first-step", ranks),
            "supervisor_rss_mb": peaks.get("supervisor", []),
            "launcher_rss_mb": peaks.get("launcher", []),
            **({"report_s": statistics.median(report_times)} if report_times else {}),
            "train_lock_wait_s": lock_waits(run_dir, TRAIN, ranks)}


def measure(ranks: int, repeats: int, end: float) -> dict[str, Any]:
    """Prewarm at R ranks, then up to `repeats` repetitions: one at least, and another only
    while the last one's time still fits before `end` (a `time.perf_counter()` value)."""
    with tempfile.TemporaryDirectory(prefix="jaxwarm-growth-", dir="/tmp") as tmp:
        work = Path(tmp)
        prewarm_wall, _ = run(cli("prewarm", str(DEMO), "--local",
                                  *overrides(work, ranks, "prewarm")))
        prewarm_locks = lock_waits(work / "prewarm" / "demo", PREWARM, ranks)
        samples: list[dict[str, Any]] = []
        took = 0.0
        while len(samples) < repeats and (not samples or time.perf_counter() + took < end):
            began = time.perf_counter()
            samples.append({"plain": by_hand(work, ranks, f"plain-{len(samples)}"),
                            "jaxwarm": with_jaxwarm(work, ranks, f"jaxwarm-{len(samples)}")})
            took = time.perf_counter() - began
    return {"ranks": ranks, "prewarm_wall_s": prewarm_wall,
            "prewarm_lock_wait_s": prewarm_locks, "samples": samples,
            "row": summarize(ranks, samples, prewarm_locks)}


def summarize(ranks: int, samples: list[dict[str, Any]], prewarm_locks: float
              ) -> dict[str, float]:
    """Medians over repetitions of each figure (per rank: median and slowest rank)."""
    def med(side: str, key: str, pick: Any = statistics.median) -> float:
        values = [sample[side][key] for sample in samples]
        return statistics.median((pick(v) if v else math.nan) if isinstance(v, list) else v
                                 for v in values)

    row = {"ranks": ranks, "repeats": len(samples),
           "plain_first_step_s": med("plain", "first_step_s"),
           "jaxwarm_first_step_s": med("jaxwarm", "first_step_s"),
           "plain_slowest_s": med("plain", "first_step_s", max),
           "jaxwarm_slowest_s": med("jaxwarm", "first_step_s", max),
           "plain_wall_s": med("plain", "wall_s"), "jaxwarm_wall_s": med("jaxwarm", "wall_s"),
           "plain_rss_mb": med("plain", "trainer_rss_mb"),
           "jaxwarm_rss_mb": med("jaxwarm", "trainer_rss_mb"),
           "supervisor_rss_mb": med("jaxwarm", "supervisor_rss_mb"),
           "launcher_rss_mb": med("jaxwarm", "launcher_rss_mb", max),
           "report_s": med("jaxwarm", "report_s"),
           "lock_wait_s": prewarm_locks + med("jaxwarm", "train_lock_wait_s")}
    row["added_first_step_s"] = row["jaxwarm_first_step_s"] - row["plain_first_step_s"]
    row["added_slowest_s"] = row["jaxwarm_slowest_s"] - row["plain_slowest_s"]
    row["added_wall_s"] = row["jaxwarm_wall_s"] - row["plain_wall_s"]
    row["added_rss_mb"] = row["jaxwarm_rss_mb"] - row["plain_rss_mb"]
    for name, key, pick in (("first_step_s", "first_step_s", statistics.median),
                            ("slowest_s", "first_step_s", max),
                            ("wall_s", "wall_s", statistics.median),
                            ("rss_mb", "trainer_rss_mb", statistics.median)):
        added = [added_by(sample, key, pick) for sample in samples]
        row[f"added_{name}_least"], row[f"added_{name}_most"] = min(added), max(added)
    return row


def added_by(sample: dict[str, Any], key: str, pick: Any) -> float:
    """What jaxwarm added to a figure in one repetition (a list: its median or slowest)."""
    def value(side: str) -> float:
        figure = sample[side][key]
        return pick(figure) if isinstance(figure, list) else figure
    return value("jaxwarm") - value("plain")


def spread(row: dict[str, float], name: str, digits: int) -> str:
    """jaxwarm's added median, and the least and most one repetition added."""
    return (f"{row[f'added_{name}']:+.{digits}f} ({row[f'added_{name}_least']:+.{digits}f}"
            f" to {row[f'added_{name}_most']:+.{digits}f})")


def growth_table(rows: list[dict[str, float]]) -> str:
    return table(
        "jaxwarm against the same trainer with JAX's cache set by hand (warm cache; medians "
        "of the repetitions; added: median (least to most of one repetition))",
        ["ranks", "repetitions", "first step s, by hand", "jaxwarm", "added", "slowest rank added",
         "wall s, by hand", "jaxwarm", "added", "trainer RSS MiB, by hand", "jaxwarm",
         "added", "supervisor RSS MiB/rank", "launcher RSS MiB", "report s", "lock waits ms"],
        [[int(r["ranks"]), int(r["repeats"]), f"{r['plain_first_step_s']:.2f}",
          f"{r['jaxwarm_first_step_s']:.2f}",
          spread(r, "first_step_s", 2), spread(r, "slowest_s", 2),
          f"{r['plain_wall_s']:.1f}", f"{r['jaxwarm_wall_s']:.1f}", spread(r, "wall_s", 1),
          f"{r['plain_rss_mb']:.0f}", f"{r['jaxwarm_rss_mb']:.0f}", spread(r, "rss_mb", 0),
          f"{r['supervisor_rss_mb']:.0f}", f"{r['launcher_rss_mb']:.0f}",
          f"{r['report_s']:.2f}", f"{1e3 * r['lock_wait_s']:.1f}"] for r in rows])


def write_chart(rows: list[dict[str, float]], title: str, path: Path) -> bool:
    """Time to first step and wall, both ways, by rank count; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot

    ranks = [int(r["ranks"]) for r in rows]
    figure, (first, wall) = pyplot.subplots(1, 2, figsize=(11, 4.2))
    for key, label in (("plain_first_step_s", "by hand (env vars), median rank"),
                       ("jaxwarm_first_step_s", "jaxwarm, median rank"),
                       ("plain_slowest_s", "by hand, slowest rank"),
                       ("jaxwarm_slowest_s", "jaxwarm, slowest rank")):
        first.plot(ranks, [r[key] for r in rows], marker="o", label=label)
    first.set(xlabel="ranks", ylabel="s", title="time to first step")
    for key, label in (("plain_wall_s", "by hand"), ("jaxwarm_wall_s", "jaxwarm launch")):
        wall.plot(ranks, [r[key] for r in rows], marker="o", label=label)
    wall.plot(ranks, [r["report_s"] for r in rows], marker="o", label="jaxwarm report")
    wall.set(xlabel="ranks", ylabel="s", title="wall time")
    save_figure(figure, [first, wall], ranks, title, path)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.growth",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--budget-s", type=float,
                        help="start no further repetition of a size (each has one at least) "
                             "unless the last one's time still fits in this many seconds "
                             "from the start; each row says how many it has")
    parser.add_argument("--json", type=Path, default=Path("bench/results/growth.json"))
    parser.add_argument("--png", type=Path)
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    started = time.perf_counter()
    measured, loads = [], []
    try:
        for ranks in args.ranks:
            loads.append({"ranks": ranks, "load": os.getloadavg()})
            measured.append(measure(ranks, args.repeats, started + (
                math.inf if args.budget_s is None else args.budget_s)))
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    rows = [m["row"] for m in measured]
    about = machine()
    title = (f"tiny step, R processes x 1 CPU device, {about['cpus']} CPUs, jax {about['jax']}; "
             f"load average {load_start[0]:.1f} at start")
    result = {"machine": {**about, "layout": "R processes x 1 CPU device"},
              "load_average": {"start": load_start, "end": os.getloadavg(), "during": loads},
              "seconds": time.perf_counter() - started, "settings": vars(args) | {
                  "json": str(args.json), "png": str(args.png)},
              "measured": measured, "rows": rows}
    publish(result, growth_table(rows), args.json)
    png = args.png or args.json.with_suffix(".png")
    if write_chart(rows, title, png):
        print(f"chart: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

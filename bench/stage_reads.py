"""`python -m bench.stage_reads [--nodes N] [--starts K] [--json PATH]`: entry bytes read from
the shared cache dir per warm start, with and without node-local staging, on the SLURM dev
cluster (`scripts/slurm-dev-cluster`, started if needed; run it under the heavy lock).

A prewarm job fills a shared cache with the demo step (`cache.xla_caches: none`, so that
staging is allowed on every tested jax). Then K warm starts of the training job read it as
it is, and K more with `cache.stage` set to a dir per node (`$SLURMD_NODENAME` in the path:
the dev cluster's nodes share one disk, a real cluster's have their own). Each start is
`jaxwarm launch --slurm --wait --no-prewarm --no-check-cache` into a fresh run dir (so it
loads the step instead of resuming a checkpoint), N nodes x 1 process.

How reads are counted: an inotify watch on the shared cache dir sees every entry file
(`*-cache`) that any process on this machine (every node of the dev cluster) opens
read-only and closes (IN_CLOSE_NOWRITE). JAX and the stager read an entry whole, so reads x
the entry's size is the bytes read. `--no-check-cache` keeps the launcher's pre-run check,
which reads the first bytes of each recorded entry, out of the count; nothing else of
jaxwarm opens an entry in a warm start.

What the count means: on CPU only process 0 hits (JAX hashes each process's devices into the
key), so an unstaged warm start reads each entry once, whatever the node count. On GPU every
rank hits the same key and reads the entry: N x processes_per_node reads per start. A staged
start reads each entry once per node on a node's first start and not at all once the node's
copy is there, on CPU and GPU alike.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import DEMO, REPO, BenchError, machine, publish, read_report, run_launch, table
from jaxwarm.core.records import TRAIN
from jaxwarm.core.rundir import report_path
from jaxwarm.jaxkey.entryformat import CACHE_SUFFIX
from jaxwarm.store.store import LocalStore

CLUSTER = REPO / "scripts" / "slurm-dev-cluster"
DEVICES = 8  # the demo's data=2 x fsdp=4 mesh
LAUNCH_TIMEOUT_S = 1800.0


class ReadCounter:
    """Counts the entry files of one dir opened read-only and closed, by name, while held."""

    def __init__(self, directory: Path) -> None:
        from inotify_simple import INotify, flags
        self.flags = flags
        self.inotify = INotify()
        self.inotify.add_watch(str(directory), flags.CLOSE_NOWRITE)
        self.reads: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._take(self.inotify.read(timeout=200))

    def _take(self, events: list[Any]) -> None:
        for event in events:
            if event.name.endswith(CACHE_SUFFIX):
                self.reads[event.name[:-len(CACHE_SUFFIX)]] += 1

    def __enter__(self) -> ReadCounter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take(self.inotify.read(timeout=0))
        self.inotify.close()


def cli(*args: str) -> None:
    """`jaxwarm ARGS...`; a failure is a BenchError."""
    run_launch([sys.executable, "-m", "jaxwarm", *args], timeout=LAUNCH_TIMEOUT_S)


def overrides(work: Path, nodes: int) -> list[str]:
    return [f"cache.dir={work / 'cache'}", "cache.xla_caches=none", "train.steps=1",
            f"topology.nodes={nodes}", "topology.processes_per_node=1",
            f"topology.devices_per_process={DEVICES // nodes}", "slurm.time=00:30:00"]


def warm_start(work: Path, nodes: int, name: str, stage: str | None) -> dict[str, Any]:
    """One training job on the warm cache; the shared reads it caused, and its reports."""
    cache = work / "cache"
    extra = [f"cache.stage={stage}"] if stage else []
    started = time.perf_counter()
    with ReadCounter(cache) as counter:
        cli("launch", str(DEMO), "--slurm", "--wait", "--no-prewarm", "--no-check-cache",
            f"run.out_dir={work / name}", *overrides(work, nodes), *extra)
    wall = time.perf_counter() - started
    reports = [read_report(report_path(work / name / "demo", TRAIN, 0, process))
               for process in range(nodes)]
    sizes = {key: LocalStore(cache).entry_size(key) for key in counter.reads}
    stagers = [r.stage for r in reports if r.stage is not None and r.stage.stager]
    return {"reads": sum(counter.reads.values()),
            "bytes": sum(sizes[key] * count for key, count in counter.reads.items()),
            "by_entry": dict(counter.reads), "wall_s": wall,
            "hits_p0": reports[0].hits,
            "first_step_s": [r.time_to_first_step_s for r in reports],
            "jax_dirs": sorted({r.cache_dir for r in reports}),
            "copied": sum(len(s.copied) + len(s.replaced) for s in stagers),
            "reused": sum(len(s.reused) for s in stagers),
            "fallbacks": [r.stage.fallback for r in reports
                          if r.stage is not None and r.stage.fallback]}


def measure(nodes: int, starts: int) -> dict[str, Any]:
    subprocess.run([str(CLUSTER), "start"], check=True, capture_output=True, timeout=900)
    with tempfile.TemporaryDirectory(prefix="jaxwarm-stage-reads-") as tmp:
        work = Path(tmp)
        cli("prewarm", str(DEMO), "--slurm", "--wait", f"run.out_dir={work / 'prewarm'}",
            *overrides(work, nodes))
        entries = {e.path.name: e.size for e in LocalStore(work / "cache").scan(histories={})}
        stage = str(work / "stage" / "$SLURMD_NODENAME")
        shared = [warm_start(work, nodes, f"shared-{i}", None) for i in range(starts)]
        staged = [warm_start(work, nodes, f"staged-{i}", stage) for i in range(starts)]
    return {"nodes": nodes, "processes_per_node": 1, "entries": entries,
            "shared": shared, "staged": staged}


def reads_table(result: dict[str, Any]) -> str:
    nodes, entries = result["nodes"], result["entries"]
    rows = []
    for mode in ("shared", "staged"):
        for number, start in enumerate(result[mode], 1):
            rows.append([mode, number, start["reads"], f"{start['bytes'] / 1024:.0f}",
                         start["hits_p0"], start["copied"], start["reused"],
                         len(start["fallbacks"]), f"{start['wall_s']:.0f}"])
    total = sum(entries.values())
    return table(
        f"Shared-dir entry reads per warm start: {nodes} nodes x 1 process, {len(entries)} "
        f"entries ({total / 1024:.0f} KiB); on GPU an unstaged start reads "
        f"{nodes} x processes_per_node times as many",
        ["start", "#", "shared reads", "shared KiB read", "hits on p0", "copied",
         "reused", "fallbacks", "launch wall s"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stage_reads",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8, choices=(1, 2, 4, 8))
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench/results/stage-reads.json"))
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    try:
        result = measure(args.nodes, args.starts)
    except (BenchError, subprocess.CalledProcessError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    result["machine"] = {**machine(), "layout": f"{args.nodes} SLURM nodes x 1 process x "
                                                f"{DEVICES // args.nodes} CPU devices"}
    result["load_average"] = {"start": load_start, "end": os.getloadavg()}
    publish(result, reads_table(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Many ranks end to end: `python -m bench.scale --ranks 64 --nodes 8 [--slurm]`.

The cheapest step (`bench.common.FAST_CHUNKWISE`: the demo step at its smallest, XLA's older
CPU fusion emitter) on `--nodes` x `ranks / nodes`
processes of one CPU device each (a 64-device mesh, data 8 x fsdp 8), through the real
`jaxwarm launch`, phase after phase on one run and one cache, the way a user meets them:

- `cold`: prewarm (every rank compiles) then train 1 step;
- `warm`: the same command again, 2 steps: the prewarm finds every function WARM and the
  training job resumes from step 1 and loads the step (process 0; on CPU only it can hit);
- `requeue`: 40 steps, and once the training job logged 2 steps past its start, SIGTERM
  to the launcher (locally; on SLURM `scancel --signal=USR2`, SLURM's warning): every rank
  checkpoints and stops, and the job is requeued (SLURM) or the launch ends with 143;
- `resume`: the same command resumes from that checkpoint and finishes (locally; on SLURM
  the requeued job does it by itself, and this phase waits for it);
- `kill-train`: 40 more steps, and `kill -9` of one rank's trainer once it built its step:
  the time until every process of the job has ended, and the one line;
- `kill-prewarm`: a cold prewarm into a second cache, `kill -9` of one rank while it
  compiles; then `relaunch`: the next launch (prewarm and train) works.

Per phase: exit status, wall time, the training job's time to first step on process 0 and
the slowest rank, the longest wait at the ranks' meetings, and the peak memory of one rank
and of all ranks together (every process whose environment names the run dir, sampled every
0.5 s from /proc): RSS, and the proportional set size (PSS), which counts a page that N
processes share (jaxlib's code, ~150 MiB of a rank's RSS) 1/N in each, so that the ranks'
PSS add up to what they take from the machine, where their RSS counts the shared pages once
per rank. Run it under the heavy-command lock; it prints a table and writes JSON, after each
phase (a run stopped early keeps the phases it finished). `--phases` runs some of them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import DEMO, FAST_CHUNKWISE, REPO, machine, run_launch, table, write_json
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import TRAIN, InitReport
from jaxwarm.core.rundir import log_path, metrics_path, report_paths
from jaxwarm.submit.slurm import read_jobs
from testing.procs import run_processes

KILLED_RANK = 5
SAMPLE_S = 0.5
# Every rank compiles at once on a few cores: the ranks' meetings wait that long.
MEET_TIMEOUT_S = 3600


@dataclass
class Phase:
    name: str
    exit_code: int | None = None
    wall_s: float = 0.0
    first_step_p0_s: float | None = None
    first_step_max_s: float | None = None
    rank_wait_max_s: float | None = None
    hits_p0: int | None = None
    peak_rank_rss_mb: float = 0.0
    peak_total_rss_mb: float = 0.0
    # None in results from before PSS was sampled.
    peak_rank_pss_mb: float | None = None
    peak_total_pss_mb: float | None = None
    processes_seen: int = 0
    # kill phases: from the kill until no process of the job is left; the launch's line.
    stopped_after_s: float | None = None
    line: str = ""
    left_running: list[int] = field(default_factory=list)


def memory_mb(pid: int) -> tuple[float, float]:
    """A process's RSS and PSS now (0 for a process gone meanwhile)."""
    sizes = {"Rss": 0.0, "Pss": 0.0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name = line.split(":")[0]
            if name in sizes:
                sizes[name] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return sizes["Rss"], sizes["Pss"]


class Sampler(threading.Thread):
    """Peak RSS and PSS of the biggest rank process and of all of them together."""

    def __init__(self, run_dir: Path, phase: Phase):
        super().__init__(daemon=True)
        self.run_dir, self.phase = run_dir, phase
        self.done = threading.Event()
        self.seen: set[int] = set()

    def run(self) -> None:
        while not self.done.is_set():
            sizes = {pid: memory_mb(pid) for pid in run_processes(self.run_dir)}
            self.seen |= set(sizes)
            rss = [size[0] for size in sizes.values()]
            pss = [size[1] for size in sizes.values()]
            phase = self.phase
            phase.peak_rank_rss_mb = max([phase.peak_rank_rss_mb, *rss])
            phase.peak_total_rss_mb = max(phase.peak_total_rss_mb, sum(rss))
            phase.peak_rank_pss_mb = max([phase.peak_rank_pss_mb or 0.0, *pss])
            phase.peak_total_pss_mb = max(phase.peak_total_pss_mb or 0.0, sum(pss))
            self.done.wait(SAMPLE_S)
        self.phase.processes_seen = len(self.seen)


class Scale:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work = Path(args.work).resolve()
        self.run_dir = self.work / "runs" / "scale"
        per_node = args.ranks // args.nodes
        side = 1 << ((args.ranks.bit_length() - 1) // 2)  # a near-square power-of-2 mesh
        self.overrides = [
            f"topology.nodes={args.nodes}", f"topology.processes_per_node={per_node}",
            "topology.devices_per_process=1", f"mesh.axes={{data: {args.ranks // side}, "
            f"fsdp: {side}}}", f"step.args.global_batch={args.ranks}", *FAST_CHUNKWISE,
            "run.name=scale", f"run.out_dir={self.work / 'runs'}",
            f"ranks.meet_timeout_s={MEET_TIMEOUT_S}", "train.checkpoint_every=0",
            "slurm.time=04:00:00", "slurm.signal_lead_s=60", "slurm.max_requeues=1",
            *args.overrides]
        self.backend = "--slurm" if args.slurm else "--local"

    def launch_argv(self, cache: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "jaxwarm", "launch", str(DEMO), self.backend,
                *(["--wait"] if self.args.slurm else []), *self.overrides,
                f"cache.dir={cache}", *extra]

    def phase(self, name: str, argv: list[str], during=None) -> Phase:
        """Run one launch, sampling memory; `during(process, phase)` acts on it meanwhile."""
        phase = Phase(name)
        sampler = Sampler(self.run_dir, phase)
        sampler.start()
        start = time.monotonic()
        log = self.work / f"{name}.log"
        # No timeout: a phase of many ranks compiles for as long as it takes; a failed
        # launch is a figure (the kill phases fail on purpose).
        done = run_launch(argv, log=log, check=False, timeout=None,
                          during=None if during is None else lambda procs: during(procs[0], phase))
        phase.exit_code, phase.wall_s = done.returncodes[0], done.wall_s
        sampler.done.set()
        sampler.join()
        phase.line = failure_line(log.read_text(errors="replace"))
        self.read_reports(phase, start)
        print(f"{name}: exit {phase.exit_code} in {phase.wall_s:.0f} s; {phase.line}",
              file=sys.stderr, flush=True)
        return phase

    def read_reports(self, phase: Phase, since: float) -> None:
        """The newest training attempt's reports, if this phase wrote them."""
        started = time.time() - (time.monotonic() - since)
        reports = [report for name, path in report_paths(self.run_dir)
                   if name.job == TRAIN and path.stat().st_mtime >= started
                   and (report := read_record(InitReport, path)) is not None]
        if not reports:
            return
        latest = max(r.restart_count for r in reports)
        reports = [r for r in reports if r.restart_count == latest]
        steps = [r.time_to_first_step_s for r in reports if r.time_to_first_step_s]
        first = next((r for r in reports if r.process_index == 0), None)
        phase.first_step_p0_s = None if first is None else first.time_to_first_step_s
        phase.hits_p0 = None if first is None else first.hits
        phase.first_step_max_s = max(steps, default=None)
        phase.rank_wait_max_s = max((r.ranks_wait_s for r in reports), default=None)

    def kill_when(self, job: str, marker: str):
        """A `during` that SIGKILLs rank KILLED_RANK's job process once its log of this
        launch shows `marker`, then times how long until no process of the run is left."""
        command = "jaxwarm.job.prewarm" if job == "prewarm" else "jaxwarm.job.start.call"

        def victims() -> list[int]:
            return [pid for pid, (rank, line) in run_processes(self.run_dir).items()
                    if rank == KILLED_RANK and command in line and "supervise" not in line
                    and "submitit" not in line]

        def during(process: subprocess.Popen[str], phase: Phase) -> None:
            started = time.time()
            while process.poll() is None:
                log = self.job_log(job, KILLED_RANK)
                if log is not None and log.exists() and log.stat().st_mtime >= started and \
                        marker in log.read_text(errors="replace") and victims():
                    break
                time.sleep(0.5)
            found = victims()
            if not found:
                return
            os.kill(found[0], signal.SIGKILL)
            killed = time.monotonic()
            while run_processes(self.run_dir) and time.monotonic() - killed < 1800:
                time.sleep(0.2)
            phase.stopped_after_s = time.monotonic() - killed
            phase.left_running = sorted(run_processes(self.run_dir))
        return during

    def job_log(self, job: str, rank: int) -> Path | None:
        if not self.args.slurm:
            return log_path(self.run_dir, job, rank)
        ids = [j for j in read_jobs(self.run_dir) if j.name == job]
        return ids[-1].log_path(rank) if ids else None

    def requeue_after(self, steps: int):
        """A `during` that stops the training job once it logged `steps` steps past where it
        started: SIGTERM to the local launcher, SLURM's warning signal to a SLURM job."""
        def during(process: subprocess.Popen[str], phase: Phase) -> None:
            metrics = metrics_path(self.run_dir)
            start = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            while process.poll() is None and (
                    not metrics.exists() or len(metrics.read_text().splitlines()) < start + steps):
                time.sleep(0.5)
            if self.args.slurm:
                train = [j for j in read_jobs(self.run_dir) if j.name == TRAIN][-1]
                subprocess.run(["scancel", "--signal=USR2", train.job_id], check=False)
            else:
                process.send_signal(signal.SIGTERM)
        return during

    def run(self) -> Iterator[Phase]:
        """The phases asked for, in order, each as it ends."""
        cache = self.work / "cache"
        wanted = self.args.phases.split(",")
        if "cold" in wanted:
            yield self.phase("cold", self.launch_argv(cache, "train.steps=1"))
        if "warm" in wanted:
            yield self.phase("warm", self.launch_argv(cache, "train.steps=2"))
        if "requeue" in wanted:
            yield self.phase("requeue", self.launch_argv(cache, "train.steps=40"),
                             self.requeue_after(2))
        if "resume" in wanted and not self.args.slurm:
            yield self.phase("resume", self.launch_argv(cache, "train.steps=40"))
        if "kill-train" in wanted:
            yield self.phase("kill-train", self.launch_argv(cache, "train.steps=80"),
                             self.kill_when("train", "chunkwise step:"))
        cold = self.work / "cache-killed"
        if "kill-prewarm" in wanted:
            yield self.phase("kill-prewarm", self.launch_argv(cold, "train.steps=81"),
                             self.kill_when("prewarm", "COLD  train_step"))
        if "relaunch" in wanted:
            yield self.phase("relaunch", self.launch_argv(cold, "train.steps=81"))


def cluster(*layout: str) -> None:
    """`scripts/slurm-dev-cluster start [NODES CPUS]` (no layout: the default one)."""
    subprocess.run([str(REPO / "scripts" / "slurm-dev-cluster"), "start",
                    *(layout or ("4", "2"))], check=True, stdout=subprocess.DEVNULL)


def failure_line(output: str) -> str:
    """The launch's own line about how it ended (a failed job, a signal), if any."""
    lines = [line for line in output.splitlines() if line.startswith("jaxwarm: ") and (
        " failed" in line or "stopped after" in line or " ended " in line)]
    return lines[-1] if lines else ""


def render(phases: list[Phase], args: argparse.Namespace) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def mib(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    def gib(value: float | None) -> str:
        return "-" if value is None else f"{value / 1024:.1f}"

    return table(
        f"{args.ranks} ranks ({args.nodes} nodes x {args.ranks // args.nodes}), "
        f"{'SLURM dev cluster' if args.slurm else 'local runner'}",
        ["phase", "exit", "wall s", "first step p0 s", "slowest rank s", "max wait s",
         "p0 hits", "peak rank RSS MiB", "peak total RSS GiB", "peak rank PSS MiB",
         "peak total PSS GiB", "stopped after kill s"],
        [[p.name, p.exit_code, f"{p.wall_s:.0f}", seconds(p.first_step_p0_s),
          seconds(p.first_step_max_s), seconds(p.rank_wait_max_s),
          "-" if p.hits_p0 is None else p.hits_p0, f"{p.peak_rank_rss_mb:.0f}",
          f"{p.peak_total_rss_mb / 1024:.1f}", mib(p.peak_rank_pss_mb),
          gib(p.peak_total_pss_mb), seconds(p.stopped_after_s)] for p in phases])


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--slurm", action="store_true", help="on the SLURM dev cluster")
    parser.add_argument("--work", default="/tmp/jaxwarm-scale", help="run dirs and caches")
    parser.add_argument("--phases", help="some of them, comma-separated",
                        default="cold,warm,requeue,resume,kill-train,kill-prewarm,relaunch")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("overrides", nargs="*", metavar="KEY.SUB=VALUE",
                        help="more config overrides for every launch")
    args = parser.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()

    def figures(phases: list[Phase]) -> dict[str, Any]:
        return {"machine": machine(), "ranks": args.ranks, "nodes": args.nodes,
                "overrides": args.overrides, "backend": "slurm" if args.slurm else "local",
                "load_before": load, "load_after": os.getloadavg(),
                "phases": [asdict(p) for p in phases]}

    phases: list[Phase] = []
    if args.slurm:  # grown for this run, back to the default layout after it
        cluster(str(args.nodes), str(max(2, args.ranks // args.nodes)))
    try:  # the JSON after each phase: a run stopped early keeps the phases it finished
        for phase in Scale(args).run():
            phases.append(phase)
            if args.json:
                write_json(args.json, figures(phases))
    finally:
        if args.slurm:
            cluster()
    print(render(phases, args))
    print(f"\nload average before: {load[0]:.1f}, after: {os.getloadavg()[0]:.1f}")
    if args.json:
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.warm_start [--layers N] [--records N] [--demo-repeats N] [--json PATH]`: a
warm start at size, and the demo's with and without prefetch.

The reference step (the demo's, `step.args.scan_layers: false`: `--layers` layers unrolled,
so that loading its executable takes as long as users' do) in a trainer with a realistic
init (`trainer`, this module's `entrypoint.function`): it starts like the reference trainer
(`jaxwarm.job.start.jobstart.start_job`), restores its train state with orbax from the previous
launch's checkpoint, starts its data pipeline (a pure-Python pass over `--records` synthetic
records building a token index, then a thread feeding batches), and only then runs its
first step. On one run dir (so each launch resumes from the last one's checkpoint):

1. `jaxwarm prewarm` on cache A (the cold compile), and a seed launch that writes the
   first checkpoint;
2. cold: a launch on an empty cache B (compiles at the first step);
3. warm: a launch on A with `cache.prefetch: false` (JAX loads at the trainer's call);
4. warm with prefetch: a launch on A with `cache.prefetch: auto`.

Then, where there is nothing to hide, the demo (its own step and trainer, `jaxwarm-train`,
on the same layout): a seed launch, then `--demo-repeats` pairs of warm launches without and
with prefetch, each one more step on the last one's checkpoint, alternated so that the
machine's load falls on both alike.

Each launch's time to first step and init phases come from its init report (the ledger
names what "other" was), the prefetch's outcome from the report too. The goals (issue 30):
warm with prefetch <= init + max(0, load - init) + first step, within 5%; warm with
prefetch / warm <= 0.6; the demo's warm start with prefetch within 2% of without (medians).
One JSON under bench/results/, a Markdown table, and a picture of the launches' phases
beside the JSON (`.png`, when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from bench.common import REPO, BenchError, Check, checks_json, checks_table, machine, publish, table

DEFAULT_JSON = REPO / "bench" / "results" / "warm-start.json"
# The smallest size whose load takes 20 s or more on a quiet 2-core machine (issue 30): at
# 96 layers the load took 15.0 s, at 112 27.2 s.
DEFAULT_LAYERS = 112
# The data pipeline's start about as long as that load (issue 30: "an init of about the
# load's length"): 14M records, with the reference start, 25.4 s of init.
DEFAULT_RECORDS = 14_000_000
DEFAULT_DEMO_REPEATS = 3
# The layout every launch runs on: one process, so that its keys are the prewarm's (on CPU
# a second process hashes its own devices and always compiles).
LAYOUT = ["topology.processes_per_node=1", "topology.devices_per_process=8",
          "mesh.axes={data: 2, fsdp: 4}", "cache.xla_caches=none"]


def trainer() -> int:
    """The benchmark's trainer: the reference trainer's start, then an init of its own
    (restore, data pipeline), then one step after the restored one."""
    import jax
    import numpy as np

    from jaxwarm.core.records import TRAIN
    from jaxwarm.core.rundir import checkpoints_dir
    from jaxwarm.job.start.jobstart import start_job
    from jaxwarm.job.start.pinned import config_from_env
    from jaxwarm.workload import checkpoint
    from jaxwarm.workload.data import make_global_batch

    config = config_from_env()
    records = int(os.environ["WARM_START_RECORDS"])
    recorder, mesh, bundle = start_job(config, TRAIN)
    assert bundle.train_step is not None and bundle.init_state is not None
    root = checkpoints_dir(config.run_dir)
    restored = checkpoint.restore(root, bundle.state, config)
    state, start = restored if restored is not None else \
        (bundle.init_state(np.uint32(config.train.seed)), 0)
    token_index(records)
    batches: list[Any] = []
    feeder = threading.Thread(target=lambda: batches.append(
        make_global_batch(config, mesh, start)), daemon=True)
    feeder.start()
    feeder.join()
    state, _ = bundle.train_step(state, batches[0])
    jax.block_until_ready(state)
    recorder.mark_first_step()
    checkpoint.save(root, state, start + 1, config)
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


def cli(*args: str, env: dict[str, str], python: Path = Path(sys.executable),
        cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`jaxwarm ARGS...` run by `python` in `cwd`; a failure is a BenchError."""
    result = subprocess.run([str(python), "-m", "jaxwarm", *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise BenchError(f"jaxwarm {' '.join(args[:2])} exited {result.returncode}:\n"
                         f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result


def train_report(run_dir: Path, env: dict[str, str], python: Path = Path(sys.executable),
                 cwd: Path = REPO) -> dict[str, Any]:
    """Process 0's init report of the run's latest training attempt (`jaxwarm report
    --json`)."""
    reports = json.loads(cli("report", str(run_dir), "--json", env=env, python=python,
                             cwd=cwd).stdout)
    listed = reports["reports"] if isinstance(reports, dict) else reports
    train = [r for r in listed if r["job"] == "train" and r["process_index"] == 0]
    report: dict[str, Any] = max(train, key=lambda r: r["restart_count"])
    return report


def sized(layers: int, steps: int) -> list[str]:
    """The benchmark's run: the reference step at `layers` unrolled layers in `trainer`."""
    return ["run.name=warm", f"step.args.n_layers={layers}", "step.args.scan_layers=false",
            "entrypoint.command=null", "entrypoint.function=bench.warm_start:trainer",
            f"train.steps={steps}", "train.checkpoint_every=0"]


def demo(steps: int) -> list[str]:
    """The demo as it is (its step, its trainer), `steps` steps in all."""
    return ["run.name=demo", f"train.steps={steps}", "train.checkpoint_every=0"]


def launch(work: Path, cache: Path, run: list[str], env: dict[str, str], *extra: str,
           command: str = "launch") -> dict[str, Any]:
    """One launch (or prewarm) of `run` (its overrides: `sized` or `demo`); process 0's
    training init report."""
    overrides = [f"run.out_dir={work / 'runs'}", f"cache.dir={cache}", *LAYOUT, *run]
    started = time.perf_counter()
    cli(command, str(REPO / "configs" / "demo.yaml"), "--local", *overrides, *extra, env=env)
    wall = time.perf_counter() - started
    if command != "launch":
        return {"wall_s": wall}
    name = next(o for o in run if o.startswith("run.name=")).split("=", 1)[1]
    report = train_report(work / "runs" / name, env)
    report["wall_s"] = wall
    return report


def demo_pairs(work: Path, env: dict[str, str], repeats: int) -> dict[str, list[float]]:
    """The demo's warm start without and with prefetch, `repeats` times each, alternated:
    each launch's time to first step."""
    cache = work / "demo-cache"
    launch(work, cache, demo(1), env, command="prewarm")
    launch(work, cache, demo(1), env, "--no-prewarm")  # the seed: the first checkpoint
    times: dict[str, list[float]] = {"warm": [], "warm with prefetch": []}
    steps = 1
    for _ in range(repeats):
        for name, switch in (("warm", "false"), ("warm with prefetch", "auto")):
            steps += 1
            report = launch(work, cache, demo(steps), env, "--no-prewarm",
                            f"cache.prefetch={switch}")
            times[name].append(report["time_to_first_step_s"])
    return times


def summary(report: dict[str, Any], step: str = "jit_train_step") -> dict[str, Any]:
    """What the tables show of one launch: its phases, "other" by owner (the largest) and
    what no sample named, its `step`'s lookup, the prefetch and what sampling cost."""
    phases: dict[str, float] = {}
    owners: dict[str, float] = {}
    for phase in report["phases"]:
        phases[phase["phase"]] = phases.get(phase["phase"], 0.0) + phase["seconds"]
        if phase["phase"] == "other" and phase["function"]:
            owners[phase["function"]] = phase["seconds"]
    found = next(f for f in report["functions"] if f["name"] == step)
    return {"time_to_first_step_s": report["time_to_first_step_s"], "phases": phases,
            "other_by_owner": dict(sorted(owners.items(), key=lambda kv: -kv[1])[:8]),
            "other_unnamed_s": phases.get("other", 0.0) - sum(owners.values()),
            "step_hit": found["hit"], "step_seconds": found["seconds"],
            "prefetch": report.get("prefetch"), "sampling": report.get("sampling")}


PHASES = ("imports", "trace", "lower", "compile", "cache load", "first step", "other")


def warm_table(result: dict[str, Any]) -> str:
    """The launches' phases side by side, the demo's pairs, then the goals (`bench.tables`
    renders it too)."""
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


def draw(result: dict[str, Any], path: Path) -> bool:
    """The sized launches' phases as bars (the report's own picture of init phases, the two
    largest owners of "other" named inside); False, nothing written, without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot

    from jaxwarm.report.plot import DPI
    from jaxwarm.report.plot import draw as draw_phases

    runs = result["runs"]
    load = result["load_average"]
    title = (f"bench.warm_start, {result['layers']} unrolled layers, "
             f"{result['machine']['cpus']} CPUs, jax {result['machine']['jax']}, load "
             f"average {load['start'][0]:.1f} to {load['end'][0]:.1f}")
    figure = draw_phases(pyplot, [(name, row["phases"]) for name, row in runs.items()], None,
                         title, [dict(list(row["other_by_owner"].items())[:2])
                                 for row in runs.values()])
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, format="png")
    pyplot.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.warm_start", description=__doc__)
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS,
                        help="synthetic records the trainer's data pipeline indexes at start")
    parser.add_argument("--demo-repeats", type=int, default=DEFAULT_DEMO_REPEATS,
                        help="pairs of the demo's warm launches, without and with prefetch")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    env = {**os.environ, "WARM_START_RECORDS": str(args.records)}
    with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        work = Path(tmp)
        prewarm = launch(work, work / "a", sized(args.layers, 1), env, command="prewarm")
        launch(work, work / "a", sized(args.layers, 1), env, "cache.prefetch=false")  # seed
        runs = {"cold": launch(work, work / "b", sized(args.layers, 2), env, "--no-prewarm"),
                "warm": launch(work, work / "a", sized(args.layers, 3), env, "--no-prewarm",
                               "cache.prefetch=false"),
                "warm with prefetch": launch(work, work / "a", sized(args.layers, 4), env,
                                             "--no-prewarm")}
        times = demo_pairs(work, env, args.demo_repeats)
    rows = {name: summary(report) for name, report in runs.items()}
    warm, fetched = rows["warm"], rows["warm with prefetch"]
    load = warm["phases"].get("cache load", 0.0)
    first = fetched["phases"].get("first step", 0.0)
    init = warm["time_to_first_step_s"] - load - warm["phases"].get("first step", 0.0)
    bound = init + max(0.0, load - init) + first
    ratio = fetched["time_to_first_step_s"] / warm["time_to_first_step_s"]
    plain, with_prefetch = (statistics.median(t) for t in times.values())
    checks = [
        Check("warm with prefetch vs init + max(0, load - init) + first step",
              "within 5%", f"{fetched['time_to_first_step_s']:.1f} s vs {bound:.1f} s",
              fetched["time_to_first_step_s"] <= bound * 1.05),
        Check("warm with prefetch / warm", "<= 0.6", f"{ratio:.2f}", ratio <= 0.6),
        Check("the demo's warm start, with prefetch vs without (medians)", "within 2%",
              f"{with_prefetch:.2f} s vs {plain:.2f} s ({with_prefetch / plain - 1:+.1%})",
              with_prefetch <= plain * 1.02)]
    result = {"machine": machine(), "load_average": {"start": load_start,
                                                      "end": os.getloadavg()},
              "layers": args.layers, "records": args.records,
              "prewarm_wall_s": prewarm["wall_s"], "runs": rows,
              "init_s": init, "load_s": load, "bound_s": bound, "ratio": ratio,
              "demo": times, "checks": checks_json(checks)}
    publish(result, warm_table(result), args.json)
    if draw(result, args.json.with_suffix(".png")):
        print(f"picture: {args.json.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

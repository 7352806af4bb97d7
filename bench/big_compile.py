"""`python -m bench.big_compile [--layers N] [--json PATH]`: a compile of the size users have.

The reference step at Llama-3-8B's sizes and mesh (`configs/llama3-8b-64gpu.yaml`: d_model
4096, vocab 128256, 32 heads and 8 kv heads, d_ff 14336, sequences of 8192, 8 chunks, mesh
data 1 x fsdp 8 x tensor 8) on 1 process x 64 fake CPU devices, with `--layers` layers
unrolled (`step.args.scan_layers: false`): under `lax.scan` the program holds one layer
whatever the depth, and its CPU compile stays at seconds. Nothing of the model is
materialized: the prewarm compiles from abstract inputs, and the warm process loads the
executables without running them (8B parameters and their Adam moments do not fit here).

1. The prewarm job on an empty cache, exactly as `jaxwarm prewarm` starts it: the cold
   backend compile of jit_train_step (init report), the entry's bytes (manifest), wall time
   and peak RSS.
2. `bench.load` in a fresh process with the training job's environment: JAX's retrieval of
   jit_train_step from the cache (read, decompress, deserialize; init report), and, timed
   alone in the same process, decompressing the entry and deserializing the executable.
3. This disk's read speed with the page cache bypassed: `dd iflag=direct` of a 1 GiB file
   next to the cache.

The physical limit of a warm load is then entry bytes / read speed + decompression +
deserialization: what any cache has to pay for this executable on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    BenchError,
    machine,
    publish,
    read_report,
    run_spec,
    table,
)
from jaxwarm.core.config import load_config
from jaxwarm.core.environment import job_environment, merge_environment
from jaxwarm.core.records import PREWARM
from jaxwarm.core.rundir import report_path
from jaxwarm.store.store import open_store
from jaxwarm.submit.jobs import prewarm_job
from jaxwarm.submit.prepare import pin_config

LLAMA = REPO / "configs" / "llama3-8b-64gpu.yaml"
LAYERS = 128
STEP = "jit_train_step"
DD_MIB = 1024


def overrides(work: Path, layers: int) -> list[str]:
    return ["topology.platform=cpu", "topology.nodes=1", "topology.processes_per_node=1",
            "topology.devices_per_process=64", "xla_flags=[]",
            f"step.args.n_layers={layers}", "step.args.scan_layers=false",
            f"run.out_dir={work}", f"cache.dir={work / 'cache'}",
            "cache.min_compile_time_secs=0"]


def disk_read_mb_s(directory: Path, mib: int) -> float:
    """Sequential read speed of the disk under `directory`, the page cache bypassed."""
    probe = directory / "dd-probe"
    subprocess.run(["dd", "if=/dev/urandom", f"of={probe}", "bs=1M", f"count={mib}",
                    "conv=fsync", "status=none"], check=True, timeout=600)
    try:
        done = subprocess.run(["dd", f"if={probe}", "of=/dev/null", "bs=1M", "iflag=direct"],
                              check=True, capture_output=True, text=True, timeout=600)
    finally:
        probe.unlink()
    match = re.search(r"copied, ([\d.]+) s", done.stderr)
    if match is None:
        raise BenchError(f"cannot read dd's timing from: {done.stderr!r}")
    return mib * 2**20 / float(match.group(1)) / 1e6


def measure(layers: int, disk_mib: int = DD_MIB) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="jaxwarm-big-compile-", dir="/tmp") as tmp:
        work = Path(tmp)
        config, pinned = pin_config(load_config(LLAMA, overrides(work, layers)))
        cold = run_spec(prewarm_job(config, pinned))
        report = read_report(report_path(config.run_dir, PREWARM, 0, 0))
        compiled = {fn.name: fn for fn in report.functions}
        if STEP not in compiled or compiled[STEP].hit:
            raise BenchError(f"the prewarm did not compile {STEP}: {report.functions}")
        entry = next(e for e in open_store(config.cache.dir).manifest().values()
                     if e.function == STEP)
        env = merge_environment(dict(os.environ), job_environment(config, pinned))
        loaded = load(env)
        if not loaded["hit"]:
            raise BenchError("the warm process did not load jit_train_step from the cache")
        read_mb_s = disk_read_mb_s(work, disk_mib)
    read_s = entry.size / (read_mb_s * 1e6) if entry.size else 0.0
    limit = read_s + loaded["decompress_s"] + loaded["deserialize_s"]
    return {"layers": layers, "lower_s": entry.lower_s,
            "cold_compile_s": compiled[STEP].seconds, "prewarm_wall_s": cold.wall_s,
            "prewarm_rss_mb": cold.peak_rss_mb, "entry_bytes": entry.size,
            "warm_load_s": loaded["retrieval_s"], "payload_bytes": loaded["payload_bytes"],
            "disk_read_mb_s": read_mb_s, "read_s": read_s,
            "decompress_s": loaded["decompress_s"], "deserialize_s": loaded["deserialize_s"],
            "limit_s": limit, "warm_over_limit": loaded["retrieval_s"] / limit,
            "load_log": loaded["log"],
            "warm_over_cold": loaded["retrieval_s"] / compiled[STEP].seconds}


def load(env: dict[str, str]) -> dict[str, Any]:
    """`bench.load` in a fresh process; its RESULT line."""
    result = subprocess.run([sys.executable, "-m", "bench.load"], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=3600)
    found = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not found:
        raise BenchError(f"bench.load exited {result.returncode}:\n{result.stderr[-3000:]}")
    return {**json.loads(found[-1][len("RESULT "):]),
            "log": [line for line in result.stderr.splitlines() if line.startswith("jit_")]}


def big_table(row: dict[str, Any]) -> str:
    return table(
        f"A Llama-3-8B train step, {row['layers']} layers unrolled, 1 process x 64 CPU devices "
        f"(data 1 x fsdp 8 x tensor 8)",
        ["cold compile s", "warm load s", "warm / cold", "entry MB", "disk MB/s",
         "read s", "decompress s", "deserialize s", "limit s", "warm / limit"],
        [[f"{row['cold_compile_s']:.1f}", f"{row['warm_load_s']:.2f}",
          f"{100 * row['warm_over_cold']:.1f}%", f"{row['entry_bytes'] / 1e6:.1f}",
          f"{row['disk_read_mb_s']:.0f}", f"{row['read_s']:.3f}", f"{row['decompress_s']:.3f}",
          f"{row['deserialize_s']:.2f}", f"{row['limit_s']:.2f}",
          f"{row['warm_over_limit']:.2f}x"]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.big_compile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--disk-mib", type=int, default=DD_MIB,
                        help="size of the file read to time the disk (default %(default)s)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/big-compile.json"))
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    try:
        row = measure(args.layers, args.disk_mib)
    except (BenchError, subprocess.CalledProcessError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    result = {"machine": {**machine(), "layout": "1 process x 64 CPU devices"},
              "load_average": {"start": load_start, "end": os.getloadavg()}, "row": row}
    publish(result, big_table(row), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

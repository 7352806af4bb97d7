"""What the ranks' protocol costs per function: `python -m bench.agree_cost`.

A 2-process CPU job (jax.distributed over 127.0.0.1, one device each; `bench.gpu_check` runs
the same on 2 processes sharing one GPU, `measure(..., platform="gpu")`) compiles `--functions`
small distinct programs that span both processes, each `lower().compile()`d, in three modes:
`none` (JAX's cache set by hand, no jaxwarm), `meet` (jaxwarm's recorder: each rank
publishes its state before the lookup and the ranks meet after each compile, the CPU
default) and `agree` (`ranks.agree: true`, forced on CPU: before each lookup the ranks also
post and compare key, components and entry size). Each mode runs twice on its own cache,
cold then warm; the figures are the warm run's. Per function, the median over functions and
processes of: the time inside the protocol before the lookup (`jaxwarm.job.ranks`
`before_lookup`: a stat, the state, and in `agree` mode a KV post, a barrier, a KV read and
the decision), inside the meeting after the compile (`after_compile`: mostly waiting for the
other rank), and the whole `compile()` call. On CPU the agreement makes the warm run compile
(rank 1 never has an entry there); the protocol times do not include that compile. The
CPU children compile at LLVM -O0 (`testing.jaxproc.jax_env`), which shortens the compile()
column a little and leaves the protocol's columns as they are.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import table, write_json
from testing.jaxproc import result, run_jax_processes

CHILD = r'''
import json, sys, time
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

address, count, index, mode, cache, functions, platform = sys.argv[1:8]
jax.distributed.initialize(address, int(count), int(index))
spent = {"before_lookup": [], "after_compile": []}
if mode == "none":
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
else:
    from jaxwarm.core.config import parse_config
    from jaxwarm.job.start.hook import enable_cache
    from jaxwarm.job.ranks import RankCoordinator
    for name in spent:
        original = getattr(RankCoordinator, name)
        def timed(self, lookup, original=original, name=name):
            start = time.perf_counter()
            try:
                return original(self, lookup)
            finally:
                spent[name].append(time.perf_counter() - start)
        setattr(RankCoordinator, name, timed)
    enable_cache(parse_config({
        "run": {"name": "agree", "out_dir": cache + "-runs"},
        "cache": {"dir": cache, "min_compile_time_secs": 0},
        "topology": {"processes_per_node": int(count), "platform": platform},
        "mesh": {"axes": {"d": int(count)}},
        "step": {"factory": "m:f"}, "entrypoint": {"command": ["t"]},
        "ranks": {"agree": mode == "agree", "meet_timeout_s": 600}}))
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.ShapeDtypeStruct((8 * int(count),), np.float32, sharding=NamedSharding(mesh, P("d")))
walls = []
for k in range(int(functions)):
    step = jax.jit(lambda v, k=k: jax.numpy.tanh(v * (k + 1.5)) + k)
    start = time.perf_counter()
    step.lower(x).compile()
    walls.append(time.perf_counter() - start)
print("RESULT " + json.dumps({"walls": walls, **spent}))
'''
MODES = ("none", "meet", "agree")


def measure(mode: str, functions: int, work: Path,
            platform: str = "cpu") -> dict[str, float | None]:
    """One mode's warm figures. On `platform="gpu"` (`bench.gpu_check`) the 2 processes share
    the GPU there: nothing runs, so no communicator is built, and the ranks' keys are equal
    (JAX hashes the GPU topology, not each process's devices), so the warm run hits."""
    cache = str(work / mode)
    samples: dict[str, list[float]] = {}
    for _ in ("cold", "warm"):  # the warm run's figures are kept
        samples = {"walls": [], "before_lookup": [], "after_compile": []}
        for proc in run_jax_processes(CHILD, processes=2, devices=1, timeout=900,
                                      args=(mode, cache, str(functions), platform),
                                      platform=platform):
            for name, values in result(proc).items():
                samples[name] += values
    return {name: statistics.median(values) if values else None
            for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agree_cost", description=__doc__)
    parser.add_argument("--functions", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="jaxwarm-agree-") as tmp:
        figures = {mode: measure(mode, args.functions, Path(tmp)) for mode in MODES}

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{1e3 * value:.2f}"

    print(table(f"The ranks' protocol per function, 2 CPU processes, {args.functions} "
                f"functions, warm cache (median ms)",
                ["mode", "before the lookup", "meeting after the compile", "compile() call"],
                [[mode, ms(f["before_lookup"]), ms(f["after_compile"]), ms(f["walls"])]
                 for mode, f in figures.items()]))
    print(f"\nload average (1 min) before: {load:.1f}, after: {os.getloadavg()[0]:.1f}")
    if args.json:
        write_json(args.json, {"functions": args.functions, "load_before": load,
                               "load_after": os.getloadavg()[0], "median_s": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())

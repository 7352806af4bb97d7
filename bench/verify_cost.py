"""What `jaxwarm verify` costs on top of lowering, for the reference chunkwise step.

    python bench/verify_cost.py [--layers 2 8] [--repeats 3] [--json out.json]

Each measurement is a fresh process (1 process x 8 CPU devices, the demo's step with
n_layers overridden): lowering as the run pays it (first `lower()` in the process), then
verify's own work on that lowering (key prediction + cache-entry lookup), median of 20
calls. Figures are medians over --repeats processes. Target: verify <= lowering + 10 ms.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_MS = 10.0


def child(layers: int, cache_dir: str) -> dict[str, float]:
    """Runs inside the fresh process."""
    import jax

    from launcher.config import load_config
    from launcher.environment import jax_options
    from prewarm.step import build_step
    from prewarm.verify import judge

    config = load_config(REPO / "configs" / "demo.yaml", [
        "topology.processes_per_node=1", "topology.devices_per_process=8",
        f"step.args.n_layers={layers}", f"cache.dir={cache_dir}"])
    for name, value in jax_options(config).items():
        jax.config.update(name, value)
    _, bundle = build_step(config)
    start = time.perf_counter()
    lowered = bundle.train_step.lower(bundle.state, bundle.batch)
    lower_s = time.perf_counter() - start
    costs = []
    for _ in range(20):
        start = time.perf_counter()
        judge(lowered, cache_dir, {}, lower_s)
        costs.append(time.perf_counter() - start)
    return {"lower_s": lower_s, "verify_ms": 1e3 * statistics.median(costs)}


def measure(layers: int, repeats: int) -> dict[str, float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    runs = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for _ in range(repeats):
            out = subprocess.run([sys.executable, __file__, "--child", str(layers), cache_dir],
                                 env=env, capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"layers": layers,
            "lower_s": statistics.median(r["lower_s"] for r in runs),
            "verify_ms": statistics.median(r["verify_ms"] for r in runs)}


def table(rows: list[dict[str, float]]) -> str:
    lines = ["layers  lowering_s  verify_extra_ms  target_ms  met",
             *(f"{r['layers']:>6}  {r['lower_s']:>10.3f}  {r['verify_ms']:>15.2f}  "
               f"{TARGET_MS:>9.0f}  {'yes' if r['verify_ms'] <= TARGET_MS else 'NO'}"
               for r in rows)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--child", nargs=2, metavar=("LAYERS", "CACHE_DIR"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1])))
        return 0
    rows = [measure(layers, args.repeats) for layers in args.layers]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.run [--quick] [--sizes N ...] [--repeats N] [--tiny] [--json PATH]
[--png PATH]`

Runs every benchmark from the repository root and prints one table per measurement, each
with its target and PASS/MISS, then writes the figures (medians, every sample, the machine
and its load average) as JSON and, when matplotlib is installed, a PNG chart next to it.
By default 2, 4, 8, 16 and 32 layers and 3 repetitions; `--quick` is 2 and 4 layers and one
repetition. The test suite runs one size of the step at its smallest width, compiled the
cheapest way (`--sizes 1 --repeats 1 --tiny`) so that the benchmark cannot rot.

Repetitions are the outer loop, so a burst of load on the machine spreads over every size
instead of skewing one of them. See bench/step_cost.py and bench/launch_cost.py for what
each figure is.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import launch_cost, step_cost
from bench.chart import describe, write_chart
from bench.common import (
    FAST_CHUNKWISE,
    BenchError,
    checks_json,
    checks_table,
    machine,
    medians,
    write_json,
)

log = logging.getLogger("bench")

SIZES = (2, 4, 8, 16, 32)
QUICK_SIZES = (2, 4)
REPEATS = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--quick", action="store_true",
                        help=f"{' and '.join(map(str, QUICK_SIZES))} layers, 1 repetition")
    parser.add_argument("--sizes", type=int, nargs="+", metavar="LAYERS",
                        help=f"layer counts (default {' '.join(map(str, SIZES))})")
    parser.add_argument("--repeats", type=int, help=f"fresh processes per figure "
                                                    f"(default {REPEATS})")
    parser.add_argument("--tiny", action="store_true",
                        help="the step at its smallest width, compiled the cheapest way "
                             "(bench.common.FAST_CHUNKWISE) at each size: every figure taken in a "
                             "fraction of the time, for a test that the benchmark runs, not a "
                             "figure to compare")
    parser.add_argument("--json", type=Path, default=Path("bench/results/latest.json"),
                        help="where the figures go (default: %(default)s)")
    parser.add_argument("--png", type=Path,
                        help="where the chart goes (default: the JSON path with .png)")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or list(QUICK_SIZES if args.quick else SIZES)
    args.repeats = args.repeats or (1 if args.quick else REPEATS)
    args.png = args.png or args.json.with_suffix(".png")
    return args


def run(sizes: list[int], repeats: int, tiny: bool = False) -> dict[str, Any]:
    """Every measurement; the figures, tables and target checks as one dict."""
    load_start = os.getloadavg()
    started = time.perf_counter()
    samples: dict[int, list[dict[str, float]]] = {layers: [] for layers in sizes}
    loads = []
    for repeat in range(repeats):
        for layers in sizes:
            log.info("bench: repetition %d/%d, %d layers", repeat + 1, repeats, layers)
            loads.append({"repeat": repeat, "layers": layers, "load": os.getloadavg()})
            samples[layers].append(step_cost.measure(layers, FAST_CHUNKWISE if tiny else ()))
    rows = [medians([step_cost.add_ratios(sample) for sample in samples[layers]])
            for layers in sizes]
    slopes = step_cost.growth(rows)
    log.info("bench: launcher overhead")
    launch_samples = launch_cost.measure(repeats)
    launch = launch_cost.summarize(launch_samples)
    checks = step_cost.checks(rows) + launch_cost.checks(launch)
    return {
        "machine": machine(),
        "load_average": {"start": load_start, "end": os.getloadavg(), "during": loads},
        "settings": {"sizes": sizes, "repeats": repeats, "tiny": tiny},
        "seconds": time.perf_counter() - started,
        "step": {"rows": rows, "per_layer": slopes,
                 "samples": {str(layers): samples[layers] for layers in sizes}},
        "launcher": {"row": launch, "samples": launch_samples},
        "targets": checks_json(checks),
        "tables": [step_cost.init_table(rows, slopes), step_cost.verify_table(rows),
                   launch_cost.launch_table(launch), step_cost.prewarm_table(rows),
                   checks_table(checks)],
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)  # progress; the launcher's own INFO lines stay quiet
    args = parse_args(argv)
    try:
        result = run(args.sizes, args.repeats, args.tiny)
    except BenchError as exc:
        log.error("bench: error: %s", exc)
        return 1
    load = result["load_average"]
    print(describe(result))
    print("load average (1, 5, 15 min): at start {}, at end {}\n".format(
        *(" ".join(f"{value:.2f}" for value in load[when]) for when in ("start", "end"))))
    print("\n\n".join(result["tables"]))
    write_json(args.json, result)
    print(f"\nfigures: {args.json}")
    if write_chart(result["step"]["rows"], describe(result), args.png):
        print(f"chart: {args.png}")
    else:
        print("chart: skipped, matplotlib is not installed (pip install -e '.[bench]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())

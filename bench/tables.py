"""`python -m bench.tables`: the tables of bench/README.md, made from bench/results/*.json.

Each table in bench/README.md sits between `<!-- table: NAME -->` and `<!-- end table -->`;
this command renders every one from the JSON its benchmark wrote, with that benchmark's own
table function (the one that prints it when the benchmark runs), and rewrites the README,
so a figure there is never typed by hand: a new result JSON, then this command.
`tests/test_bench_tables.py` holds the committed README to what this command writes.
Reading the results imports no JAX.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    big_compile,
    gpu_check,
    growth,
    init_ledger,
    key_cost,
    launch_cost,
    parallel_compile,
    scale,
    stage_reads,
    startup,
    step_cost,
    wakeups,
)
from bench.common import REPO, Check, checks_table, read_json, table

README = REPO / "bench" / "README.md"
RESULTS = REPO / "bench" / "results"
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end table -->)",
                   re.DOTALL)


@functools.cache
def result(name: str) -> Any:
    return read_json(RESULTS / f"{name}.json")


def scale_table(name: str) -> str:
    run = result(name)
    phases = [scale.Phase(**phase) for phase in run["phases"]]
    return scale.render(phases, argparse.Namespace(ranks=run["ranks"], nodes=run["nodes"],
                                                   slurm=run["backend"] == "slurm"))


def gpu_table(name: str) -> str:
    run = result(name)
    return table(f"bench.gpu_check on one {run['gpu']['kind']}, jax {run['machine']['jax']}",
                 ["check", "result"],
                 [[check, gpu_check.summary(check, section)]
                  for check, section in run["checks"].items()])


def gpu_sizes_table(name: str) -> str:
    return table("cold_vs_warm at other sizes (one run each)",
                 ["step", "compile s", "retrieval s", "entry MB", "first step cold / warm s",
                  "compile with the autotune sub-cache only s"],
                 [[run["what"], f"{run['cold_compile_s']:.1f}",
                   f"{run['warm_retrieval_s']:.2f}", f"{run['entry_bytes'] / 1e6:.1f}",
                   f"{run['cold_first_step_s']:.1f} / {run['warm_first_step_s']:.1f}",
                   f"{run['compile_with_autotune_cache_s']:.1f}"]
                  for run in result(name)["runs"]])


def startup_table(name: str) -> str:
    return startup.startup_table(startup.as_result(result(name)))


def cpu() -> Any:
    return result("cpu-2core")


TABLES: dict[str, Callable[[], str]] = {
    "cpu-init": lambda: step_cost.init_table(cpu()["step"]["rows"], cpu()["step"]["per_layer"]),
    "cpu-verify": lambda: step_cost.verify_table(cpu()["step"]["rows"]),
    "cpu-launcher": lambda: launch_cost.launch_table(cpu()["launcher"]["row"]),
    "cpu-prewarm": lambda: step_cost.prewarm_table(cpu()["step"]["rows"]),
    "cpu-targets": lambda: checks_table([Check(**check) for check in cpu()["targets"]]),
    "key-cost": lambda: key_cost.cost_table(
        [key_cost.Row(**row) for row in result("key-cost")["rows"]], result("key-cost")["repeat"]),
    "growth": lambda: growth.growth_table(result("growth")["rows"]),
    "big-compile": lambda: big_compile.big_table(result("big-compile")["row"]),
    "scale-32-local": lambda: scale_table("scale-32-local"),
    "scale-32-slurm": lambda: scale_table("scale-32-slurm"),
    "scale-64-local": lambda: scale_table("scale-64-local"),
    "scale-64-slurm": lambda: scale_table("scale-64-slurm"),
    "stage-reads-4nodes": lambda: stage_reads.reads_table(result("stage-reads-4nodes")),
    "stage-reads-8nodes": lambda: stage_reads.reads_table(result("stage-reads-8nodes")),
    "gpu-h100": lambda: gpu_table("nvidia-h100-80gb-hbm3"),
    "gpu-h100-sizes": lambda: gpu_sizes_table("nvidia-h100-80gb-hbm3-sizes"),
    "gpu-h200": lambda: gpu_table("nvidia-h200"),
    "gpu-h200-group-fix": lambda: gpu_table("nvidia-h200-group-fix"),
    "warm-start": lambda: startup.warm_table(result("warm-start")),
    "startup-reference": lambda: startup_table("startup-reference"),
    "startup-reference-loaded": lambda: startup_table("startup-reference-loaded"),
    "startup-reference-loaded-true": lambda: startup_table("startup-reference-loaded-true"),
    "startup-reference-quiet-auto": lambda: startup_table("startup-reference-quiet-auto"),
    "startup-maxtext": lambda: startup_table("startup-maxtext"),
    "startup-maxtext-warm": lambda: startup_table("startup-maxtext-warm"),
    "parallel-compile": lambda: parallel_compile.compile_table(parallel_compile.as_result(
        result("parallel-compile"))),
    "init-ledger": lambda: init_ledger.ledger_table(result("init-ledger")),
    "wakeups-32-before": lambda: wakeups.wakeups_table(result("wakeups-32-before")),
    "wakeups-32": lambda: wakeups.wakeups_table(result("wakeups-32")),
}


class UnknownTable(ValueError):
    pass


def render(text: str) -> str:
    """`text` with every table block rendered afresh from the results."""
    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in TABLES:
            raise UnknownTable(f"bench/README.md: no table named {name!r} "
                               f"(known: {', '.join(TABLES)})")
        return f"{match[1]}\n{TABLES[name]()}\n\n{match[4]}"

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    try:
        args.readme.write_text(render(args.readme.read_text()))
    except UnknownTable as exc:
        print(f"bench.tables: error: {exc}", file=sys.stderr)
        return 2
    print(f"tables: {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

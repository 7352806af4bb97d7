"""verify's cost on top of lowering, on every tested jax: `python -m bench.key_cost`.

For the main venv's jax and each leg built by `make legs` (testing/legs.py): the prewarm job
fills an empty cache with the reference step (demo config, 1 process x 8 CPU devices, as in
`bench.step_cost`), then the verify job runs `--repeat` times on it, each a fresh process
as `jaxwarm verify --local` starts it but with that jax's Python. Per function, verify's
own work after lowering (`predict_s`: asking JAX for the key and the probe's restore) is
reported as the median over the runs, with the lowering beside it; the target is
lowering + 10 ms. A leg that is not built is listed as skipped. `--json PATH` writes the rows
(bench/results/key-cost.json, whose table bench/README.md shows: `python -m bench.tables`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import (
    BenchError,
    bench_config,
    machine,
    run_spec,
    table,
    verdict,
    verify_answer,
    write_json,
)
from jaxwarm.core.records import Verdict
from jaxwarm.store.store import open_store
from jaxwarm.submit.jobs import JobSpec, prewarm_job, verify_job
from testing.legs import LEGS, ready

LIMIT_MS = 10.0
OVERRIDES = ("cache.min_compile_time_secs=0",)


@dataclass(frozen=True)
class Row:
    jax: str
    python: str
    function: str
    lower_s: float
    predict_ms: float
    samples: int

    @property
    def met(self) -> bool:
        return self.predict_ms <= LIMIT_MS


def with_python(job: JobSpec, python: str) -> JobSpec:
    """The same job, run by another jax's interpreter."""
    return JobSpec(job.name, [python, *job.argv[1:]], job.env)


def measure(python: str, repeat: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="jaxwarm-keycost-") as tmp:
        work = Path(tmp)
        config, pinned = bench_config(work, "prewarm", OVERRIDES)
        run_spec(with_python(prewarm_job(config, pinned), python))
        samples: dict[str, list[Verdict]] = {}
        for index in range(repeat):
            config, pinned = bench_config(work, f"verify{index}", OVERRIDES)
            spec = with_python(verify_job(config, pinned), python)
            run_spec(spec)
            for item in verify_answer(config, spec).functions:
                if not item.warm:
                    raise BenchError(f"{python}: verify says {item.function} is COLD "
                                     f"right after the prewarm")
                samples.setdefault(item.function, []).append(item)
        entries = open_store(str(work / "cache")).manifest()
        jax_version = next(iter(entries.values())).jax_version
    return [Row(jax_version, python, function,
                statistics.median(s.lower_s for s in items),
                1e3 * statistics.median(s.predict_s for s in items), len(items))
            for function, items in samples.items()]


def cost_table(rows: list[Row], repeat: int) -> str:
    return table(f"verify on top of lowering, per jax (median of {repeat} verify jobs)",
                 ["jax", "function", "lowering s", "verify on top ms", f"<= {LIMIT_MS:g} ms"],
                 [[r.jax, r.function, f"{r.lower_s:.3f}", f"{r.predict_ms:.2f}", verdict(r.met)]
                  for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="verify runs per jax")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    pythons = [("main venv", sys.executable)]
    skipped = []
    for leg in LEGS:
        (pythons.append((f"jax {leg.jax}", str(leg.python))) if ready(leg)
         else skipped.append(f"jax {leg.jax}: not built (`make legs`)"))
    rows = [row for _, python in pythons for row in measure(python, args.repeat)]
    print(cost_table(rows, args.repeat))
    if args.json:
        write_json(args.json, {"machine": machine(), "repeat": args.repeat,
                               "rows": [asdict(row) for row in rows]})
    for line in skipped:
        print(f"skipped: {line}")
    return 0 if all(row.met for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

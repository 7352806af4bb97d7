"""`python -m bench.init_ledger [--only NAME ...] [--json PATH]`: the init ledger on the three
trainers of issue 30, warm, with and without prefetch.

The reference trainer (the demo: `jaxwarm-train`, 1 process x 8 CPU devices, so that its
keys are its prewarm's), the jsp example (`jsp-train`, a console script jaxwarm does not
control, `configs/jsp-example.yaml`) and MaxText (`examples/maxtext/maxtext-cpu.yaml`, in
MaxText's venv `.venvs/maxtext`, which `make legs` builds; left out, and said so, without
it). Each is prewarmed once, then launched warm (`--no-prewarm`) twice into run dirs of
their own: with `cache.prefetch: auto` and with `false`. From process 0's init report: the
time to first step, the phases, "other" by owner (the ledger) and what no sample named,
and what sampling cost.

The goals (issue 30): "other" that the ledger does not name <= 5% of the time to first step
(the phases and the ledger's owners explain >= 95% of it) for each trainer, and sampling
under 1% of it. One JSON under bench/results/ and a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import REPO, Check, checks_json, checks_table, machine, publish, table
from bench.startup import (
    LAYOUT,
    PHASES,
    Trainer,
    cli,
    jsp_example,
    maxtext,
    summary,
    train_report,
)
from testing.legs import MAXTEXT, ready

DEFAULT_JSON = REPO / "bench" / "results" / "init-ledger.json"
SWITCHES = {"warm with prefetch": "auto", "warm": "false"}


def reference(work: Path) -> tuple[Path, Path, list[str]]:
    return Path(sys.executable), REPO, [*LAYOUT, "train.steps=1"]


TRAINERS = {"reference": Trainer(REPO / "configs" / "demo.yaml", "demo", "jit_train_step",
                                 reference),
            "jsp": Trainer(REPO / "configs" / "jsp-example.yaml", "jsp-example", "jit_step",
                           jsp_example),
            "maxtext": Trainer(REPO / "examples" / "maxtext" / "maxtext-cpu.yaml", "maxtext",
                               "jit_train_step", maxtext)}


def measure(trainer: Trainer, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Prewarm, then a warm launch with and one without prefetch: their summaries."""
    work.mkdir(parents=True)
    python, cwd, overrides = trainer.setup(work)
    cache = [f"cache.dir={work / 'cache'}", "cache.xla_caches=none"]
    cli("prewarm", str(trainer.config), "--local", f"run.out_dir={work / 'prewarm'}", *cache,
        *overrides, env=env, python=python, cwd=cwd)
    launches = {}
    for name, switch in SWITCHES.items():
        runs = work / name.replace(" ", "-")
        cli("launch", str(trainer.config), "--local", "--no-prewarm", f"run.out_dir={runs}",
            *cache, f"cache.prefetch={switch}", *overrides, env=env, python=python, cwd=cwd)
        launches[name] = summary(train_report(runs / trainer.run), trainer.step)
    return launches


def ledger_table(result: dict[str, Any]) -> str:
    """Each trainer's launches: phases, the ledger's owners, what it left unnamed, its cost
    (`bench.tables` renders it too); then the goals."""
    rows = []
    for trainer, launches in result["trainers"].items():
        for name, row in launches.items():
            first = row["time_to_first_step_s"]
            rows.append([f"{trainer}, {name}", f"{first:.2f}",
                         *(f"{row['phases'].get(p, 0.0):.2f}" for p in PHASES),
                         ", ".join(f"{k} {v:.2f}"
                                   for k, v in list(row["other_by_owner"].items())[:4]),
                         f"{row['other_unnamed_s']:.2f} ({row['other_unnamed_s'] / first:.1%})",
                         f"{row['sampling']['cost_s']:.3f}"])
    return table("The init ledger on the three trainers, warm (process 0)",
                 ["trainer, start", "time to first step (s)", *PHASES, "other by owner",
                  "unnamed (share)", "sampling CPU (s)"], rows) + "\n\n" + checks_table(
        [Check(**check) for check in result["checks"]])


def goals(trainers: dict[str, dict[str, Any]]) -> list[Check]:
    checks = []
    for trainer, launches in trainers.items():
        unnamed = max(r["other_unnamed_s"] / r["time_to_first_step_s"]
                      for r in launches.values())
        cost = max(r["sampling"]["cost_s"] / r["time_to_first_step_s"]
                   for r in launches.values())
        checks += [Check(f"{trainer}: other the ledger does not name, of the time to first "
                         f"step (the larger of its launches)", "<= 5%", f"{unnamed:.1%}",
                         unnamed <= 0.05),
                   Check(f"{trainer}: sampling's CPU time, of the time to first step", "< 1%",
                         f"{cost:.2%}", cost < 0.01)]
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.init_ledger", description=__doc__)
    parser.add_argument("--only", nargs="+", choices=list(TRAINERS), default=list(TRAINERS))
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    names = list(args.only)
    if "maxtext" in names and not ready(MAXTEXT):
        print(f"bench.init_ledger: {MAXTEXT.venv} is not built (or stale): `make legs` "
              f"builds it; MaxText left out")
        names.remove("maxtext")
    load_start = os.getloadavg()
    env = dict(os.environ)
    trainers = {}
    with tempfile.TemporaryDirectory(prefix="init-ledger-") as tmp:
        for name in names:
            trainers[name] = measure(TRAINERS[name], Path(tmp) / name, env)
    result = {"machine": machine(), "load_average": {"start": load_start,
                                                      "end": os.getloadavg()},
              "trainers": trainers, "checks": checks_json(goals(trainers))}
    publish(result, ledger_table(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

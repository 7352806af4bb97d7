"""Figures of the reference chunkwise step by size: cold vs warm init, verify, prewarm.

One repetition at one size (`step.args.n_layers`) runs five fresh processes on 1 process x
8 CPU devices (the demo's data=2 x fsdp=4 mesh; on CPU only process 0 can hit, so one
process is the whole job). The first four are jobs exactly as `jaxwarm launch --local`
starts them (argv and environment from `jaxwarm.submit.jobs`):

1. the trainer (`jaxwarm-train`, the demo's 8 steps) on an empty cache: the step's backend
   compile and the time to first step, from its init report;
2. the verify job on the cache that run filled: the lowering, and verify's own work on top
   of it (predicting the key; the lookup that follows is one stat()). It must say WARM;
3. the trainer again on that cache, in a new run dir: the step's load from the cache, the
   time to first step, and the training run's wall time and peak RSS;
4. the prewarm job on another empty cache: wall time and peak RSS;
5. `bench.bare`: the same functions lowered and compiled with no cache, prewarm's yardstick.

`cache.min_compile_time_secs=0`, so JAX stores the step at every size.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench.common import (
    BenchError,
    Check,
    Finished,
    bench_config,
    first_step_s,
    per_layer,
    read_report,
    run_process,
    run_spec,
    table,
    verdict,
    verify_answer,
)
from jaxwarm.core.config import Config
from jaxwarm.core.environment import job_environment, merge_environment
from jaxwarm.core.records import TRAIN, FunctionRecord, InitReport
from jaxwarm.core.rundir import report_path, verify_result_path
from jaxwarm.store.store import open_store
from jaxwarm.submit.jobs import JobSpec, prewarm_job, train_job, verify_job

STEP = "jit_train_step"
R = TypeVar("R")
OVERRIDES = ("cache.min_compile_time_secs=0", "train.checkpoint_every=0")


@dataclass(frozen=True)
class Target:
    """One of the issue's targets: the figure `key` of every size must be <= `limit`."""

    measurement: str
    key: str
    limit: float
    text: str     # the target, in the summary
    column: str   # the target, as its column's header
    shown: str    # how a figure is written, a format string

    def met(self, row: dict[str, float]) -> bool:
        return row[self.key] <= self.limit

    def check(self, rows: list[dict[str, float]]) -> Check:
        """The target against its worst size."""
        worst = max(rows, key=lambda row: row[self.key])
        return Check(self.measurement, self.text,
                     f"worst {self.shown.format(worst[self.key])} ({worst['layers']} layers)",
                     self.met(worst))


LOAD = Target("warm retrieval", "load_pct", 5.0, "<= 5% of cold backend compile, every size",
              "<= 5%", "{:.1f}%")
VERIFY = Target("verify", "verify_extra_ms", 10.0, "<= lowering + 10 ms",
                "<= lowering + 10 ms", "lowering + {:.1f} ms")
PREWARM_WALL = Target("prewarm wall", "prewarm_wall_ratio", 1.2,
                      "<= 1.2x bare lower().compile()", "<= 1.2x", "{:.2f}x")
PREWARM_RSS = Target("prewarm peak RSS", "prewarm_rss_ratio", 0.5,
                     "<= 0.5x the training run's", "<= 0.5x", "{:.2f}x")
TARGETS = (LOAD, VERIFY, PREWARM_WALL, PREWARM_RSS)


def expected(matches: list[R], is_warm: Callable[[R], bool], warm: bool, where: Path) -> R:
    """The step's last record among `matches` (a report's lookups or a verify result's
    verdicts of STEP); it must be the expected hit or miss, or the figure would be of
    something else than the benchmark says."""
    if not matches or is_warm(matches[-1]) != warm:
        raise BenchError(f"{where}: expected {STEP} to be {'warm' if warm else 'cold'}, "
                         f"got {matches[-1:] or 'no record'}")
    return matches[-1]


def init_report(config: Config, warm: bool) -> tuple[InitReport, FunctionRecord]:
    """The training job's init report and the step's record in it."""
    path = report_path(config.run_dir, TRAIN, 0, 0)
    report = read_report(path)
    return report, expected([fn for fn in report.functions if fn.name == STEP],
                            lambda fn: fn.hit, warm, path)


def bare_environment(config: Config, pinned: Path) -> dict[str, str]:
    """The job's platform and device flags, and nothing of the persistent cache."""
    job_env = job_environment(config, pinned)
    return merge_environment(dict(os.environ), {name: job_env[name]
                                                for name in ("JAX_PLATFORMS", "XLA_FLAGS")})


def measure(layers: int, step: tuple[str, ...] = ()) -> dict[str, float]:
    """One repetition at one size, in its own temporary dirs (empty caches); `step`: more
    overrides of the step (its width, its compile flags), under `layers` layers."""
    with tempfile.TemporaryDirectory(prefix="jaxwarm-bench-") as tmp:
        work = Path(tmp)

        specs: dict[str, JobSpec] = {}
        size = [*step, f"step.args.n_layers={layers}"]

        def job(name: str, make: Callable[[Config, Path], JobSpec],
                cache: str) -> tuple[Config, Finished]:
            config, pinned = bench_config(work, name, [*size, f"cache.dir={work / cache}",
                                                       *OVERRIDES])
            specs[name] = make(config, pinned)
            return config, run_spec(specs[name])

        cold_config, cold = job("cold", train_job, "cache")
        cold_report, cold_step = init_report(cold_config, warm=False)
        verify_config, _ = job("verify", verify_job, "cache")
        verified = expected([v for v in verify_answer(verify_config, specs["verify"]).functions
                             if v.function == STEP], lambda v: v.warm, True,
                            verify_result_path(verify_config.run_dir))
        warm_config, warm = job("warm", train_job, "cache")
        warm_report, warm_step = init_report(warm_config, warm=True)
        _, prewarm = job("prewarm", prewarm_job, "prewarm-cache")
        bare_config, bare_pinned = bench_config(work, "bare", size)
        bare = run_process([sys.executable, "-m", "bench.bare", str(bare_pinned)],
                           bare_environment(bare_config, bare_pinned))
        return {
            "layers": layers,
            "lower_s": verified.lower_s,
            "verify_extra_ms": 1e3 * verified.predict_s,
            "cold_compile_s": cold_step.seconds,
            "warm_load_s": warm_step.seconds,
            "cold_first_step_s": first_step_s(cold_report),
            "warm_first_step_s": first_step_s(warm_report),
            "entry_kb": (open_store(cold_config.cache.dir).entry_size(str(cold_step.key))
                         or 0) / 1024,
            "cold_init_compile_s": cold_report.backend_compile_s,
            "warm_init_retrieval_s": warm_report.retrieval_s,
            "cold_train_wall_s": cold.wall_s,
            "warm_train_wall_s": warm.wall_s,
            "cold_train_rss_mb": cold.peak_rss_mb,
            "warm_train_rss_mb": warm.peak_rss_mb,
            "prewarm_wall_s": prewarm.wall_s,
            "prewarm_cpu_s": prewarm.cpu_s,
            "prewarm_rss_mb": prewarm.peak_rss_mb,
            "bare_wall_s": bare.wall_s,
            "bare_cpu_s": bare.cpu_s,
            "bare_rss_mb": bare.peak_rss_mb,
        }


def add_ratios(sample: dict[str, float]) -> dict[str, float]:
    """The ratios the targets are about, within one repetition: its two sides ran back to
    back, so their median is steadier under a varying load than a ratio of medians."""
    return {**sample,
            "load_pct": 100 * sample["warm_load_s"] / sample["cold_compile_s"],
            "prewarm_wall_ratio": sample["prewarm_wall_s"] / sample["bare_wall_s"],
            "prewarm_cpu_ratio": sample["prewarm_cpu_s"] / sample["bare_cpu_s"],
            "prewarm_rss_ratio": sample["prewarm_rss_mb"] / sample["warm_train_rss_mb"]}


def growth(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per-layer slope of each figure that depends on the step (needs two sizes or more)."""
    keys = [key for key in rows[0] if key != "layers"]
    return {key: per_layer(rows, key) for key in keys} if len(rows) > 1 else {}


def init_table(rows: list[dict[str, float]], slopes: dict[str, float]) -> str:
    body = [[r["layers"], f"{r['lower_s']:.3f}", f"{r['cold_compile_s']:.2f}",
             f"{r['warm_load_s']:.3f}", f"{r['load_pct']:.1f}%", verdict(LOAD.met(r)),
             f"{r['cold_first_step_s']:.2f}", f"{r['warm_first_step_s']:.2f}",
             f"{r['entry_kb']:.0f}"] for r in rows]
    if slopes:
        seconds = [f"{slopes[key]:+.4f}" for key in ("lower_s", "cold_compile_s", "warm_load_s")]
        body.append(["per layer", *seconds, f"{slopes['load_pct']:+.2f}%", "",
                     f"{slopes['cold_first_step_s']:+.4f}", f"{slopes['warm_first_step_s']:+.4f}",
                     f"{slopes['entry_kb']:+.2f}"])
    return table(f"Cold vs warm init of {STEP}",
                 ["layers", "lowering s", "cold compile s", "warm load s", "load / compile",
                  LOAD.column, "cold first step s", "warm first step s", "entry KiB"], body)


def verify_table(rows: list[dict[str, float]]) -> str:
    return table(f"verify vs lowering ({STEP})",
                 ["layers", "lowering s", "verify on top ms", "verify total s", VERIFY.column],
                 [[r["layers"], f"{r['lower_s']:.3f}", f"{r['verify_extra_ms']:.2f}",
                   f"{r['lower_s'] + r['verify_extra_ms'] / 1e3:.3f}", verdict(VERIFY.met(r))]
                  for r in rows])


def prewarm_table(rows: list[dict[str, float]]) -> str:
    return table("Prewarm job vs bare lower().compile() vs the training run (8 steps, warm)",
                 ["layers", "bare wall s", "prewarm wall s", "prewarm / bare",
                  PREWARM_WALL.column, "CPU time ratio", "train wall s", "bare RSS MiB",
                  "prewarm RSS MiB", "train RSS MiB", "cold train RSS MiB",
                  "prewarm / train RSS", PREWARM_RSS.column],
                 [[r["layers"], f"{r['bare_wall_s']:.2f}", f"{r['prewarm_wall_s']:.2f}",
                   f"{r['prewarm_wall_ratio']:.2f}x", verdict(PREWARM_WALL.met(r)),
                   f"{r['prewarm_cpu_ratio']:.2f}x",
                   f"{r['warm_train_wall_s']:.2f}", f"{r['bare_rss_mb']:.0f}",
                   f"{r['prewarm_rss_mb']:.0f}", f"{r['warm_train_rss_mb']:.0f}",
                   f"{r['cold_train_rss_mb']:.0f}", f"{r['prewarm_rss_ratio']:.2f}x",
                   verdict(PREWARM_RSS.met(r))] for r in rows])


def checks(rows: list[dict[str, float]]) -> list[Check]:
    return [target.check(rows) for target in TARGETS]

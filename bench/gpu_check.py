"""`python -m bench.gpu_check`: every GPU check of issues 21, 32, 40 and 41, into one JSON.

On a machine with a GPU (the project's device image: jax 0.11.2 with the CUDA 13 plugin),
from the repository root:

    python -m bench.gpu_check                        # every check
    python -m bench.gpu_check --only reference,mock  # some (each call writes one JSON)

The JSON goes to `--json PATH`, else `$OUT/gpu_check.json` when `$OUT` is set, else
`bench/results/<gpu>.json`, written again after each check (a run stopped half-way keeps
what finished; `--stop-after-s S` starts no check after S seconds). `bench/gpu_run.sh` is the
device machine's one command (issue 41). Each check runs its jobs as fresh processes, as
`jaxwarm launch --local` starts them (argv and environment from `jaxwarm.submit.jobs`, the
local runner):

- reference: the demo's step on 1 process x 1 GPU. verify on an empty cache (COLD, and the
  key it predicts), the prewarm job, the trainer (2 steps): the step must HIT, and the entry
  the prewarm wrote must be the file verify named; verify again says WARM.
- cold_vs_warm: a step that compiles for 30 s or more there (default: d_model 1024, 128
  unrolled layers, bf16, 4 chunks; `--size step.args.KEY=VALUE` changes it): the trainer on
  an empty cache, again on the filled cache, and on a new cache holding only XLA's autotune
  sub-cache of the first: compile and retrieval seconds, entry size, time to first step,
  and what the autotune sub-cache saves of a compile.
- mock: a 2-process layout (1 node x 2 processes x 1 GPU) prewarmed through JAX's mock GPU
  topology (`prewarm.layout: mock`, one process), then the real 2 processes on the one GPU:
  verify (process 0's verdict for the run) and `bench.compile_only` (each rank's real lookup;
  NCCL refuses two ranks on one GPU, "Duplicate GPU detected", so no step runs): HIT on both
  ranks, or the key components that differ.
- agreement: the ranks' protocol per function on a warm start (`bench.agree_cost`, `meet`
  and `agree` modes), on 2 processes sharing the one GPU, compile only (as in mock).
- load_profile (issue 32): cold_vs_warm's step at 32, 64 and 128 unrolled layers, each
  compiled on an empty cache and loaded from it: compile and load seconds, entry size.
  Where a load's seconds go is for a profiler on the GPU; the JSON's `breakdown` is null.
- warm_requeue: the reference trainer for 50 real steps, checkpointed, then resumed for 50
  more on the same cache: the step HITs, each step is logged once, first step cold vs
  resumed.
- pgle: JAX's automatic PGLE on (`pgle.enabled`, 3 profiled steps): the first run's two
  compiles of the step (the second with the profile, stored under JAX's PGLE-optimized
  key), then a relaunch on the same cache, which must load the PGLE-optimized executable.
- parallel (issue 40): a prewarm's targets (the train step and the init of BIG's step at 32
  unrolled layers) compiled serially, on threads and in processes (`bench.parallel_compile`'s
  ways, fresh processes, no persistent cache), `--repeat` times alternated: compile wall and
  CPU per way, medians, and each way's wall against serial's.
- mock8 (issue 41): the mission's 64-GPU layout (8 nodes x 8 GPUs, mesh data 8 x fsdp 8)
  prewarmed on the one GPU through the mock topology 8x8x1 (compile only), then verify for
  that layout, run as the prewarm runs (one process under the same mock; the 64 real
  processes cannot run here): its predicted key must be the entry written, and WARM.
- shared_group (issue 41): two users of one group (made as root: groupadd, useradd) on one
  cache with `cache.trusted_group`: the first prewarms, the second launches another size
  (writing into XLA's sub-caches the first one's jobs created) and then the first size (a
  HIT on the first one's entries): each dir under the cache with its mode and owner, the
  dirs the group cannot write (`locked_out_dirs`), the files the second user wrote in each.
  Where users cannot be made (not root, no useradd) it says "not possible" and why.

Without a GPU it refuses in one line (exit 2) and writes nothing. `--dry-run` runs the same
checks on CPU with the demo's step at its smallest, compiled the cheapest way
(`bench.common.TINY_STEP`, `LEGACY_CPU_FUSION`: the script's logic depends on neither, and
the test suite runs it; tests/test_gpu_check.py), and the reference trainer's small step in
the checks about what happens around the compile (`SMALL_STEP_RUNS`): the mock check then
prewarms on the real
layout (JAX mocks GPU topologies only), load_profile's one size is 1 layer,
warm_requeue runs 2 + 2 steps, pgle's second compile is `bench.profiled_compile` (JAX's
profiler collects no profile on CPU, so no CPU run compiles twice), parallel compiles the
tiny step, mock8 runs its jobs unmocked on one process of 8 CPU devices (mesh data 2 x
fsdp 4), and shared_group's users run the small step (the second size at sequence length
16: at 1024 its training steps cost a dry run 20 CPU-s); the JSON says
`"dry_run": true`, names no GPU and holds no GPU figure (`"gpu": null`).
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import grp
import json
import os
import platform
import pwd
import re
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import agree_cost, parallel_compile
from bench.common import (
    LEGACY_CPU_FUSION,
    REPO,
    SMALL_STEP,
    TINY_STEP,
    BenchError,
    cpu_model,
    read_report,
    verify_answer,
    with_xla_flag,
    write_json,
)
from bench.step_cost import bare_environment
from jaxwarm.core.config import Config, load_config
from jaxwarm.core.environment import job_environment
from jaxwarm.core.errors import say
from jaxwarm.core.gputarget import gpus_here, mock_environment, mock_topology
from jaxwarm.core.records import PREWARM, TRAIN, FunctionRecord, InitReport, Verdict
from jaxwarm.core.rundir import metrics_path, report_path, verify_result_path
from jaxwarm.jaxkey.components import differing_components
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore
from jaxwarm.submit.jobs import JobSpec, prewarm_job, train_job, verify_job
from jaxwarm.submit.local import run_job
from jaxwarm.submit.prepare import pin_config
from testing.users import reachable, run_as, two_users, why_no_users

DEMO = REPO / "configs" / "demo.yaml"
STEP = "jit_train_step"
CHECKS = ("reference", "cold_vs_warm", "mock", "agreement", "load_profile", "warm_requeue",
          "pgle", "parallel", "mock8", "shared_group")
# The load profile's sizes: BIG's step at these many unrolled layers (a dry run: the tiny
# step at 1, one size: the loop's logic, each size costs two trainers).
LAYERS, DRY_LAYERS = (32, 64, 128), (1,)
# A compile of 30 s or more on one GPU: 128 unrolled layers of d_model 1024 (102 s on an
# H100). The example, d_model 2048 x 16 layers, compiled in 9.2 s scanned and 16.1 s
# unrolled there, 32 unrolled layers in 20.3 s.
BIG = ("step.args.vocab_size=32000", "step.args.d_model=1024", "step.args.n_layers=128",
       "step.args.n_heads=16", "step.args.n_kv_heads=8", "step.args.d_ff=4096",
       "step.args.seq_len=2048", "step.args.global_batch=8", "step.args.chunks=4",
       "step.args.dtype=bfloat16", "step.args.scan_layers=false")
LONG_COMPILE_S = 30.0
# Every check: every compile stored, 2 training steps, no checkpoints, the reference trainer
# by function (a console script needs jaxwarm installed, which the device image is not).
COMMON = ("cache.min_compile_time_secs=0", "train.steps=2", "train.checkpoint_every=0",
          "entrypoint.command=null", "entrypoint.function=jaxwarm.workload.trainer:main")
ONE = ("topology.nodes=1", "topology.processes_per_node=1", "topology.devices_per_process=1",
       "mesh.axes={data: 1, fsdp: 1}")
# Two processes on the one GPU: both use GPU 0 (by the layout, process 1 would use GPU 1),
# and neither may take most of its memory at start.
TWO = ("topology.nodes=1", "topology.processes_per_node=2", "topology.devices_per_process=1",
       "mesh.axes={data: 2, fsdp: 1}",
       'env={XLA_PYTHON_CLIENT_PREALLOCATE: "false", JAX_LOCAL_DEVICE_IDS: "0"}')
# The mission's layout: 8 nodes x 8 processes x 1 GPU, the batch over all 64 GPUs (data 8 x
# fsdp 8; a chunk of 128 / 2 rows splits over 64). A dry run keeps the mesh's logic on one
# process of 8 CPU devices (JAX mocks only GPU topologies).
EIGHT = ("topology.nodes=8", "topology.processes_per_node=8", "topology.devices_per_process=1",
         "mesh.axes={data: 8, fsdp: 8}", "step.args.global_batch=128")
EIGHT_DRY = ("topology.nodes=1", "topology.processes_per_node=1",
             "topology.devices_per_process=8", "mesh.axes={data: 2, fsdp: 4}",
             "step.args.global_batch=128")
# shared_group's second size: another sequence length than BIG's 2048 (a dry run: than the
# tiny step's 8).
OTHER_SEQ_LEN, DRY_OTHER_SEQ_LEN = 1024, 16
# parallel: BIG's step at this many layers, a serial pass of some 20-40 s on an H100/H200
# (32 unrolled layers of d_model 2048 compiled in 20.3 s there; the dry run: the tiny step).
PARALLEL_LAYERS = 32
AUTOTUNE_DIR = "xla_gpu_per_fusion_autotune_cache_dir"
# What the jobs import beyond jax: the wheels to carry to an image that lacks them.
NEEDED = {"yaml": "pyyaml", "filelock": "filelock", "optax": "optax",
          "orbax.checkpoint": "orbax-checkpoint"}
DEVICE_PROBE = ("import json, jax; d = jax.devices(); print(json.dumps({'platform': "
                "d[0].platform, 'kind': d[0].device_kind, 'count': len(d)}))")


# The runs (by their name's first word) of the checks whose dry run is about what happens
# around the compile, where the model is not the point: the reference flow, the requeue,
# the mock topologies' keys, the shared group's modes. They run the reference trainer's
# small step (`bench.common.SMALL_STEP`), a third of a JAX process's CPU; the others keep
# the chunkwise step, whose size (layers, sequence length, PGLE's profile) they vary.
SMALL_STEP_RUNS = frozenset({"reference", "requeue", "mock", "mock8", "shared"})


@dataclass(frozen=True)
class Context:
    """Where a check works and what it runs on: `layers`, load_profile's sizes; `repeat`,
    parallel's repetitions."""

    work: Path
    dry_run: bool
    size: tuple[str, ...]
    layers: tuple[int, ...] = LAYERS
    repeat: int = 2

    @property
    def platform(self) -> str:
        return "cpu" if self.dry_run else "gpu"

    def overrides(self, name: str, overrides: Sequence[str]) -> list[str]:
        """What this check's run `name` changes of the demo config (a dry run's step at its
        smallest, compiled the cheapest way; in a check about what happens around the
        compile, `SMALL_STEP_RUNS`, the reference trainer's small step)."""
        dry_run = (*TINY_STEP, with_xla_flag(LEGACY_CPU_FUSION)) if self.dry_run else ()
        if self.dry_run and name.split("-")[0] in SMALL_STEP_RUNS:
            dry_run = (*dry_run, SMALL_STEP)
        return [f"run.name={name}", f"run.out_dir={self.work / 'runs'}",
                f"topology.platform={self.platform}", *COMMON, *dry_run, *overrides]

    def pin(self, name: str, overrides: Sequence[str]) -> tuple[Config, Path]:
        """The demo config as this check's run `name`, pinned as a launch pins it."""
        return pin_config(load_config(DEMO, self.overrides(name, overrides)))


def run(job: JobSpec, config: Config) -> None:
    """One job as the local runner runs it; a job that did not complete stops the check."""
    result = run_job(job, config, echo=False)
    if not result.ok or result.problem is not None:
        raise BenchError(f"{config.run.name}: {job.name} job failed (exit {result.returncode})"
                         f"{': ' + result.problem if result.problem else ''}; last lines of "
                         f"its log {result.log_tail[-3000:]}")


def step_record(config: Config, process: int = 0) -> tuple[InitReport, FunctionRecord]:
    """A training job's init report of one process, and the step's record in it."""
    path = report_path(config.run_dir, TRAIN, 0, process)
    report = read_report(path)
    found = [fn for fn in report.functions if fn.name == STEP]
    if not found:
        raise BenchError(f"{path}: no lookup of {STEP}")
    return report, found[-1]


def verdict(config: Config, job: JobSpec) -> Verdict:
    """The verify job's verdict of the step: process 0's, the run's."""
    found = [v for v in verify_answer(config, job).functions if v.function == STEP]
    if not found:
        raise BenchError(f"{verify_result_path(config.run_dir)}: no verdict of {STEP}")
    return found[-1]


def prewarmed(cache: Path) -> ManifestEntry:
    """The newest manifest entry of the step."""
    entries = [e for e in LocalStore(cache).manifest().values() if e.function == STEP]
    if not entries:
        raise BenchError(f"{cache}: the prewarm recorded no {STEP}")
    return max(entries, key=lambda entry: entry.created)


def reference(ctx: Context) -> dict[str, Any]:
    cache = ctx.work / "reference-cache"
    layout = [*ONE, f"cache.dir={cache}"]
    before_config, before_pinned = ctx.pin("reference-verify", layout)
    before_job = verify_job(before_config, before_pinned)
    run(before_job, before_config)
    before = verdict(before_config, before_job)
    prewarm_config, prewarm_pinned = ctx.pin("reference-prewarm", layout)
    run(prewarm_job(prewarm_config, prewarm_pinned), prewarm_config)
    written = prewarmed(cache)
    train_config, train_pinned = ctx.pin("reference-train", layout)
    run(train_job(train_config, train_pinned), train_config)
    report, step = step_record(train_config)
    after_config, after_pinned = ctx.pin("reference-verify-again", layout)
    after_job = verify_job(after_config, after_pinned)
    run(after_job, after_config)
    after = verdict(after_config, after_job)
    equal = before.key == written.key and LocalStore(cache).has_entry(before.key)
    return {"verify_before": "WARM" if before.warm else "COLD",
            "predicted_key": before.key, "written_key": written.key,
            "key_equals_file": equal, "prewarm_compile_s": written.compile_s,
            "train_hit": step.hit, "train_key": step.key,
            "retrieval_s": step.seconds if step.hit else None,
            "time_to_first_step_s": report.time_to_first_step_s,
            "verify_after": "WARM" if after.warm else "COLD",
            "passed": equal and step.hit and after.warm and not before.warm}


def cold_vs_warm(ctx: Context) -> dict[str, Any]:
    cache, autotuned = ctx.work / "cold-cache", ctx.work / "autotune-only-cache"
    size = () if ctx.dry_run else (*BIG, *ctx.size)

    def trainer(name: str, cache_dir: Path, hit: bool) -> tuple[InitReport, FunctionRecord]:
        return train_once(ctx, name, [*size, f"cache.dir={cache_dir}"], hit)

    cold_report, cold = trainer("cold", cache, hit=False)
    entry_bytes = LocalStore(cache).entry_size(str(cold.key))
    warm_report, warm = trainer("warm", cache, hit=True)
    # A new cache with XLA's autotune results of the cold run and no JAX entry: the compile
    # runs again, without autotuning what the sub-cache holds.
    autotune_files = 0
    if (cache / AUTOTUNE_DIR).is_dir():
        shutil.copytree(cache / AUTOTUNE_DIR, autotuned / AUTOTUNE_DIR)
        autotune_files = sum(1 for path in (autotuned / AUTOTUNE_DIR).rglob("*")
                             if path.is_file())
    _, retuned = trainer("autotune-only", autotuned, hit=False)
    return {"size": dict(item.removeprefix("step.args.").split("=", 1) for item in size),
            "cold_compile_s": cold.seconds, "warm_retrieval_s": warm.seconds,
            "retrieval_pct_of_compile": 100 * warm.seconds / cold.seconds,
            "entry_bytes": entry_bytes,
            "cold_first_step_s": cold_report.time_to_first_step_s,
            "warm_first_step_s": warm_report.time_to_first_step_s,
            "compile_at_least_30_s": cold.seconds >= LONG_COMPILE_S,
            "autotune_cache_files": autotune_files,
            "compile_with_autotune_cache_s": retuned.seconds,
            "autotune_cache_saves_s": cold.seconds - retuned.seconds}


def train_once(ctx: Context, name: str, overrides: Sequence[str],
               hit: bool) -> tuple[InitReport, FunctionRecord]:
    """The trainer on one GPU as run `name`: its init report and the step's first record,
    which must hit (or miss) as `hit` says."""
    config, pinned = ctx.pin(name, [*ONE, *overrides])
    run(train_job(config, pinned), config)
    report, _ = step_record(config)
    step = next(fn for fn in report.functions if fn.name == STEP)
    if step.hit != hit:
        raise BenchError(f"{name}: expected {STEP} to {'hit' if hit else 'miss'}, it did "
                         f"not (key {step.key})")
    return report, step


def load_profile(ctx: Context) -> dict[str, Any]:
    """Whether the load grows with the step: cold_vs_warm's step at 32, 64 and 128 layers,
    compiled on an empty cache and loaded from it. Where a load's seconds go (host or
    device, XLA's phases) needs a profiler on the GPU (py-spy --native, perf): not here."""
    sizes = []
    for layers in DRY_LAYERS if ctx.dry_run else ctx.layers:
        cache = ctx.work / f"load-{layers}-cache"
        size = [*(() if ctx.dry_run else (*BIG, *ctx.size)), f"step.args.n_layers={layers}",
                f"cache.dir={cache}"]
        _, cold = train_once(ctx, f"load-{layers}-cold", size, hit=False)
        warm_report, warm = train_once(ctx, f"load-{layers}-warm", size, hit=True)
        sizes.append({"layers": layers, "compile_s": cold.seconds,
                      "retrieval_s": warm.seconds,
                      "retrieval_pct_of_compile": 100 * warm.seconds / cold.seconds,
                      "entry_bytes": LocalStore(cache).entry_size(str(cold.key)),
                      "warm_first_step_s": warm_report.time_to_first_step_s})
    return {"sizes": sizes, "breakdown": None}


def warm_requeue(ctx: Context) -> dict[str, Any]:
    """The reference trainer for real steps, checkpointed, then resumed from that
    checkpoint for as many again, as a requeue resumes: the step HITs, first step cold vs
    resumed. (The requeue's signal and SLURM's part are tested by tests/test_resume.py and
    on the SLURM dev cluster.)"""
    steps = 2 if ctx.dry_run else 50
    layout = [f"cache.dir={ctx.work / 'requeue-cache'}", "run.name=requeue"]
    cold_report, _ = train_once(ctx, "requeue", [*layout, f"train.steps={steps}",
                                                 f"train.checkpoint_every={steps}"], hit=False)
    resumed_report, resumed = train_once(ctx, "requeue", [*layout, f"train.steps={2 * steps}",
                                                          f"train.checkpoint_every={steps}"],
                                         hit=True)
    metrics = metrics_path(ctx.work / "runs" / "requeue")
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    # Resumed, not started again: each step logged once, the second run's from steps + 1.
    every_step = logged == list(range(1, 2 * steps + 1))
    return {"steps_before": steps, "steps_after": steps, "resumed_hit": resumed.hit,
            "every_step_logged": every_step, "passed": resumed.hit and every_step,
            "cold_first_step_s": cold_report.time_to_first_step_s,
            "resumed_first_step_s": resumed_report.time_to_first_step_s}


def pgle(ctx: Context) -> dict[str, Any]:
    """JAX's automatic PGLE (`pgle.enabled`): a run compiles the step, profiles it, compiles
    it again with the profile and stores that; a relaunch on the same cache must load the
    profile-guided executable (jaxwarm/jaxkey/pgle.py). A dry run's CPU profiler gives JAX
    no profile, so `bench.profiled_compile` compiles the second one with a profile by hand."""
    cache = ctx.work / "pgle-cache"
    layout = [f"cache.dir={cache}", "pgle.enabled=true", "pgle.profiling_runs=3",
              "train.steps=6"]
    first_report, _ = train_once(ctx, "pgle-first", layout, hit=False)
    compiles = [{"key": fn.key, "hit": fn.hit, "seconds": fn.seconds,
                 "pgle_optimized": fn.pgle_optimized}
                for fn in first_report.functions if fn.name == STEP]
    if ctx.dry_run:
        config, pinned = ctx.pin("pgle-first", [*ONE, *layout])
        done = subprocess.run([sys.executable, "-m", "bench.profiled_compile"], cwd=REPO,
                              env={**os.environ, **job_environment(config, pinned)},
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise BenchError(f"bench.profiled_compile: {done.stderr.strip()[-2000:]}")
    _, restart = train_once(ctx, "pgle-relaunch", layout, hit=True)
    second = [item for item in compiles if item["pgle_optimized"]]
    return {"profile": "by hand (bench.profiled_compile: the CPU's profiler gives none)"
                       if ctx.dry_run else "JAX's profiler",
            "first_run": compiles,
            "second_compile_s": second[0]["seconds"] if second else None,
            "restart_key": restart.key, "restart_hit": restart.hit,
            "restart_loaded_pgle_optimized": restart.pgle_optimized,
            "passed": restart.pgle_optimized and (ctx.dry_run or bool(second))}


def mock(ctx: Context) -> dict[str, Any]:
    cache = ctx.work / "mock-cache"
    # One config for every job, as a launch has: `prewarm.layout: mock` mocks the prewarm
    # only, and gives every job the XLA flag the mock needs (environment.xla_flags).
    layout = [*TWO, f"cache.dir={cache}", *(() if ctx.dry_run else ("prewarm.layout=mock",))]
    prewarm_config, prewarm_pinned = ctx.pin("mock-prewarm", layout)
    run(prewarm_job(prewarm_config, prewarm_pinned), prewarm_config)
    entry = prewarmed(cache)
    verify_config, verify_pinned = ctx.pin("mock-verify", layout)
    verify_spec = verify_job(verify_config, verify_pinned)
    run(verify_spec, verify_config)
    real_config, real_pinned = ctx.pin("mock-real", layout)
    run(JobSpec(TRAIN, [sys.executable, "-m", "bench.compile_only"],
                job_environment(real_config, real_pinned)), real_config)
    predicted = verdict(verify_config, verify_spec)  # process 0 decides for the run
    ranks, differing = [], set()
    for process in range(real_config.topology.num_processes):
        _, step = step_record(real_config, process)
        differs = differing_components(entry.components, step.components)
        differing.update(differs)
        ranks.append({"process": process, "key": step.key, "hit": step.hit,
                      "differing_components": differs})
    return {"mocked": entry.mock_topology is not None, "mock_topology": entry.mock_topology,
            "prewarm_key": entry.key, "prewarm_compile_s": entry.compile_s,
            "prewarm_process_count": entry.process_count,
            "verify": "WARM" if predicted.warm else "COLD", "verify_key": predicted.key,
            "verify_why": predicted.explanation, "ranks": ranks,
            "hit_on_every_rank": all(rank["hit"] for rank in ranks),
            "differing_components": sorted(differing)}


def agreement(ctx: Context) -> dict[str, Any]:
    """What the ranks' protocol (`jaxwarm/job/ranks.py`) costs per function on a warm
    start, `meet` (the CPU default) against `agree` (the GPU default), by `bench.agree_cost`:
    2 processes sharing the one GPU, compiling without running (two ranks of one
    communicator cannot share a GPU; the protocol is a stat and key-value store traffic).
    Issue 21 asks for under 50 ms per function."""
    functions = 2 if ctx.dry_run else 20
    work = ctx.work / "agreement"
    work.mkdir()
    figures = {mode: agree_cost.measure(mode, functions, work, ctx.platform)
               for mode in ("meet", "agree")}
    before, after = figures["agree"]["before_lookup"], figures["agree"]["after_compile"]
    if before is None or after is None:  # no sample: the protocol never ran, nothing to claim
        raise BenchError("agreement: the ranks' protocol recorded no time (did the 2 "
                         "processes run jaxwarm's recorder?)")
    per_function_s = before + after
    return {"platform": f"{ctx.platform}: 2 processes", "functions": functions,
            "median_s": figures, "agree_per_function_ms": 1e3 * per_function_s,
            "under_50_ms": per_function_s < 0.05}


def parallel(ctx: Context) -> dict[str, Any]:
    """Issue 40: would a prewarm gain from compiling its targets side by side on a GPU node?
    The reference step's targets (train step and init), lowered from BIG's step at
    PARALLEL_LAYERS layers on one GPU, compiled serially, on threads and in processes
    (`bench.parallel_compile`'s ways, in fresh processes, the persistent cache off, so each
    compile autotunes as a prewarm's does): the compiles' wall and the processes' CPU, each
    way `ctx.repeat` times, alternated."""
    layers = 1 if ctx.dry_run else PARALLEL_LAYERS
    size = () if ctx.dry_run else (*BIG, *ctx.size, f"step.args.n_layers={layers}")
    config, pinned = ctx.pin("parallel", [*ONE, *size])
    # Two processes share the one GPU: neither may take most of its memory at start.
    env = {**bare_environment(config, pinned), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    work = ctx.work / "parallel"
    work.mkdir()
    targets = ["train_step", "init_state"]
    ways = parallel_compile.WAYS
    samples = [parallel_compile.run_ways(pinned, env, work, way, targets, repeat)
               for repeat in range(ctx.repeat)
               for way in ways[repeat % 3:] + ways[:repeat % 3]]
    medians = {way: {"compile_wall_s": statistics.median(s.compile_wall_s for s in samples
                                                         if s.way == way),
                     "cpu_s": statistics.median(s.cpu_s for s in samples if s.way == way)}
               for way in ways}
    serial = medians["serial"]["compile_wall_s"]
    for figures in medians.values():
        figures["vs_serial"] = figures["compile_wall_s"] / serial
    return {"layers": layers, "targets": targets, "repeat": ctx.repeat,
            "cpus": os.cpu_count(), "samples": [dataclasses.asdict(s) for s in samples],
            "medians": medians,
            "fastest": min(medians, key=lambda way: medians[way]["compile_wall_s"])}


def mock8(ctx: Context) -> dict[str, Any]:
    """The mission's 64-GPU layout (8 nodes x 8 GPUs) prewarmed on the one GPU through JAX's
    mock topology (`prewarm.layout: mock`, compile only), then verify for the same layout:
    the 64 real processes cannot run here, so verify runs as the prewarm does, one process
    under the same mock, and its predicted key must be the entry written (a real 8-node
    run's hit is `mock`'s 1x2x1 story at scale). A dry run: the same jobs on one process
    of 8 CPU devices, unmocked."""
    cache = ctx.work / "mock8-cache"
    layout = [*(EIGHT_DRY if ctx.dry_run else (*EIGHT, "prewarm.layout=mock")),
              f"cache.dir={cache}"]
    prewarm_config, prewarm_pinned = ctx.pin("mock8-prewarm", layout)
    run(prewarm_job(prewarm_config, prewarm_pinned), prewarm_config)
    entry = prewarmed(cache)
    found: dict[str, Any] = {
        "layout": mock_topology(prewarm_config.topology), "mocked": entry.mock_topology is not None,
        "mock_topology": entry.mock_topology, "prewarm_key": entry.key,
        "prewarm_compile_s": entry.compile_s, "prewarm_process_count": entry.process_count}
    config, pinned = ctx.pin("mock8-verify", layout)
    spec = verify_job(config, pinned)
    # Run as the prewarm job runs (one process, the mock's variable): the job's name only
    # gives the local runner its layout and the log's name.
    try:
        run(JobSpec(PREWARM, spec.argv, {**spec.env, **mock_environment(config, PREWARM)}),
            config)
        predicted = verdict(config, spec)
    except BenchError as exc:  # the prewarm's figures stand without it
        return {**found, "verify_error": " ".join(str(exc).split()), "passed": False}
    equal = predicted.key == entry.key and LocalStore(cache).has_entry(predicted.key)
    return {**found, "verify": "WARM" if predicted.warm else "COLD",
            "verify_key": predicted.key, "verify_why": predicted.explanation,
            "key_equals_file": equal, "passed": equal and predicted.warm}


def shared_group(ctx: Context) -> dict[str, Any]:
    """Issue 41 (5): two users of one group sharing one cache (`cache.trusted_group`, the
    group's setgid dir, jobs under umask 007): the first prewarms BIG's step at 2 layers,
    the second launches it at another sequence length (its prewarm autotunes shapes the
    first did not, into XLA's sub-caches the first one's jobs created) and then the first
    size (a HIT on the first user's entries). Every dir under the cache with its mode and
    owner: a dir the group cannot write locks the second user out of it."""
    why = why_no_users()
    python = user_python()
    if why or python is None:
        return {"status": "not possible",
                "why": why or f"no Python another user may run ({sys.executable} is not "
                              f"readable by all, nor /usr/bin/python3.N)"}
    size = () if ctx.dry_run else (*BIG, "step.args.n_layers=2")
    other = DRY_OTHER_SEQ_LEN if ctx.dry_run else OTHER_SEQ_LEN
    with two_users() as (group, first, second, base):
        shutil.copytree(REPO / "jaxwarm", base / "src" / "jaxwarm",
                        ignore=shutil.ignore_patterns("__pycache__"))
        # Compiled once here: the users may not write its __pycache__, and each of their
        # processes would compile every module it imports again.
        compileall.compile_dir(base / "src", quiet=1)
        shutil.copy(DEMO, base / "demo.yaml")
        team = base / "team"  # the group's dir: the first member's, setgid, group-writable
        team.mkdir()
        shutil.chown(team, first, group)
        team.chmod(0o2770)
        cache = team / "cache"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(base / "src"), *(path for path in site_dirs() if reachable(Path(path)))])}
        steps = []
        for user, verb, seq_len in ((first, "prewarm", None), (second, "launch", other),
                                    (second, "launch", None)):
            name, runs = f"shared-{verb}-{seq_len or 'first'}", base / f"home-{user}" / "runs"
            overrides = ctx.overrides(name, [
                *ONE, *size, *((f"step.args.seq_len={seq_len}",) if seq_len else ()),
                f"cache.dir={cache}", f"cache.trusted_group={group}", f"run.out_dir={runs}"])
            done = run_as(user, base, [python, "-m", "jaxwarm", verb, str(base / "demo.yaml"),
                                       "--local", *overrides], env)
            output = done.stdout + done.stderr
            steps.append({"user": "first" if user == first else "second", "command": verb,
                          "seq_len": seq_len or "the first's", "exit": done.returncode,
                          "permission_denied": "Permission denied" in output,
                          **({"train_hit": train_hit(runs / name)} if verb == "launch" and
                             done.returncode == 0 else {}),
                          **({} if done.returncode == 0 else {"output_tail": output[-3000:]})})
            if done.returncode != 0:
                break
        dirs = [dir_mode(path, cache, second) for path in [cache, *sorted(cache.rglob("*"))]
                if path.is_dir()] if cache.is_dir() else []
    locked = [d["dir"] for d in dirs if not d["group_writable"]]
    return {"group_mode_dirs": dirs, "locked_out_dirs": locked,
            "xla_dirs": [d["dir"] for d in dirs if d["dir"].startswith("xla")],
            "commands": steps,
            "passed": len(steps) == 3 and not locked and all(
                s["exit"] == 0 and not s["permission_denied"] and s.get("train_hit", True)
                for s in steps)}


def train_hit(run_dir: Path) -> bool:
    """Whether a launch's training job found its step in the cache."""
    report = read_report(report_path(run_dir, TRAIN, 0, 0))
    return any(fn.hit for fn in report.functions if fn.name == STEP)


def dir_mode(path: Path, cache: Path, second: str) -> dict[str, Any]:
    """A dir under the shared cache: its mode, owner, and the files the second user wrote
    there."""
    info = path.stat()
    files = [p for p in path.iterdir() if p.is_file()]
    return {"dir": str(path.relative_to(cache)), "mode": f"{stat.S_IMODE(info.st_mode):04o}",
            "owner": pwd.getpwuid(info.st_uid).pw_name, "group": grp.getgrgid(info.st_gid).gr_name,
            "group_writable": info.st_mode & 0o070 == 0o070 and bool(info.st_mode & stat.S_ISGID),
            "files": len(files),
            "files_of_the_second_user": sum(1 for p in files
                                            if pwd.getpwuid(p.stat().st_uid).pw_name == second)}


def user_python() -> str | None:
    """An interpreter another user may run: this one (a venv's too, which finds its own
    packages), else the system's of its version (a venv may live under a private home);
    this one's packages go on PYTHONPATH as well (`site_dirs`)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (Path(sys.executable), Path("/usr/bin") / version):
        if candidate.exists() and reachable(candidate):
            return str(candidate)
    return None


def site_dirs() -> list[str]:
    """Where this interpreter's packages are: PYTHONPATH's (the carried wheels), then its
    site-packages; not the repository (the users get a copy of jaxwarm)."""
    import site

    given = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if path and Path(path).resolve() != REPO]
    return [*given, *site.getsitepackages()]


RUNNERS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "reference": reference, "cold_vs_warm": cold_vs_warm, "mock": mock, "agreement": agreement,
    "load_profile": load_profile, "warm_requeue": warm_requeue, "pgle": pgle,
    "parallel": parallel, "mock8": mock8, "shared_group": shared_group}


def probe_device(dry_run: bool) -> dict[str, Any]:
    """What JAX finds here, asked in a child process (this one stays free of JAX, like the
    `jaxwarm` command): the platform the checks run on, its device kind and count."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu" if dry_run else "cuda"}
    done = subprocess.run([sys.executable, "-c", DEVICE_PROBE], env=env, capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise BenchError(lines[-1] if lines else f"exit status {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def missing_packages() -> list[str]:
    import importlib.util

    missing = []
    for module, package in NEEDED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(package)
    return missing


def versions() -> dict[str, str]:
    """jax, jaxlib and the GPU plugin's version, from the installed metadata."""
    found = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in ("jax", "jaxlib") or name.startswith(("jax-cuda", "jax-rocm")):
            found[name] = dist.version
    return dict(sorted(found.items()))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def output_path(given: str | None, device: dict[str, Any], dry_run: bool) -> Path:
    if given:
        return Path(given)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_check.json"
    if dry_run:  # never among the results: a dry run measured no GPU
        return Path(tempfile.gettempdir()) / "jaxwarm-gpu-check-dry-run.json"
    return REPO / "bench" / "results" / f"{slug(device['kind'])}.json"


def summary(name: str, section: dict[str, Any]) -> str:
    if section["status"] != "ran":
        return f"{name}: {section['status']}: {section.get('why') or section.get('error')}"
    if name == "reference":
        return (f"reference: verify {section['verify_before']} -> prewarm -> train "
                f"{'HIT' if section['train_hit'] else 'MISS'}; verify's key is the file "
                f"written: {section['key_equals_file']}; verify after: "
                f"{section['verify_after']}")
    if name == "cold_vs_warm":
        return (f"cold_vs_warm: compile {section['cold_compile_s']:.2f} s, retrieval "
                f"{section['warm_retrieval_s']:.2f} s, entry {section['entry_bytes']} bytes, "
                f"first step {section['cold_first_step_s']:.2f} s cold / "
                f"{section['warm_first_step_s']:.2f} s warm, with the autotune sub-cache only "
                f"{section['compile_with_autotune_cache_s']:.2f} s")
    if name == "load_profile":
        return "load_profile: " + "; ".join(
            f"{size['layers']} layers: compile {size['compile_s']:.2f} s, load "
            f"{size['retrieval_s']:.2f} s, entry {size['entry_bytes']} bytes"
            for size in section["sizes"])
    if name == "warm_requeue":
        return (f"warm_requeue: resumed {'HIT' if section['resumed_hit'] else 'MISS'}, first "
                f"step {section['cold_first_step_s']:.2f} s cold / "
                f"{section['resumed_first_step_s']:.2f} s resumed")
    if name == "pgle":
        second = section["second_compile_s"]
        return (f"pgle: second compile {'none' if second is None else f'{second:.2f} s'}; "
                f"relaunch "
                f"{'HIT' if section['restart_hit'] else 'MISS'} of the "
                f"{'PGLE-optimized' if section['restart_loaded_pgle_optimized'] else 'first'}"
                f" executable (profile: {section['profile']})")
    if name == "agreement":
        return (f"agreement: {section['agree_per_function_ms']:.2f} ms per function "
                f"({section['functions']} functions, {section['platform']}); under 50 ms: "
                f"{section['under_50_ms']}")
    if name == "parallel":
        return "parallel: " + "; ".join(
            f"{way} {figures['compile_wall_s']:.2f} s ({figures['vs_serial']:.2f}x), CPU "
            f"{figures['cpu_s']:.1f} s" for way, figures in section["medians"].items()) + \
            f" ({section['layers']} layers, medians of {section['repeat']})"
    if name == "mock8":
        prewarm = f"mocked {section['mock_topology']}" if section["mocked"] else \
            "on one process (dry run: no mock on CPU)"
        if "verify_error" in section:
            return (f"mock8: prewarm {prewarm} for {section['layout']}, compile "
                    f"{section['prewarm_compile_s']:.2f} s; verify failed: "
                    f"{section['verify_error'][:300]}")
        return (f"mock8: prewarm {prewarm} "
                f"for {section['layout']}, compile {section['prewarm_compile_s']:.2f} s; verify "
                f"{section['verify']}, its key is the file written: {section['key_equals_file']}")
    if name == "shared_group":
        commands = ", ".join(f"{c['user']} {c['command']} exit {c['exit']}"
                             for c in section["commands"])
        return (f"shared_group: {commands}; dirs the group cannot write: "
                f"{', '.join(section['locked_out_dirs']) or 'none'}; XLA's dirs: "
                f"{', '.join(section['xla_dirs']) or 'none'}")
    ranks = ", ".join(f"p{rank['process']} {'HIT' if rank['hit'] else 'MISS'}"
                      for rank in section["ranks"])
    differing = ", ".join(section["differing_components"]) or "none"
    prewarm = f"mocked {section['mock_topology']}" if section["mocked"] else \
        "on the real layout (dry run: no mock on CPU)"
    return f"mock: prewarm {prewarm}; real layout {ranks}; components that differ: {differing}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="run the checks on CPU with the demo's step at its smallest: "
                             "tests the script, measures no GPU")
    parser.add_argument("--only", default=",".join(CHECKS),
                        help=f"comma list of checks (default: all of {', '.join(CHECKS)})")
    parser.add_argument("--size", action="append", default=[], metavar="step.args.KEY=VALUE",
                        help="change the cold_vs_warm step's size (repeatable)")
    parser.add_argument("--layers", default=",".join(map(str, LAYERS)),
                        help="load_profile's sizes, comma list of unrolled layers (default: "
                             "%(default)s)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="parallel's repetitions of each way (default: %(default)s)")
    parser.add_argument("--stop-after-s", type=float,
                        help="start no check once this many seconds have passed (each "
                             "skipped check says so): to end inside a machine's time limit")
    parser.add_argument("--json", help="where the JSON goes (default: $OUT/gpu_check.json, "
                                       "else bench/results/<gpu>.json)")
    args = parser.parse_args(argv)
    chosen = [name for name in args.only.split(",") if name]
    unknown = [name for name in chosen if name not in CHECKS]
    if unknown or not chosen:
        return say(f"--only: expected names among {', '.join(CHECKS)}, got {args.only!r}")
    if not args.dry_run and not gpus_here():
        return say("bench.gpu_check needs a GPU and this machine has none (no "
                   "/dev/nvidia<N>); --dry-run runs its checks on CPU to test the script, "
                   "without measuring any GPU figure")
    try:
        device = probe_device(args.dry_run)
    except BenchError as exc:
        return say(f"bench.gpu_check: JAX found no {'CPU' if args.dry_run else 'GPU'} here "
                   f"({exc}); --dry-run runs its checks on CPU to test the script")
    if not args.dry_run and device["platform"] != "gpu":
        return say(f"bench.gpu_check needs a GPU; JAX found {device['platform']} devices only")
    if missing := missing_packages():
        return say(f"bench.gpu_check: the jobs need {', '.join(missing)}, not installed in "
                   f"{sys.executable}: carry their wheels (pip download {' '.join(missing)})")
    started = time.time()
    sections: dict[str, dict[str, Any]] = {}
    path = output_path(args.json, device, args.dry_run)

    def write() -> None:  # after each check: a run stopped half-way keeps what finished
        write_json(path, {
            "tool": "bench.gpu_check", "dry_run": args.dry_run,
            "gpu": None if args.dry_run else {"kind": device["kind"], "count": device["count"]},
            "measured_on": ("cpu, dry run: the checks' logic, the demo's step at its smallest; "
                            "no GPU figure"
                            if args.dry_run else f"{device['count']} x {device['kind']}"),
            "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(),
                        "python": platform.python_version(), "platform": platform.platform(),
                        **versions()},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "wall_s": time.time() - started,
            "checks": sections,
            # What still has to run on a GPU: every check of a dry run, and any that did not.
            "remaining_on_gpu": [name for name in CHECKS if args.dry_run or name not in sections
                                 or sections[name]["status"] != "ran"],
        })

    with tempfile.TemporaryDirectory(prefix="jaxwarm-gpu-check-") as tmp:
        ctx = Context(Path(tmp), args.dry_run, tuple(args.size),
                      tuple(int(n) for n in args.layers.split(",")), args.repeat)
        for name in chosen:
            begin = time.perf_counter()
            if args.stop_after_s is not None and time.time() - started > args.stop_after_s:
                section: dict[str, Any] = {"status": "skipped",
                                           "why": f"past --stop-after-s {args.stop_after_s:g}"}
            else:
                try:
                    section = {"status": "ran", **RUNNERS[name](ctx)}
                except (BenchError, OSError, ValueError, subprocess.SubprocessError) as exc:
                    section = {"status": "error", "error": " ".join(str(exc).split())}
            section["wall_s"] = time.perf_counter() - begin
            sections[name] = section
            print(summary(name, section), flush=True)
            write()
    write()
    print(f"wrote {path}")
    return 0 if all(section["status"] != "error" for section in sections.values()) else 1

if __name__ == "__main__":
    sys.exit(main())

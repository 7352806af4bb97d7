"""Launcher overhead: job start to the entrypoint's first line, through jaxwarm and without.

The entrypoint is `bench.probe:main` (as `entrypoint.function`), which records when its
first line ran; job start is the moment just before the process, or the runner, starts.
No JAX here: the figure is what jaxwarm puts between a job's start and the user's code.

- direct: `python -m bench.probe` with the job's environment, nothing in between;
- local: the local runner (`jaxwarm.submit.local.LocalJob`, what `jaxwarm launch --local`
  runs), which starts the job's argv, `python -m jaxwarm.job.start.call bench.probe:main`;
- slurm: what a task of a SLURM job runs, short of sbatch and srun (SLURM's own scheduling
  and step launch, not jaxwarm's): the job script's environment lines in bash, then
  submitit's task runner (`python -u -m submitit.core._submit`), which unpickles
  `jaxwarm.job.start.task.TaskCommand` and starts the same argv under it.

The overhead of a path is its delay minus the direct one's (median over repetitions).
Each path starts 1 process, the layout of every other benchmark.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import REPO, BenchError, Check, bench_config, medians, run_process, table, verdict
from jaxwarm.core.config import Config
from jaxwarm.core.environment import merge_environment
from jaxwarm.job.start.task import TaskCommand
from jaxwarm.submit.jobs import JobSpec, train_job
from jaxwarm.submit.local import LocalJob
from jaxwarm.submit.sbatch import setup_lines

OVERHEAD_MAX_S = 0.3
# What SLURM gives task 0 of a one-task job; submitit reads its job id and rank from them.
SLURM_TASK = {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "1",
              "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
WRAPPERS = {"local": "local runner -> python -m jaxwarm.job.start.call",
            "slurm": "job script env -> submitit task runner -> jaxwarm.job.start.task -> "
                     "jaxwarm.job.start.call"}


# Each path starts the job its own way and returns the job's start (time.time(), comparable
# with the probe's stamp on this machine); all have one signature so `delays` can loop.


def direct(config: Config, job: JobSpec, stamp: Path) -> float:
    env = merge_environment(dict(os.environ), job.env)
    start = time.time()
    run_process([sys.executable, "-m", "bench.probe", str(stamp)], env)
    return start


def local(config: Config, job: JobSpec, stamp: Path) -> float:
    start = time.time()
    result = LocalJob(job, config.topology, config.run_dir, echo=False).run()
    if not result.ok:
        raise BenchError(f"the local runner failed: {result.log_tail}")
    return start


def slurm(config: Config, job: JobSpec, stamp: Path) -> float:
    from submitit.core.utils import DelayedSubmission

    folder = stamp.parent / "submitit"
    folder.mkdir()
    DelayedSubmission(TaskCommand(job.argv, config.slurm.signal)).dump(
        folder / f"{SLURM_TASK['SLURM_JOB_ID']}_submitted.pkl")
    script = "\n".join([*setup_lines(job.env), "export SUBMITIT_EXECUTOR=slurm",
                        shlex.join([sys.executable, "-u", "-m", "submitit.core._submit",
                                    str(folder)])])
    start = time.time()
    run_process(["bash", "-c", script], {**os.environ, **SLURM_TASK})
    return start


PATHS: dict[str, Callable[[Config, JobSpec, Path], float]] = {
    "direct": direct, "local": local, "slurm": slurm}


def delays() -> dict[str, float]:
    """One repetition: seconds from job start to the probe's first line, per path."""
    result = {}
    for name, start_path in PATHS.items():
        with tempfile.TemporaryDirectory(prefix="jaxwarm-bench-") as tmp:
            stamp = Path(tmp) / "first-line"
            config, pinned = bench_config(Path(tmp), "launch", [
                "entrypoint.command=null", "entrypoint.function=bench.probe:main",
                f"entrypoint.args={json.dumps([str(stamp)])}",
                f"env.PYTHONPATH={json.dumps(str(REPO))}"])
            start = start_path(config, train_job(config, pinned), stamp)
            result[f"{name}_s"] = float(stamp.read_text()) - start
    return result


def measure(repeats: int) -> list[dict[str, float]]:
    """`repeats` repetitions after one that is thrown away: the first start of each path
    reads its modules from disk, which no job after the first on a node pays."""
    delays()
    return [delays() for _ in range(repeats)]


def summarize(samples: list[dict[str, float]]) -> dict[str, float]:
    """Medians; each overhead is the median of the repetitions' own differences, since the
    paths of one repetition ran back to back under the same load."""
    paired = []
    for sample in samples:
        paired.append({**sample, **{f"{name}_overhead_s": sample[f"{name}_s"] - sample["direct_s"]
                                    for name in WRAPPERS}})
    return medians(paired)


def launch_table(row: dict[str, float]) -> str:
    body = [["direct", "python -m bench.probe", f"{row['direct_s']:.3f}", "", ""]]
    body += [[name, path, f"{row[f'{name}_s']:.3f}", f"{row[f'{name}_overhead_s']:+.3f}",
              verdict(row[f"{name}_overhead_s"] < OVERHEAD_MAX_S)]
             for name, path in WRAPPERS.items()]
    return table("Launcher overhead: job start to the entrypoint's first line",
                 ["path", "what runs", "first line s", "overhead s",
                  f"< {OVERHEAD_MAX_S:g} s"], body)


def checks(row: dict[str, float]) -> list[Check]:
    worst = max(WRAPPERS, key=lambda name: row[f"{name}_overhead_s"])
    overhead = row[f"{worst}_overhead_s"]
    return [Check("wrapper overhead", f"< {OVERHEAD_MAX_S:g} s",
                  f"worst {overhead:.3f} s ({worst})", overhead < OVERHEAD_MAX_S)]

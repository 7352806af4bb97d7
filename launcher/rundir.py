"""The run directory's layout: the one module that knows where a run's files go.

`<out_dir>/<run name>/` holds config.yaml (the pinned config every job reads),
logs/<job>-p<process>.log (local runner), reports/<job>-r<restart>-p<process>.json (init
reports), verify/p<process>.json (verify verdicts), slurm/<job>/ (submitit's job folders) with
slurm/jobs.json (what was submitted), checkpoints/ and metrics.jsonl (the trainer's), and
launch.lock (held by the launch that owns the run dir).
Pure paths: both the submit side and the code inside a job import it.
"""

from __future__ import annotations

from pathlib import Path

PREWARM, VERIFY, TRAIN = "prewarm", "verify", "train"
JOBS = (VERIFY, PREWARM, TRAIN)
PINNED_CONFIG = "config.yaml"


def pinned_config(run_dir: str | Path) -> Path:
    return Path(run_dir) / PINNED_CONFIG


def lock_path(run_dir: str | Path) -> Path:
    """Held by a launch for its whole life: one launch per run dir at a time."""
    return Path(run_dir) / "launch.lock"


def log_path(run_dir: str | Path, job: str, process: int) -> Path:
    return Path(run_dir) / "logs" / f"{job}-p{process}.log"


def reports_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "reports"


def report_path(run_dir: str | Path, job: str, restart: int, process: int) -> Path:
    return reports_dir(run_dir) / f"{job}-r{restart}-p{process}.json"


def verify_result_path(run_dir: str | Path, process: int) -> Path:
    return Path(run_dir) / "verify" / f"p{process}.json"


def slurm_dir(run_dir: str | Path, job: str) -> Path:
    """submitit's folder for one job (or `prewarm-array`): its job scripts and task logs."""
    return Path(run_dir) / "slurm" / job


def submitted_jobs_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "slurm" / "jobs.json"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def metrics_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "metrics.jsonl"

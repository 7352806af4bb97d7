"""Helpers for tests that run against the real local SLURM cluster.

The cluster (4 nodes n1..n4, partition ``debug``, accounting through slurmdbd) is set up by
``scripts/slurm-dev-cluster start``; see that script for details.  This module holds no tests.

Public API:
    ensure_cluster() -> None          start the cluster once per session (skip if impossible)
    wait_job(job_id, timeout) -> str  poll until the job reaches a terminal state; return it
    job_field(job_id, name) -> str | None   one field of ``scontrol show job -o``
    job_fields(job_id) -> dict[str, str]    all fields of ``scontrol show job -o``
    sbatch(*args, cwd=None) -> str    submit with ``sbatch --parsable``; return the job id
    sacct_state(job_id) -> str | None current state as accounting (sacct) reports it
    wait_for(predicate, timeout, what, job=None)   poll; a job that ended first fails at once
    wait_for_step_lookup(run_dir, restart, job)    until that training attempt looked its step up
    TERMINAL_STATES, REPO_ROOT, CLUSTER_SCRIPT
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from jaxwarm.core.rundir import report_path
from jaxwarm.submit.slurm import SubmittedJob

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO_ROOT / "scripts" / "slurm-dev-cluster"

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)

# How long accounting may lag behind slurmctld once scontrol already reports a terminal state.
_SACCT_GRACE_S = 10.0

_lock = threading.Lock()
_started = False
_start_error: str | None = None


def _slurm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("SLURM_CONF", "/etc/slurm/slurm.conf")
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
    return env


def _run(args: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env=_slurm_env(), check=False
    )


def ensure_cluster() -> None:
    """Start the local SLURM cluster once per test session (idempotent, cheap when already up).

    Skips the calling test only when the cluster cannot possibly be set up here (not root, or
    SLURM missing and no apt-get).  Any other problem fails the test with the script's output.
    """
    global _started, _start_error
    with _lock:
        if _started:
            return
        if _start_error is not None:
            pytest.fail(_start_error, pytrace=False)
        if os.geteuid() != 0:
            pytest.skip("the local SLURM test cluster needs root (daemons run as SlurmUser=root)")
        have_slurm = all(
            shutil.which(c, path=_slurm_env()["PATH"]) for c in ("slurmctld", "slurmd", "sbatch")
        )
        if not have_slurm and shutil.which("apt-get") is None:
            pytest.skip("SLURM is not installed and apt-get is not available to install it")
        try:
            proc = subprocess.run(
                [str(CLUSTER_SCRIPT), "start"],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            _start_error = f"{CLUSTER_SCRIPT} start timed out after {exc.timeout}s:\n{exc.stderr}"
            pytest.fail(_start_error, pytrace=False)
        if proc.returncode != 0:
            _start_error = (
                f"{CLUSTER_SCRIPT} start failed (exit {proc.returncode}):\n"
                f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
            )
            pytest.fail(_start_error, pytrace=False)
        # The script prints "export NAME=VALUE" lines; apply them to this process.
        for line in proc.stdout.splitlines():
            m = re.fullmatch(r"\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
            if m:
                os.environ[m.group(1)] = m.group(2).strip().strip("'\"")
        _started = True


def sbatch(*args: str, cwd: str | os.PathLike[str] | None = None) -> str:
    """Submit a batch job (``sbatch --parsable ARGS``) and return its job id."""
    proc = subprocess.run(
        ["sbatch", "--parsable", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_slurm_env(),
        cwd=cwd,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def _normalize_state(raw: str) -> str:
    # "CANCELLED by 0" -> "CANCELLED"; "COMPLETED+" -> "COMPLETED"
    return raw.strip().split()[0].rstrip("+") if raw.strip() else ""


def sacct_state(job_id: str | int) -> str | None:
    """The job's state as recorded by accounting, or None when sacct does not know it (yet)."""
    proc = _run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "JobID,State"])
    if proc.returncode != 0:
        return None
    state = None
    for line in proc.stdout.splitlines():
        jid, _, raw = line.partition("|")
        if jid.strip() == str(job_id):
            state = _normalize_state(raw)  # the last record is the newest
    return state or None


def job_fields(job_id: str | int) -> dict[str, str]:
    """All fields of ``scontrol show job -o JOB`` as a dict ({} when the job is unknown)."""
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if proc.returncode != 0 or not proc.stdout.strip():
        return {}
    line = proc.stdout.strip().splitlines()[0]
    # Keys start after whitespace; values may contain spaces and '=' (e.g. TRES=cpu=2,node=1).
    starts = list(re.finditer(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=", line))
    fields: dict[str, str] = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
        fields.setdefault(m.group(1), line[m.end() : end].strip())
    return fields


def job_field(job_id: str | int, name: str) -> str | None:
    """One field (e.g. "JobState", "Restarts", "NodeList") of ``scontrol show job -o``."""
    return job_fields(job_id).get(name)


def _live_state(job_id: str | int) -> str | None:
    state = job_field(job_id, "JobState")
    if state:
        return _normalize_state(state)
    proc = _run(["squeue", "-h", "-j", str(job_id), "-o", "%T"])
    if proc.returncode == 0 and proc.stdout.strip():
        return _normalize_state(proc.stdout.splitlines()[0])
    return None


def wait_job(job_id: str | int, timeout: float = 60.0, poll: float = 0.5) -> str:
    """Poll until the job reaches a terminal state and return it (e.g. "COMPLETED").

    Accounting (``sacct``) is the primary source; ``scontrol``/``squeue`` are the fallback.  When
    slurmctld already reports a terminal state, sacct gets a short grace period to catch up so that
    callers can check sacct right after.  Raises TimeoutError with the job's details on timeout.
    Accounting is asked only once slurmctld no longer holds the job as unfinished: each sacct
    call queries slurmdbd and its database, where scontrol asks slurmctld alone.
    """
    deadline = time.monotonic() + timeout
    live_terminal_since: float | None = None
    state = None
    while True:
        live = _live_state(job_id)
        if live is None or live in TERMINAL_STATES:
            state = sacct_state(job_id)
            if state in TERMINAL_STATES:
                return state
        now = time.monotonic()
        if live in TERMINAL_STATES:
            if live_terminal_since is None:
                live_terminal_since = now
            if now - live_terminal_since >= _SACCT_GRACE_S or now >= deadline:
                return live
        elif now >= deadline:
            details = _run(["scontrol", "show", "job", str(job_id)]).stdout.strip()
            raise TimeoutError(
                f"job {job_id} not finished after {timeout:.0f}s "
                f"(sacct: {state}, slurmctld: {live})\n{details}"
            )
        time.sleep(poll)


def wait_for(predicate, timeout: float, what: str, job: SubmittedJob | None = None) -> None:
    """Poll until predicate(). With the job it waits on, a job that ended first fails the
    test at once, and either failure says what SLURM and the job's log said: a CI run that
    times out must name its cause (a pending job, a down node, a failed task)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        ended = job is not None and job_field(job.job_id, "JobState") in TERMINAL_STATES
        if ended or time.monotonic() > deadline:
            why = "the job ended" if ended else f"timed out after {timeout:.0f} s"
            raise AssertionError(f"{why} waiting for {what}" + ("" if job is None
                                                                 else job_diagnosis(job)))
        time.sleep(1)


def job_diagnosis(job: SubmittedJob) -> str:
    """What SLURM says of the job and its nodes, and the tail of each task's log."""
    def run(*args: str) -> str:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        return (done.stdout + done.stderr).strip()
    logs = [f"--- {path.name} (tail) ---\n" + "\n".join(path.read_text(errors="replace")
                                                       .splitlines()[-40:])
            for path in sorted(Path(job.log_dir).glob(f"{job.job_id}_*_log.*"))]
    return "\n".join(["", "--- scontrol show job ---", run("scontrol", "show", "job", job.job_id),
                      "--- sinfo -N ---", run("sinfo", "-N", "-o", "%N %T %E"),
                      "--- squeue ---", run("squeue"), *logs])


def wait_for_step_lookup(run_dir: Path, restart: int, job: SubmittedJob,
                         timeout: float = 600) -> None:
    """Until process 0 of that attempt of the training job has looked up the train step.
    Its report is first written when a first execution is only guessed (the largest inputs
    so far: the init state's), before the step's own lookup is in it."""
    path = report_path(run_dir, "train", restart, 0)

    def looked_up() -> bool:
        return path.exists() and any(fn["name"] == "jit_train_step"
                                     for fn in json.loads(path.read_text())["functions"])

    wait_for(looked_up, timeout, f"attempt {restart}'s lookup of the train step", job)

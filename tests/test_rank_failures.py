"""One rank among many fails: every rank stops, one line names it, nothing is left running,
and the next launch works. Real launches of the demo step (tiny) on 3 ranks of one CPU
device (the killed rank leaves the coordinator and another rank to stop): `kill -9` of one
rank in the middle of the prewarm job and of the training job, ranks that do not meet in
time, one rank whose environment differs from the others' (planted by a shell wrapper),
which the ranks find at their first meeting (jaxwarm/job/ranks.py), and one stopped before
it joins jax.distributed (jaxwarm/job/start/distributed.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxwarm.core.rundir import log_path, submitted_jobs_path
from testing.procs import run_processes, wait_until
from tests.conftest import DEMO, REPO, ranks_layout, run_cli

pytestmark = pytest.mark.e2e

LAYOUT = ranks_layout(3, 3, 1)
# How long a stopped job's processes get after SIGTERM before SIGKILL: the bound on how long
# the other ranks outlive the killed one, on top of the launcher's 0.1 s poll.
GRACE_S = 5


def job_args(tmp_path: Path, *extra: str) -> list[str]:
    """CONFIG, --local and the overrides every launch here has: layout, run dir, cache."""
    return [str(DEMO), "--local", *LAYOUT, f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", f"stop_grace_s={GRACE_S}", *extra]


def launch(tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "jaxwarm", "launch", *job_args(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_rank_when(launcher: subprocess.Popen[str], run_dir: Path, job: str, rank: int,
                   marker: str) -> tuple[str, float]:
    """SIGKILL the job process of `rank` once its log shows `marker` (it is then lowering
    or compiling); the launch's stderr, and how long the launch took to end after it."""
    log = log_path(run_dir, job, rank)
    try:
        assert wait_until(lambda: log.exists() and marker in log.read_text(errors="replace"),
                          timeout=600), \
            f"{log} never showed {marker!r}"
        command = "jaxwarm.job.prewarm" if job == "prewarm" else "jaxwarm.job.start.call"
        [pid] = [pid for pid, (r, line) in run_processes(run_dir).items()
                 if r == rank and command in line and "supervise" not in line]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        _, err = launcher.communicate(timeout=600)
        return err, time.monotonic() - killed
    finally:
        launcher.kill()


def test_a_killed_rank_or_ranks_late_to_meet_stop_every_rank_with_one_line(
        tmp_path: Path) -> None:
    """One run dir and cache through four launches, each checked as it ends: a rank killed
    in the prewarm job, then in the training job (after a prewarm that completes, which
    the launches after it need), ranks that do not meet in time, and a relaunch that works."""
    run_dir = tmp_path / "runs" / "demo"
    err, _ = kill_rank_when(launch(tmp_path), run_dir, "prewarm", 2, "COLD  train_step")
    assert "jaxwarm: prewarm failed: process 2 was killed by SIGKILL (exit 137)" in err, \
        err[-3000:]
    assert "Traceback" not in err.split("prewarm failed")[1]
    assert run_processes(run_dir) == {}

    err, _ = kill_rank_when(launch(tmp_path), run_dir, "train", 1, "small step:")
    assert "jaxwarm: train failed: process 1 was killed by SIGKILL (exit 137)" in err, \
        err[-3000:]
    assert run_processes(run_dir) == {}

    # The others build the step 5 s after process 0 (which then loads it from the cache):
    # with a meeting bound of 1 ms it waits in vain. (Without the delay, ranks compiling a
    # tiny step on a quiet machine came close enough together to meet even so.)
    late = run_cli("launch", *job_args(
        tmp_path, "--no-prewarm", "ranks.meet_timeout_s=0.001",
        "step.factory=tests.late_factory:make_train_step_a_little_late"), timeout=900)
    assert late.returncode == 1, late.stderr[-3000:]
    [line] = [line for line in late.stderr.splitlines()
              if line.startswith("jaxwarm: train failed")]
    assert "the ranks did not meet after jit_" in line, line
    assert "within 0.001 s (ranks.meet_timeout_s): rank" in line, line
    assert " still " in line and " s ago)" in line, line
    assert run_processes(run_dir) == {}

    relaunch = run_cli("launch", *job_args(tmp_path), timeout=900)
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    assert "jit_train_step: HIT on process 0" in relaunch.stdout


def test_one_rank_with_another_environment_stops_the_job_with_one_line(tmp_path: Path) -> None:
    plant = ('if [ "$JAXWARM_PROCESS_ID" = 2 ]; then export XLA_FLAGS="$XLA_FLAGS '
             '--xla_cpu_enable_fast_math=true"; fi; '
             f'exec {sys.executable} -m jaxwarm.workload.trainer')
    result = run_cli("launch", *job_args(tmp_path, "--no-prewarm",
                                         f"entrypoint.command=[sh, -c, {json.dumps(plant)}]"),
                     timeout=900)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines()
              if line.startswith("jaxwarm: train failed")]
    assert line.startswith("jaxwarm: train failed: process "), line
    # The others' value is cut at 80 characters; rank 2's from a little before it differs.
    assert ("the ranks' environments differ: XLA_FLAGS is '...tform_device_count=1 "
            "--xla_cpu_enable_fast_math=true' on rank 2, but '--xla_backend_optimization_level=0 "
            "--xla_cpu_use_fusion_emitters=false --xla_...' on ranks 0-1") in line, line
    assert run_processes(tmp_path / "runs" / "demo") == {}


def test_a_rank_stopped_before_its_join_is_named_in_one_line(tmp_path: Path) -> None:
    """Rank 2 stops itself (SIGSTOP) before it starts Python: the others wait at the
    jax.distributed join only ranks.join_timeout_s, not JAX's 300 s, and end with one
    line naming rank 2, without JAX's C++ abort; nothing is left running."""
    plant = ('if [ "$JAXWARM_PROCESS_ID" = 2 ]; then kill -STOP $$; fi; '
             f'exec {sys.executable} -m jaxwarm.workload.trainer')
    result = run_cli("launch", *job_args(tmp_path, "--no-prewarm", "ranks.join_timeout_s=5",
                                         f"entrypoint.command=[sh, -c, {json.dumps(plant)}]"),
                     timeout=900)
    assert result.returncode == 1, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines()
              if line.startswith("jaxwarm: train failed")]
    assert line.endswith("exited with 1: jax.distributed: the ranks did not join within 5 s "
                         "(ranks.join_timeout_s): rank 2 never reached it (not started, "
                         "stopped, or still starting)"), line
    assert "Check failure stack trace" not in result.stderr
    assert run_processes(tmp_path / "runs" / "demo") == {}


@pytest.mark.slurm
def test_on_slurm_a_killed_rank_ends_the_job_and_the_launch_names_its_task(
        tmp_path: Path) -> None:
    """`srun --kill-on-bad-exit=1`: the killed task fails, SLURM ends the others."""
    from jaxwarm.submit.slurm import read_jobs
    from tests.slurm_cluster import ensure_cluster

    ensure_cluster()
    run_dir = tmp_path / "runs" / "demo"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "jaxwarm", "launch", str(DEMO), "--slurm", "--wait",
         "--no-prewarm", *ranks_layout(2, 2, 2), "topology.nodes=2",
         f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: any(job.name == "train" for job in read_jobs(run_dir))
                          if submitted_jobs_path(run_dir).exists() else False, timeout=600)
        [train] = [job for job in read_jobs(run_dir) if job.name == "train"]
        log = train.log_path(3)
        assert wait_until(lambda: log.exists() and "small step:" in log.read_text(),
                          timeout=600)
        [pid] = [pid for pid, (rank, line) in run_processes(run_dir).items()
                 if rank == 3 and "jaxwarm.job.start.call" in line and "submitit" not in line]
        os.kill(pid, signal.SIGKILL)
        _, err = launcher.communicate(timeout=600)
    finally:
        launcher.kill()
    assert launcher.returncode == 1, err[-3000:]
    assert f"train job {train.job_id} ended FAILED: task 3: " in err, err[-3000:]
    assert "was killed by SIGKILL" in err
    assert wait_until(lambda: run_processes(run_dir) == {}, timeout=300)

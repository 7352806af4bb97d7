"""Self-tests of the SLURM dev cluster (../slurm-dev-cluster), beside the script they test.

They check the behaviours the launcher relies on: multi-node srun, afterok dependencies that
cancel the dependent job, requeue restarting the batch script, accounting, and an idempotent
`start`. Every wait is bounded by the helper that waits (a hang fails, a slow machine does not).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import (
    CLUSTER_SCRIPT,
    ensure_cluster,
    job_field,
    sacct_state,
    sbatch,
    wait_job,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    ensure_cluster()


def _wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def _scancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], check=False, capture_output=True, timeout=30)


def test_two_node_srun(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job = sbatch(
        "-N",
        "2",
        "--ntasks-per-node=1",
        "-t",
        "5",
        "-o",
        str(out),
        "--wrap",
        'srun bash -c "echo \\$SLURM_PROCID \\$SLURMD_NODENAME"',
        cwd=tmp_path,
    )
    assert wait_job(job, timeout=60) == "COMPLETED", out.read_text() if out.exists() else ""
    lines = [ln.split() for ln in out.read_text().splitlines() if ln.strip()]
    assert sorted(p for p, _ in lines) == ["0", "1"], lines
    nodes = {n for _, n in lines}
    assert len(nodes) == 2, lines
    assert nodes <= {"n1", "n2", "n3", "n4"}, lines


def test_failed_afterok_dependency_cancels_dependent(tmp_path: Path) -> None:
    marker = tmp_path / "dependent-ran.txt"
    # Hold the first job so the dependent one is queued before the dependency fails.
    first = sbatch("-H", "-t", "5", "-o", str(tmp_path / "first.txt"), "--wrap", "exit 3")
    second = sbatch(
        f"--dependency=afterok:{first}",
        "-t",
        "5",
        "-o",
        str(marker),
        "--wrap",
        "echo should-not-run",
    )
    try:
        assert job_field(second, "JobState") == "PENDING"
        subprocess.run(["scontrol", "release", first], check=True, capture_output=True, timeout=30)
        assert wait_job(first, timeout=30) == "FAILED"
        assert wait_job(second, timeout=30) == "CANCELLED"
        assert not marker.exists()
    finally:
        _scancel(first)
        _scancel(second)


def test_requeue_reruns_batch_script(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        'echo "start restart=${SLURM_RESTART_COUNT:-0} node=$SLURMD_NODENAME"\n'
        "sleep 300\n"
    )
    job = sbatch("--requeue", "--open-mode=append", "-t", "10", "-o", str(out), str(script))
    try:
        _wait_for(
            lambda: out.exists() and "restart=0" in out.read_text(),
            timeout=60,
            what="the first run of the batch script",
        )
        assert job_field(job, "JobState") == "RUNNING"
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=30)
        _wait_for(
            lambda: "restart=1" in out.read_text(),
            timeout=60,
            what="the requeued batch script to start again",
        )
        starts = [ln for ln in out.read_text().splitlines() if ln.startswith("start ")]
        assert len(starts) == 2, starts
        assert job_field(job, "Restarts") == "1"
        assert job_field(job, "JobState") == "RUNNING"
    finally:
        _scancel(job)
    assert wait_job(job, timeout=30) == "CANCELLED"


def test_sacct_reports_states(tmp_path: Path) -> None:
    ok = sbatch("-t", "5", "-o", str(tmp_path / "ok.txt"), "--wrap", "true")
    bad = sbatch("-t", "5", "-o", str(tmp_path / "bad.txt"), "--wrap", "exit 2")
    held = sbatch("-H", "-t", "5", "-o", str(tmp_path / "held.txt"), "--wrap", "true")
    _scancel(held)
    assert wait_job(ok, timeout=60) == "COMPLETED"
    assert wait_job(bad, timeout=60) == "FAILED"
    assert wait_job(held, timeout=60) == "CANCELLED"
    assert sacct_state(ok) == "COMPLETED"
    assert sacct_state(bad) == "FAILED"
    assert sacct_state(held) == "CANCELLED"
    proc = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", f"{ok},{bad}", "-o", "JobID,State,ExitCode"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    rows = {r.split("|")[0]: r.split("|")[1:] for r in proc.stdout.split()}
    assert rows[ok] == ["COMPLETED", "0:0"], rows
    assert rows[bad] == ["FAILED", "2:0"], rows


def test_start_is_idempotent_and_status_ok() -> None:
    proc = subprocess.run(
        [str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "export SLURM_CONF=" in proc.stdout

    status = subprocess.run(
        [str(CLUSTER_SCRIPT), "status"], capture_output=True, text=True, timeout=60, check=False
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert "debug" in status.stdout
    assert "not running" not in status.stdout, status.stdout
    for daemon in ("mariadb", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n4"):
        assert f"{daemon} " in status.stdout, status.stdout

    env = subprocess.run(
        [str(CLUSTER_SCRIPT), "env"], capture_output=True, text=True, timeout=30, check=True
    )
    assert env.stdout.strip() == "export SLURM_CONF=/etc/slurm/slurm.conf"
    # jax.distributed's SLURM auto-detection needs the node names to resolve.
    for node in ("n1", "n2", "n3", "n4"):
        assert socket.gethostbyname(node) == "127.0.0.1"


def test_a_plain_start_keeps_the_running_layout_and_a_bad_one_is_refused() -> None:
    """Tests call `start` with no layout: on a cluster someone grew (`start 8 8` for the
    64-rank run) that must change nothing, not restart it back to 4 nodes."""
    conf = Path("/etc/slurm/slurm.conf")
    before = (conf.read_bytes(), conf.stat().st_mtime_ns)
    proc = subprocess.run([str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (conf.read_bytes(), conf.stat().st_mtime_ns) == before
    for layout in (["0"], ["8", "x"], ["65"]):
        bad = subprocess.run([str(CLUSTER_SCRIPT), "start", *layout], capture_output=True,
                             text=True, timeout=60, check=False)
        assert bad.returncode != 0 and "must be" in bad.stderr, bad.stderr
        assert (conf.read_bytes(), conf.stat().st_mtime_ns) == before

"""The reference trainer: SIGTERM -> checkpoint -> exit; a relaunch under a changed config is
refused, and one under the same config resumes on the same loss curve as an uninterrupted run.

One process of 4 CPU devices and conftest's FAST_STEP (every compile cached, so the runs
after the first load the step): what is checked is the trainer's stop, checkpoint and
resume, which one process does as several do, at a fifth of the CPU of the demo's two
(whose second process compiles every launch: only process 0 can hit on CPU).
Several processes stopping at one step and resuming their shards are checked on SLURM
(tests/test_submit_slurm.py), where a requeue is what resumes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from jaxwarm.core.rundir import checkpoints_dir, metrics_path
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, REPO, run_cli

pytestmark = pytest.mark.e2e


STEPS = 16
# The interrupted run pauses after each step (train.step_pause_s), so the SIGTERM sent at
# step 3 meets a trainer that is seconds from its end however loaded the machine is.
PAUSED = "train.step_pause_s=0.5"


def losses(run_dir: Path) -> dict[int, float]:
    path = metrics_path(run_dir)
    if not path.exists():
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def read_until(stream: IO[str], lines: list[str], event: threading.Event, step: int) -> None:
    """Collect every line of the launcher's stderr; set `event` once process 0 logs `step`."""
    for line in stream:
        lines.append(line)
        if line.startswith(f"[train p0] step {step} loss"):
            event.set()
    event.set()  # the launcher ended first: the waiter looks at what it printed


def launch_args(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["launch", str(DEMO), "--local", "--no-prewarm", f"run.out_dir={out}",
            f"cache.dir={cache}", *ONE_PROCESS, *FAST_STEP, f"train.steps={STEPS}",
            "train.checkpoint_every=0", *extra]


def test_sigterm_checkpoints_a_changed_config_is_refused_and_resume_continues_the_same_curve(
        tmp_path: Path, shared_cache: Path) -> None:
    """One interrupted run: its checkpoint refuses a relaunch whose config changed (before
    it resumes anything), then the unchanged relaunch resumes from it."""
    reference = run_cli(*launch_args(tmp_path / "ref", shared_cache))
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = losses(tmp_path / "ref" / "demo")
    assert sorted(expected) == list(range(1, STEPS + 1))

    run_dir = tmp_path / "run" / "demo"
    launcher = subprocess.Popen([sys.executable, "-m", "jaxwarm",
                                 *launch_args(tmp_path / "run", shared_cache, PAUSED)],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
    # The event: process 0 logged step 3 (the launcher echoes its lines as they come); the
    # signal goes out the moment it is read, with the trainer many steps from its end.
    stepped, lines = threading.Event(), []
    reader = threading.Thread(target=read_until, args=(launcher.stderr, lines, stepped, 3))
    reader.start()
    assert stepped.wait(timeout=600), "".join(lines)[-3000:]
    launcher.send_signal(signal.SIGTERM)
    reader.join(timeout=600)
    launcher.wait(timeout=600)
    stderr = "".join(lines)
    assert launcher.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "forwarding SIGTERM" in stderr and "checkpointed at step" in stderr
    checkpoints = sorted(checkpoints_dir(run_dir).glob("*/meta/metadata"))
    assert len(checkpoints) == 1
    stopped_at = json.loads(checkpoints[0].read_text())["step"]
    assert 3 <= stopped_at < STEPS

    changed = run_cli(*launch_args(tmp_path / "run", shared_cache, "step.args.learning_rate=0.1"))
    assert changed.returncode == 2  # the trainer refuses its input: one line, exit 2
    assert "refusing to resume" in changed.stderr
    assert "step.args.learning_rate: 0.003 -> 0.1" in changed.stderr

    resumed = run_cli(*launch_args(tmp_path / "run", shared_cache))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from checkpoint at step {stopped_at}" in resumed.stderr
    got = losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert abs(got[step] - expected[step]) <= 1e-5 * abs(expected[step]), step

"""The SLURM task wrapper (`jaxwarm.job.start.task.TaskCommand`) and SLURM's time-limit
warning (USR2): a training job's command hears it as the config's signal, a prewarm's is not
told and runs on (forwarded, a prewarm with no handler died of it and its task returned as if
it had finished). The wrapper runs here as in a SLURM task, around a plain Python child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO

# The child: records a USR1 it hears, says it is ready, and ends once told to (or at USR1,
# as a trainer ends after its checkpoint).
CHILD = """import pathlib, signal, sys, time
d = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGUSR1, lambda *_: (d / "usr1").write_text("heard"))
(d / "ready").write_text("")
while not (d / "go").exists() and not (d / "usr1").exists():
    time.sleep(0.05)
"""


def wait_for(found: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Until `found()` is true; a bounded wait (the test fails past `timeout`), whose length
    decides nothing."""
    deadline = time.monotonic() + timeout
    while not found():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("forward", [None, "USR1"])
def test_slurms_warning_reaches_a_training_command_only(tmp_path: Path,
                                                        forward: str | None) -> None:
    wrapper = [sys.executable, "-c", "import sys\nfrom jaxwarm.job.start.task import "
               f"TaskCommand\nsys.exit(TaskCommand(sys.argv[1:], {forward!r}, grace_s=1)())",
               sys.executable, "-c", CHILD, str(tmp_path)]
    log = tmp_path / "wrapper.log"
    with log.open("w") as err:
        task = subprocess.Popen(wrapper, cwd=REPO, stderr=err)
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), "the child to start")
        os.kill(task.pid, signal.SIGUSR2)  # what SLURM sends signal_lead_s before the limit
        wait_for(lambda: "got SIGUSR2" in log.read_text(), "the wrapper to hear it")
        (tmp_path / "go").write_text("")
        assert task.wait(timeout=60) == 0, log.read_text()
    finally:
        task.kill()
    said = log.read_text()
    if forward is None:  # a prewarm: not told, it ran on and finished
        assert not (tmp_path / "usr1").exists()
        assert "has nothing to checkpoint and runs on" in said
    else:  # a training job: told, it checkpointed and ended (no SLURM job here to requeue)
        assert (tmp_path / "usr1").read_text() == "heard"
        assert "forwarding SIGUSR1" in said and "not requeueing" in said

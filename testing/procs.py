"""The processes of a run, as /proc shows them: for tests and benchmarks that kill one, or
check that none is left behind. Polls are bounded; nothing here is timed."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is not running
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition: Callable[[], bool], timeout: float = 120.0) -> bool:
    """Poll for an outcome; the timeout only bounds a broken run, nothing is timed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def run_processes(run_dir: Path) -> dict[int, tuple[int, str]]:
    """pid -> (rank, command line) of every live process of a run's jobs: each has the run
    dir in its environment (the job environment), and its rank in the local runner's or
    SLURM's variables."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or not alive(int(proc.name)):
            continue
        try:
            raw = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        environ = dict(item.split("=", 1) for item in raw if "=" in item)
        if environ.get("JAXWARM_RUN_DIR") == str(run_dir):
            rank = environ.get("JAXWARM_PROCESS_ID") or environ.get("SLURM_PROCID") or "0"
            found[int(proc.name)] = (int(rank), command)
    return found


def available_gib() -> float:
    """The memory the kernel says can be had without swapping (MemAvailable), in GiB: what a
    test of many processes checks before it starts them."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0

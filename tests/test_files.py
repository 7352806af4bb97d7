"""The file primitives: no torn file and no temp litter, and no lock waited on forever."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxwarm.core import files
from jaxwarm.core.files import LockTimeout, atomic_write, lock_waits, locked


def test_atomic_write_replaces_whole_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    atomic_write(target, "old")
    with pytest.raises(TypeError):
        atomic_write(target, 42)  # type: ignore[arg-type]  # fails mid-write
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o600


def hold(lock: Path, what: str) -> subprocess.Popen[str]:
    """Another process holding `lock` until it reads a line (or is killed)."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from jaxwarm.core.files import locked\n"
         f"with locked({str(lock)!r}, {what!r}):\n"
         "    print('held', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_stuck_holder_is_named_after_the_timeout(tmp_path: Path) -> None:
    lock = tmp_path / "manifest.lock"
    holder = hold(lock, "test")
    try:
        with pytest.raises(LockTimeout) as caught:
            with locked(lock, "manifest", timeout_s=0.5):
                pass
        message = str(caught.value)
        assert f"pid {holder.pid}" in message and "manifest lock" in message
        assert "\n" not in message
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the dead holder's lock, and its note goes with the next holder.
    with locked(lock, "manifest", timeout_s=30):
        assert Path(str(lock) + ".holder").is_file()
    assert not Path(str(lock) + ".holder").exists()


def test_time_waited_for_a_lock_is_counted_by_kind(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What the init report says a process waited for jaxwarm's locks. The holder lets go
    from inside this process's retry loop, at its first pause after a failed try (no sleep
    orders the two), so at least that one retry (50 ms) was waited."""
    lock = tmp_path / "jaxwarm-usage.jsonl.lock"
    holder = hold(lock, "usage log")
    before = lock_waits().get("usage log", 0.0)
    pause, released = time.sleep, threading.Event()

    def release_then_pause(seconds: float) -> None:
        if not released.is_set():  # communicate's own waits pause too: release once
            released.set()
            holder.communicate("go\n", timeout=60)  # the holder exits: its lock is free
        pause(seconds)

    monkeypatch.setattr(files.time, "sleep", release_then_pause)
    try:
        with locked(lock, "usage log", timeout_s=600):
            pass
    finally:
        monkeypatch.undo()
        holder.kill()
        holder.wait()
    assert holder.returncode == 0  # it let go when asked, not when killed
    assert lock_waits()["usage log"] - before >= 0.05
    with locked(tmp_path / "k.lock", "compile of jit_step-abc"):
        pass
    assert "compile" in lock_waits()

"""The file primitives: no torn file and no temp litter, no lock waited on forever, modes that
follow the dir (private or the group's), and a failed write (a full disk) that names the file
and what was being written."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxwarm.core import files
from jaxwarm.core.files import LockTimeout, atomic_write, lock_waits, locked, make_dir, modes_in
from jaxwarm.store.store import LocalStore
from tests.conftest import run_cli
from tests.hostile import assert_refused, key


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
    lock = tmp_path / "usage-log.lock"
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


@pytest.mark.hostile
def test_modes_follow_the_dir(tmp_path: Path) -> None:
    private = make_dir(tmp_path / "private")
    assert stat.S_IMODE(private.stat().st_mode) == 0o700 and modes_in(private)[0] == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2770)
    inner = make_dir(shared / "locks")
    assert stat.S_IMODE(inner.stat().st_mode) == 0o2770 and modes_in(shared)[0] == 0o660


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 1 MiB tmpfs under tmp_path, filled up by the test; unmounted after."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)],
                      capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_full_disk_names_the_file_being_written(full_disk: Path) -> None:
    cache = full_disk / "cache"
    cache.mkdir(mode=0o700)
    LocalStore(cache).entry_path(key(1)).write_bytes(b"torn")
    fill(full_disk)
    result = run_cli("cache", "verify", str(cache))
    line = assert_refused(result, "No space left on device while writing the note")
    assert "jaxwarm bug" not in line and str(cache) in line

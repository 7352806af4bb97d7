"""The file primitives: no torn file and no temp litter, and no lock waited on forever."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.files import LockTimeout, atomic_write, locked


def test_atomic_write_replaces_whole_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    atomic_write(target, "old")
    with pytest.raises(TypeError):
        atomic_write(target, 42)  # type: ignore[arg-type]  # fails mid-write
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o600


def test_a_stuck_holder_is_named_after_the_timeout(tmp_path: Path) -> None:
    lock = tmp_path / "manifest.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from launcher.files import locked\n"
         f"with locked({str(lock)!r}, 'test'):\n"
         "    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
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

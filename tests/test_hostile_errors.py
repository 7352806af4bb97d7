"""Class 6 of issue 17: errors name their cause. A full disk names the file and what was
being written; a closed stdout ends quietly; Unicode line/paragraph separators, NEL, C1
controls and bidi overrides are control characters like any other."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.errors import ConfigError
from tests.conftest import DEMO, REPO
from tests.hostile import assert_refused


def key(n: int) -> str:
    return f"jit_f{n}-{n:064x}"


@pytest.mark.parametrize("character", ["\u2028", "\u2029", "\x85", "\x9b", "\u202e", "\u2066"])
def test_unicode_controls_are_refused_like_ascii_ones(tmp_path: Path, character: str) -> None:
    with pytest.raises(ConfigError) as caught:
        # YAML's double-quoted escape puts the very character in the value (a raw NEL in a
        # plain scalar is a line break to YAML, folded into a space before jaxwarm sees it).
        load_config(DEMO, [f'run.name="demo\\u{ord(character):04x}x"', f"run.out_dir={tmp_path}"])
    message = str(caught.value)
    assert "run.name: expected a single line without control characters" in message
    assert message.isascii(), message  # the line itself shows the character escaped


def cli(*args: str, stdout_to: str = "") -> subprocess.CompletedProcess[str]:
    command = f'"$0" -m jaxwarm "$@" {stdout_to}'
    return subprocess.run(["bash", "-o", "pipefail", "-c", command, sys.executable, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.e2e
def test_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    entry = zlib.compress(bytes(4) + b"x" * 64)
    for n in range(3000):  # far more output than a pipe holds
        (cache / f"{key(n)}-cache").write_bytes(entry)
    for extra in ([], ["--json"]):
        result = cli("cache", "ls", str(cache), *extra, stdout_to="| head -1")
        assert result.stderr == "", result.stderr[-2000:]
        assert len(result.stdout.splitlines()) == 1
        assert result.returncode == 141


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
def test_a_full_disk_names_the_file_being_written(full_disk: Path) -> None:
    cache = full_disk / "cache"
    cache.mkdir(mode=0o700)
    (cache / f"{key(1)}-cache").write_bytes(b"torn")
    fill(full_disk)
    result = cli("cache", "verify", str(cache))
    line = assert_refused(result, "No space left on device while writing the note")
    assert "jaxwarm bug" not in line and str(cache) in line

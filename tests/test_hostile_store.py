"""Store commands on odd files: a directory, a FIFO or a link to /dev/zero under an entry's
name is skipped with a line (never read, hung on or removed), and every command finishes."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.hostile import snapshot

pytestmark = pytest.mark.e2e


def key(c: str) -> str:
    """A valid JAX key whose digest is the hex digit `c` repeated."""
    return f"jit_{c}-{c * 64}"


def odd_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / f"{key('a')}-cache").mkdir()  # a directory
    os.mkfifo(cache / f"{key('b')}-cache")  # would block a plain read forever
    (cache / f"{key('c')}-cache").symlink_to("/dev/zero")  # would be read until MemoryError
    (cache / "x-cache").mkdir()  # not even named like an entry
    (cache / f"{key('d')}-cache").write_bytes(zlib.compress(bytes(4) + b"x" * 100))
    return cache


def test_odd_files_are_skipped_with_a_line_and_left_alone(tmp_path: Path) -> None:
    cache = odd_cache(tmp_path)
    before = snapshot(cache)
    for command in (["ls"], ["stats"], ["verify"], ["prune", "--max-size", "100G"]):
        result = run_cli("cache", command[0], str(cache), *command[1:], timeout=60)
        assert result.returncode == 0, (command, result.stderr)
        assert "Traceback" not in result.stderr
        for c, kind in (("a", "a directory"), ("b", "a FIFO"), ("c", "a symlink")):
            assert f"skipping {cache / key(c)}-cache: {kind}, not a JAX entry" in result.stderr
        assert "x-cache" not in result.stderr + result.stdout
    verified = run_cli("cache", "verify", str(cache))
    assert "1 entries checked" in verified.stdout and "1 intact" in verified.stdout
    after = snapshot(cache)
    assert {k: v for k, v in after.items() if not k.startswith("jaxwarm-")} == before

"""Cache dir checks without gaps: a group-writable dir needs cache.trusted_group, an empty
cache.dir is not the working directory, a symlink cannot lead into a dir anyone may replace,
and `cache verify` only ever touches files that look like JAX entries."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import DEMO, run_cli
from tests.hostile import assert_refused, snapshot

pytestmark = pytest.mark.e2e


KEY = "jit_f-" + "b" * 64


def launch(tmp_path: Path, cache: str | Path, *extra: str, cwd: Path | None = None):
    return run_cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                   f"cache.dir={cache}", *extra, cwd=cwd)


def test_a_group_writable_cache_dir_needs_a_trusted_group(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o775)
    before = snapshot(tmp_path)
    assert_refused(launch(tmp_path, cache), "cache.dir", "is writable by group",
                   "cache.trusted_group")
    assert_refused(run_cli("cache", "ls", str(cache)), "is writable by group")
    assert snapshot(tmp_path) == before


def test_an_empty_cache_dir_never_means_the_working_directory(tmp_path: Path) -> None:
    users = tmp_path / "build-cache"
    users.write_text("the user's build cache\n")
    before = snapshot(tmp_path)
    assert_refused(launch(tmp_path, "", cwd=tmp_path), "cache.dir: expected a directory path")
    assert_refused(run_cli("cache", "verify", str(DEMO), "cache.dir=", cwd=tmp_path),
                   "cache.dir: expected a directory path")
    assert snapshot(tmp_path) == before


def test_cache_verify_touches_only_files_named_like_entries(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / "build-cache").write_text("not an entry\n")
    (cache / "notes-cache").write_bytes(b"garbage")
    (cache / f"{KEY}-cache").write_bytes(b"torn")
    result = run_cli("cache", "verify", str(cache))
    assert result.returncode == 1, result.stderr
    assert f"QUARANTINED {KEY}" in result.stdout
    assert (cache / "build-cache").read_text() == "not an entry\n"
    assert (cache / "notes-cache").read_bytes() == b"garbage"


def test_a_symlink_into_a_world_writable_parent_is_refused_by_the_launcher(
        tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    (open_dir / "real-cache").mkdir(parents=True, mode=0o700)
    open_dir.chmod(0o777)  # no sticky bit: anyone may swap real-cache
    link = tmp_path / "cache-link"
    link.symlink_to(open_dir / "real-cache")
    before = snapshot(tmp_path)
    assert_refused(launch(tmp_path, link), f"cache.dir: parent {open_dir}",
                   "writable by every user")
    assert snapshot(tmp_path) == before


READ_ONLY = Path("/proc/sys")  # a read-only mount, even for root


@pytest.mark.skipif(os.access(READ_ONLY, os.W_OK), reason="no read-only mount to test on")
def test_a_read_only_cache_dir_is_one_line_before_any_job(tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    for command in ("launch", "prewarm", "verify"):
        result = run_cli(command, str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                         f"cache.dir={READ_ONLY / 'jax-cache'}")
        assert_refused(result, "cache.dir", f"cannot be created: {READ_ONLY} read-only for you")
    assert snapshot(tmp_path) == before

"""Helpers for the hostile-input tests (marked `hostile`, in the test file of the unit each
attacks): crafted cache entries, snapshot a tree, and assert a CLI refusal is one line."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import zlib
from pathlib import Path

from jaxwarm.store.entries import MIN_PAYLOAD_CAP
from jaxwarm.store.store import LocalStore


def key(n: int) -> str:
    """A valid JAX cache key of function `jit_f<n>`, a distinct one per `n`."""
    return f"jit_f{n}-{hashlib.sha256(str(n).encode()).hexdigest()}"


def entry_bytes(n: int) -> bytes:
    """A small valid entry (a zlib stream of JAX's 4-byte header and a payload), per `n`."""
    return zlib.compress(bytes(4) + bytes([n]) * 200)


def write_entry(cache: Path, n: int, mtime: float) -> Path:
    """Entry `n` written into `cache`, its file time set to `mtime`."""
    path = LocalStore(cache).entry_path(key(n))
    path.write_bytes(entry_bytes(n))
    os.utime(path, (mtime, mtime))
    return path


@functools.cache
def zlib_bomb() -> bytes:
    """A valid zlib stream of JAX's 4-byte header and 16 MiB more zeros than any entry's
    payload may have, made in blocks (about 80 KB)."""
    payload = MIN_PAYLOAD_CAP + (16 << 20)
    packer = zlib.compressobj(1)
    parts = [packer.compress(bytes(4))]
    block = bytes(1 << 20)
    for _ in range(payload >> 20):
        parts.append(packer.compress(block))
    return b"".join(parts) + packer.flush()


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every path under `root` (itself included) with its kind and content (or link target),
    so a test can assert that a refused command changed nothing there. Empty lock files are
    left out: taking a lock (JAX's `.lockfile`, jaxwarm's `*.lock`) leaves one, harmlessly."""
    state: dict[str, tuple[str, bytes | str]] = {}
    for path in [root, *sorted(root.rglob("*"))] if root.exists() else []:
        name = str(path.relative_to(root))
        if path.name.endswith((".lockfile", ".lock")) and path.is_file() \
                and not path.stat().st_size:
            continue
        if path.is_symlink():
            state[name] = ("link", str(path.readlink()))
        elif path.is_file():
            state[name] = ("file", path.read_bytes())
        elif path.is_dir():
            state[name] = ("dir", b"")
        else:
            state[name] = ("other", b"")
    return state


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, no traceback, and one `jaxwarm: error:` line holding every fragment."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:],
                                    result.stderr[-3000:])
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("jaxwarm: error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]

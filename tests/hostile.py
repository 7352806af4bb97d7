"""Helpers for the hostile-input tests: snapshot a tree, and assert a CLI refusal is one line."""

from __future__ import annotations

import subprocess
from pathlib import Path


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

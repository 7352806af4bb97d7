"""Entries are protected from the moment they are written: a prewarm records each entry right
after its compile (a prewarm killed before the next one leaves it recorded), a later prewarm
pins an intact entry nobody recorded, and prune never removes an entry in flight."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from jaxwarm.core.files import locked
from jaxwarm.store.store import LocalStore
from tests.conftest import run_cli
from tests.test_store_commands import TINY, job_args

pytestmark = pytest.mark.e2e


DYING = "step.factory=tests.dying_factory:make_train_step_then_die"


def entries(cache: Path) -> dict[str, Path]:
    return {entry.key: entry.path for entry in LocalStore(cache).scan(histories={})}


def test_a_killed_prewarm_leaves_its_written_entry_recorded_and_pinned(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    killed = run_cli("prewarm", *job_args(tmp_path, cache, *TINY, DYING))
    assert killed.returncode != 0
    written = entries(cache)
    assert len(written) == 1, killed.stderr[-3000:]
    (key, path), = written.items()
    store = LocalStore(cache)
    record = store.manifest()[key]
    assert (record.size, record.written) == (path.stat().st_size, True)
    assert store.entry_problem(key, record.sha256) is None
    pruned = run_cli("cache", "prune", str(cache), "--max-size", "1")
    assert pruned.returncode == 0, pruned.stderr
    assert path.is_file()  # pinned by the manifest from the moment it was written

    # The same kill a moment earlier (after JAX's write, before the record): nobody recorded
    # the entry. The next prewarm checks it in full, finds it intact and pins it.
    store.manifest_file.write_text(json.dumps({"version": 1, "entries": {}}))
    store.usage_file.unlink(missing_ok=True)
    again = run_cli("prewarm", *job_args(tmp_path, cache, *TINY))
    assert again.returncode == 0, again.stderr[-3000:]
    assert key.startswith("jit_train_step-")
    assert f"WARM  train_step  {key}" in again.stdout + again.stderr
    assert store.manifest()[key].sha256 == record.sha256
    assert run_cli("cache", "prune", str(cache), "--max-size", "1").returncode == 0
    assert path.is_file()


def test_prune_never_removes_an_entry_in_flight(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    key = "jit_train_step-" + "c" * 64
    store = LocalStore(cache)
    entry = store.entry_path(key)
    entry.write_bytes(zlib.compress(bytes(4) + b"x" * 4000))
    lock = store.writer_lock_path(key)
    lock.parent.mkdir(mode=0o700)
    # This test process plays the prewarm that wrote the entry and has not recorded it yet.
    with locked(lock, f"compile of {key}"):
        for extra in ([], ["--include-pinned"]):
            pruned = run_cli("cache", "prune", str(cache), "--max-size", "1", *extra)
            assert pruned.returncode == 0, pruned.stderr
            assert "pruned 0 entries" in pruned.stdout
            assert entry.is_file()
    pruned = run_cli("cache", "prune", str(cache), "--max-size", "1")
    assert "pruned 1 entry" in pruned.stdout and not entry.exists()

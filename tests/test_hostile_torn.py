"""A torn entry is never WARM: verify, the pre-run check and the prewarm's own warm check all
go through `integrity.warm_problem`; a torn entry is quarantined and compiled afresh; a write
that fails (a full disk) is a failure that leaves no torn entry and no temp file."""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from jaxwarm.store.store import LocalStore
from tests.conftest import REPO, run_cli
from tests.test_store_commands import TINY, job_args

pytestmark = pytest.mark.e2e


def entries(cache: Path) -> dict[str, str]:
    """The key of each entry in `cache`, by function."""
    return {entry.function: entry.key for entry in LocalStore(cache).scan(histories={})}


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def test_torn_entries_are_cold_quarantined_and_rewritten(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run_cli("prewarm", *job_args(tmp_path, cache, *TINY))
    assert first.returncode == 0, output(first)[-3000:]
    store = LocalStore(cache)
    step = entries(cache)["jit_train_step"]

    # Recorded entry, torn (a kill -9 mid-write): the quick size check catches it.
    truncate(store.entry_path(step))
    verdict = run_cli("verify", *job_args(tmp_path, cache, *TINY), "--no-check-cache")
    assert verdict.returncode == 1, output(verdict)[-3000:]
    assert "COLD  jit_train_step" in verdict.stdout and "(torn)" in verdict.stdout
    assert "WARM  jit_init_state" in verdict.stdout
    again = run_cli("prewarm", *job_args(tmp_path, cache, *TINY), "--no-check-cache")
    assert again.returncode == 0, output(again)[-3000:]
    assert "COLD  train_step" in output(again) and "WARM  init_state" in output(again)
    assert store.entry_problem(step, store.manifest()[step].sha256) is None

    # Unrecorded entry, torn: nobody knows its size, so it gets the full check.
    store.manifest_file.write_text(json.dumps({"version": 1, "entries": {}}))
    store.usage_file.unlink()
    init = entries(cache)["jit_init_state"]
    truncate(store.entry_path(init))
    third = run_cli("prewarm", *job_args(tmp_path, cache, *TINY))
    assert third.returncode == 0, output(third)[-3000:]
    assert "COLD  init_state" in output(third) and "does not decompress" in output(third)
    assert store.entry_problem(init) is None
    assert store.quarantined() == 2


def limit_file_size() -> None:
    """A full disk, as the writer sees it: writes past 60 KiB fail (EFBIG; Python ignores
    SIGXFSZ). JAX's entries are bigger, jaxwarm's own files smaller."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (60 * 1024, 60 * 1024))


def test_a_failed_write_is_a_failure_and_leaves_nothing_torn(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = subprocess.run([sys.executable, "-m", "jaxwarm", "prewarm",
                             *job_args(tmp_path, cache, *TINY)], cwd=REPO, text=True,
                            capture_output=True, timeout=300, preexec_fn=limit_file_size)
    assert result.returncode != 0, output(result)[-3000:]
    assert "FAILED jit_train_step" in output(result)
    assert "written as" not in output(result)
    assert entries(cache) == {}  # the torn writes are quarantined, not left as entries
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert all(not record.written for record in LocalStore(cache).manifest().values())


def test_a_function_jax_chooses_not_to_store_is_said_in_its_words_not_failed(
        tmp_path: Path) -> None:
    """Under cache.min_compile_time_secs JAX writes no entry; whether a function is under it
    is JAX's call by its own clock, which starts later than the compile time jaxwarm
    reports, so near the threshold the two disagree. The prewarm takes JAX's word (its log
    line) and does not call the missing entry a failed write."""
    cache = tmp_path / "cache"
    result = run_cli("prewarm", *job_args(tmp_path, cache, *TINY,
                                          "cache.min_compile_time_secs=1000"))
    assert result.returncode == 0, output(result)[-3000:]
    assert re.search(r"] jit_train_step: compiled in [\d.]+ s; JAX did not store it: it took "
                     r"< 1000\.00 seconds to compile \([\d.]+s\)$", output(result), re.M), \
        output(result)[-3000:]
    assert "FAILED" not in output(result) and entries(cache) == {}

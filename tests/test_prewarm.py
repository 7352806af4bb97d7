"""The prewarm job (jaxwarm/job/prewarm.py) and the entries it writes: each is recorded right
after its compile (a prewarm killed before the next one leaves it recorded and pinned), a
later prewarm pins an intact entry nobody recorded, a write that fails (a full disk) is a
failure that leaves no torn entry and no temp file, a function JAX chooses not to store is
said in JAX's words, and an entry JAX evicted during the prewarm to keep within
`cache.max_size` is a named failure."""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.store.store import LocalStore
from tests.conftest import DEMO, FAST_CHUNKWISE, REPO, Cli, run_cli
from tests.hostile import key, write_entry
from tests.test_store_commands import LAYOUT, TINY, job_args, output

DYING = "step.factory=tests.dying_factory:make_train_step_then_die"


def entries(cache: Path) -> dict[str, Path]:
    return {entry.key: entry.path for entry in LocalStore(cache).scan(histories={})}


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_killed_prewarm_leaves_its_written_entry_recorded_and_pinned(tmp_path: Path,
                                                                       cli: Cli) -> None:
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
    pruned = cli("cache", "prune", str(cache), "--max-size", "1")
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
    assert cli("cache", "prune", str(cache), "--max-size", "1").returncode == 0
    assert path.is_file()


def limit_file_size() -> None:
    """A full disk, as the writer sees it: writes past 60 KiB fail (EFBIG; Python ignores
    SIGXFSZ). JAX's entries of the tiny chunkwise step are bigger (the small step's are
    not), jaxwarm's own files smaller."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (60 * 1024, 60 * 1024))


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_failed_write_is_a_failure_and_leaves_nothing_torn(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = subprocess.run([sys.executable, "-m", "jaxwarm", "prewarm",
                             *job_args(tmp_path, cache, *LAYOUT, *FAST_CHUNKWISE)],
                            cwd=REPO, text=True,
                            capture_output=True, timeout=300, preexec_fn=limit_file_size)
    assert result.returncode != 0, output(result)[-3000:]
    assert "FAILED jit_train_step" in output(result)
    assert "written as" not in output(result)
    assert entries(cache) == {}  # the torn writes are quarantined, not left as entries
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert all(not record.written for record in LocalStore(cache).manifest().values())


@pytest.mark.e2e
@pytest.mark.hostile
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


@pytest.mark.hostile
def test_an_entry_evicted_during_the_prewarm_is_a_named_failure(tmp_path: Path) -> None:
    from jaxwarm.job.prewarm import (  # imports jax: only in the test that needs it
        Compiled,
        evictions,
    )

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    kept = write_entry(cache, 2, time.time())
    config = load_config(DEMO, [f"cache.dir={cache}", "cache.max_size=1000"])
    compiled = [Compiled(SimpleNamespace(), SimpleNamespace(key=key(n), sha256="0" * 64,
                                                            size=600))
                for n in (1, 2)]  # entry 1 was written, then evicted writing entry 2
    evicted, present = evictions(config, LocalStore(cache), compiled)
    assert evicted.failure is not None and kept.exists() and present.failure is None
    assert "JAX evicted it to keep the cache within cache.max_size=1000 bytes; this " \
           "prewarm's entries need 1200 bytes" in evicted.failure

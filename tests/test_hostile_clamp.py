"""Class 7 of issue 17 (its cache-time and size-cap parts): a file time from the future is
no evidence of use, so such an entry neither survives `--older-than` nor heads the LRU
order; a `cache.max_size` below what the run prewarms is refused before anything starts,
and an entry JAX evicted during the prewarm is a failure named as that."""

from __future__ import annotations

import hashlib
import os
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.environment import size_cap
from jaxwarm.core.records import FunctionRecord
from jaxwarm.jaxkey.entryformat import encode_atime
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.misses import MissContext
from jaxwarm.store.store import LocalStore
from tests.conftest import DEMO, run_cli
from tests.hostile import assert_refused, snapshot

HOUR = 3600.0


def key(n: int) -> str:
    return f"jit_f{n}-{hashlib.sha256(str(n).encode()).hexdigest()}"


def entry(cache: Path, n: int, mtime: float) -> Path:
    path = cache / f"{key(n)}-cache"
    path.write_bytes(zlib.compress(bytes(4) + bytes([n]) * 100))
    os.utime(path, (mtime, mtime))
    return path


@pytest.mark.e2e
def test_future_times_neither_protect_an_entry_from_older_than_nor_from_lru(
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    now = time.time()
    future = entry(cache, 1, now + 10 * 365 * 86400)
    hour_old = entry(cache, 2, now - HOUR)
    fresh = entry(cache, 3, now)
    crafted = entry(cache, 4, now - HOUR)  # its atime file claims a use in 2100
    (cache / f"{key(4)}-atime").write_bytes(encode_atime(int(4.1e18)))
    result = run_cli("cache", "prune", str(cache), "--older-than", "30m")
    assert result.returncode == 0, result.stderr
    assert "pruned 3 entries" in result.stdout
    assert fresh.exists() and not future.exists() and not hour_old.exists()
    assert not crafted.exists()
    future = entry(cache, 1, now + 10 * 365 * 86400)
    result = run_cli("cache", "prune", str(cache), "--max-size", str(fresh.stat().st_size))
    assert result.returncode == 0, result.stderr
    assert fresh.exists() and not future.exists()


@pytest.mark.e2e
def test_a_size_cap_below_the_prewarmed_entries_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    LocalStore(cache).record_entries([
        ManifestEntry(function=f"jit_f{n}", key=key(n), run="demo", config=str(DEMO),
                      compile_s=1.0, lower_s=0.1, written=True, jax_version="0.10.2",
                      process_count=1, sha256="0" * 64, size=1000) for n in (1, 2)])
    before = snapshot(tmp_path)
    result = run_cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                     f"cache.dir={cache}", "cache.max_size=1500")
    assert_refused(result, "cache.max_size: 1500 bytes is less than the 2000 bytes of the 2 "
                           "entries run 'demo' prewarms")
    assert snapshot(tmp_path) == before


def test_an_entry_evicted_during_the_prewarm_is_a_named_failure(tmp_path: Path) -> None:
    from jaxwarm.job.prewarm import (  # imports jax: only in the test that needs it
        Compiled,
        evictions,
    )

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    kept = entry(cache, 2, time.time())
    config = load_config(DEMO, [f"cache.dir={cache}", "cache.max_size=1000"])
    compiled = [Compiled(SimpleNamespace(), SimpleNamespace(key=key(n), sha256="0" * 64,
                                                            size=600))
                for n in (1, 2)]  # entry 1 was written, then evicted writing entry 2
    evicted, present = evictions(config, LocalStore(cache), compiled)
    assert evicted.failure is not None and kept.exists() and present.failure is None
    assert "JAX evicted it to keep the cache within cache.max_size=1000 bytes; this " \
           "prewarm's entries need 1200 bytes" in evicted.failure


def test_a_miss_of_an_evicted_entry_is_named_as_eviction(tmp_path: Path) -> None:
    entry = ManifestEntry(function="jit_f1", key=key(1), run="demo", config=str(DEMO),
                          compile_s=1.0, lower_s=0.1, written=True, jax_version="0.10.2",
                          process_count=1, components={"computation": "ab"})
    store = LocalStore(tmp_path)
    missed = FunctionRecord("jit_f1", None, False, components={"computation": "ab"})
    capped = store.explain_miss(missed, {key(1): entry}, MissContext(
        run="demo", max_size=size_cap({"JAX_COMPILATION_CACHE_MAX_SIZE": "1000"})))
    assert "JAX's LRU evicts to stay within cache.max_size=1000 bytes" in capped[0]
    uncapped = store.explain_miss(missed, {key(1): entry},
                                  MissContext(run="demo", max_size=size_cap({})))
    assert "(pruned or deleted)" in uncapped[0]

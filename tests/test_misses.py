"""Why a lookup missed (jaxwarm/store/misses.py), where the cache holds a size cap: an
evicted entry is named as JAX's eviction, not as pruned or deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxwarm.core.environment import size_cap
from jaxwarm.core.records import FunctionRecord
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.misses import MissContext
from jaxwarm.store.store import LocalStore
from tests.conftest import DEMO
from tests.hostile import key


@pytest.mark.hostile
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

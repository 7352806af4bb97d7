"""The cache store's pure parts and small questions: prune policy, usage history (through a
store), size/age parsing, the environment rules for size caps and remote dirs, and what a
remote store answers. (Dir safety: tests/test_security.py; bundles: tests/test_bundle.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jaxwarm.cli.cache import parse_age, parse_size
from jaxwarm.core.config import load_config
from jaxwarm.core.environment import jax_options, job_environment
from jaxwarm.core.records import (
    EntryChecked,
    EntryPruned,
    Fingerprint,
    FunctionRecord,
    PrewarmRecord,
    parse_usage_line,
)
from jaxwarm.jaxkey.entryformat import function_of, split_key
from jaxwarm.job.start.pinned import resolve_paths
from jaxwarm.store.cachestore import RemoteDirError
from jaxwarm.store.entries import Entry
from jaxwarm.store.integrity import IntegrityCheck
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.misses import MissContext
from jaxwarm.store.prune import Pruning
from jaxwarm.store.store import open_store
from jaxwarm.submit.jobs import prewarm_job, train_job, verify_job
from jaxwarm.submit.prepare import pin_config
from tests.conftest import DEMO


def entry(key: str, size: int, last_used: float) -> Entry:
    return Entry(key=key, path=Path(f"/c/{key}-cache"), size=size, created=0.0,
                 last_used=last_used)


def test_prune_removes_least_recently_used_until_it_fits_and_spares_pinned() -> None:
    entries = [entry("jit_a-1", 100, 10), entry("jit_b-2", 100, 20), entry("jit_c-3", 100, 30),
               entry("jit_d-4", 100, 40)]
    victims = Pruning(max_bytes=200).victims(entries, pinned={"jit_a-1"}, now=50)
    assert [v.key for v in victims] == ["jit_b-2", "jit_c-3"]
    by_age = Pruning(older_than_s=25).victims(entries, pinned=set(), now=50)
    assert [v.key for v in by_age] == ["jit_a-1", "jit_b-2"]
    assert Pruning(max_bytes=1000).victims(entries, pinned=set(), now=50) == []


def usage(*lines: dict) -> list:
    return [parse_usage_line(json.dumps(line), f"usage:{n}") for n, line in enumerate(lines, 1)]


def test_usage_history_tracks_last_writer_and_voids_checksums_on_quarantine(
        tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    for record in usage(
        {"time": 1, "run": "r", "job": "prewarm", "restart": 0,
         "functions": [{"name": "jit_f", "key": "jit_f-1", "hit": False, "sha256": "aa"}]},
        {"time": 2, "run": "r", "job": "train", "restart": 0,
         "functions": [{"name": "jit_f", "key": "jit_f-1", "hit": True}]},
        {"time": 3, "event": "quarantined", "key": "jit_f-1"},
    ):
        store.append_usage(record)
    history = store.histories()["jit_f-1"]
    assert (history.hits, history.misses, history.last_used) == (1, 1, 2)
    assert history.used_by == ["r (prewarm r0)", "r (train r0)"]
    assert history.sha256 is None and history.removed
    store.append_usage(usage(
        {"time": 4, "run": "r", "job": "train", "restart": 1,
         "functions": [{"name": "jit_f", "key": "jit_f-1", "hit": False, "sha256": "bb"}]})[0])
    rewritten = store.histories()
    assert rewritten["jit_f-1"].sha256 == "bb"
    assert rewritten["jit_f-1"].written_by == "r (train r1)"


def test_a_key_names_its_function() -> None:
    key = "jit_train_step-" + "ab" * 32
    assert split_key(key) == ("jit_train_step", "ab" * 32)
    assert function_of(key) == "jit_train_step" and Entry(key, Path(key), 0, 0.0, 0.0).function == \
        "jit_train_step"
    assert function_of("jit_f-g-" + "0" * 64) == "jit_f-g"
    assert split_key("x" * 64) == ("", "x" * 64) and function_of("x" * 64) == "x" * 64


@pytest.mark.parametrize(("text", "size"), [("123", 123), ("64K", 65536), ("1.5M", 1572864),
                                           ("2GiB", 2 << 30), ("10GB", 10 << 30)])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("30m", 1800), ("12h", 43200),
                                              ("7d", 604800), ("2w", 1209600)])
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


def test_every_job_gets_the_same_size_cap(tmp_path: Path) -> None:
    config, pinned = pin_config(load_config(DEMO, [f"run.out_dir={tmp_path}",
                                                   f"cache.dir={tmp_path / 'c'}",
                                                   "cache.max_size=1000000"]))
    caps = {job(config, pinned).env["JAX_COMPILATION_CACHE_MAX_SIZE"]
            for job in (prewarm_job, verify_job, train_job)}
    assert caps == {"1000000"}


def test_remote_cache_dirs_turn_the_xla_sub_caches_off(tmp_path: Path) -> None:
    config = resolve_paths(load_config(DEMO, [f"run.out_dir={tmp_path}",
                                              "cache.dir=gs://bucket/jax-cache"]))
    assert jax_options(config)["jax_persistent_cache_enable_xla_caches"] == "none"
    env = job_environment(config, tmp_path / "config.yaml")
    assert env["JAX_COMPILATION_CACHE_DIR"] == "gs://bucket/jax-cache"
    assert env["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    local = resolve_paths(load_config(DEMO, [f"cache.dir={tmp_path}"]))
    assert jax_options(local)["jax_persistent_cache_enable_xla_caches"] == \
        "xla_gpu_per_fusion_autotune_cache_dir"


def test_a_remote_store_keeps_no_records_and_writes_nothing_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every operation a local store answers, a remote one answers too: its records read as
    empty, writing one does nothing, and what a user asks that only a local dir can do is
    refused in one line naming the dir (tests/test_store_remote.py: its entries)."""
    monkeypatch.chdir(tmp_path)
    store = open_store("s3://bucket/jax-cache")
    config = load_config(DEMO, ["cache.dir=s3://bucket/jax-cache"])
    assert store.resolved(tmp_path) == "s3://bucket/jax-cache"
    assert store.manifest() == {} and store.prewarms() == {} and store.run_entries("demo") == []
    assert store.usage() == [] and store.histories() == {} and store.recorded() == {}
    assert store.xla_caches("all") == "none"
    assert store.check(config.cache, "c.yaml", writing=True) is None  # the bucket's rules
    assert store.prepare(config.cache, "c.yaml") is None
    key = "jit_step-" + "a" * 64
    store.append_usage(EntryPruned(key, 5))
    store.record_prewarm(PrewarmRecord(Fingerprint("d", {}), [key], "demo"))
    store.repair([], [], "demo")
    assert store.usage() == [] and store.prewarms() == {}
    assert store.check_and_quarantine([key]) == ([], 0.0)  # nothing recorded to check against
    assert store.written_since(key, 0.0) is None and store.ensure_atime_files() == 0
    assert store.records_where() == "no manifest for a remote cache dir (it needs a local " \
        "file lock)"
    for refused in (store.scan, store.prune, store.check_and_quarantine,
                    lambda: store.export_bundle(config, tmp_path / "b.tar")):
        with pytest.raises(RemoteDirError, match="^s3://bucket/jax-cache: .* needs a local or "
                                                 "mounted cache dir"):
            refused()
    assert list(tmp_path.iterdir()) == []  # nothing under a local path that looks like the URL


def test_a_local_store_parses_its_usage_log_once_until_it_writes_to_it(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    assert store.resolved() == os.path.realpath(tmp_path)
    key = "jit_step-" + "a" * 64
    store.append_usage(EntryChecked(key, "f" * 64, 5))
    first = store.usage()
    assert store.usage() is first  # one parse, however many steps of a command ask
    store.append_usage(EntryPruned(key, 5))  # this store wrote: it reads the log afresh
    assert [type(record) for record in store.usage()] == [EntryChecked, EntryPruned]
    assert store.histories()[key].removed


def test_a_miss_on_a_quarantined_entry_says_why_it_went(tmp_path: Path) -> None:
    """A present but corrupt entry, quarantined (by the pre-run check, or right before JAX's
    read): the miss that follows says so, not that the entry was pruned or deleted."""
    store = open_store(str(tmp_path))
    key = f"jit_f-{'a' * 64}"
    manifest = {key: ManifestEntry(function="jit_f", key=key, run="r", config="c",
                                   compile_s=1.0, lower_s=0.1, written=True, jax_version="0",
                                   process_count=1, components={"computation": "x"})}
    missed = FunctionRecord("jit_f", None, False, components={"computation": "x"})
    store.entry_path(key).write_bytes(b"not an entry")
    store.quarantine(IntegrityCheck(key, 12, "does not decompress (invalid header)", False))
    [line] = store.explain_miss(missed, manifest, MissContext(run="r"))
    assert line.startswith("its entry was quarantined (does not decompress (invalid header)) "
                           "before this job could load it")
    store.entry_path(key).write_bytes(b"written again")  # and pruned: gone is gone
    store.append_usage(EntryPruned(key))
    store.entry_path(key).unlink()
    [line] = store.explain_miss(missed, manifest, MissContext(run="r"))
    assert "gone (pruned or deleted)" in line

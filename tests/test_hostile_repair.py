"""Class 4 of issue 17: integrity that repairs itself. A same-size bit flip in an entry
another run recorded passes the quick (size) check; once a training job misses it, the miss
is in the usage log, `verify` says "WARM by size, but a previous run missed it", and the
next prewarm's warm check reads it in full, so it is quarantined and compiled again. The
check itself writes nothing (verify's); recording a full check is the prewarm's. An entry
whose writer lock is held is being written: left alone by every check. The manifest
records every run that uses a key, old manifests included. Real files, no JAX."""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from pathlib import Path

from jaxwarm.core.config import load_config
from jaxwarm.core.files import locked
from jaxwarm.core.records import EntryMissed, FunctionRecord, InitReport
from jaxwarm.store.integrity import BEING_WRITTEN, IntegrityCheck
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore
from tests.conftest import DEMO

KEY = "jit_train_step-" + hashlib.sha256(b"step").hexdigest()


def payload() -> bytes:
    return zlib.compress(bytes(4) + bytes(range(256)) * 8)


def recorded(store: LocalStore, run: str = "other") -> ManifestEntry:
    data = payload()
    entry = ManifestEntry(function="jit_train_step", key=KEY, run=run, config="c.yaml",
                          compile_s=1.0, lower_s=0.1, written=True, jax_version="0.10.2",
                          process_count=1, sha256=hashlib.sha256(data).hexdigest(),
                          size=len(data))
    store.entry_path(KEY).write_bytes(data)
    store.record_entries([entry])
    return entry


def a_cache(tmp_path: Path) -> LocalStore:
    (tmp_path / "cache").mkdir(mode=0o700)
    return LocalStore(tmp_path / "cache")


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: the quick check cannot see it
    path.write_bytes(bytes(data))


def test_a_missed_same_size_flip_is_found_by_the_next_prewarm_check(tmp_path: Path) -> None:
    store = a_cache(tmp_path)
    recorded(store)
    flip_a_byte(store.entry_path(KEY))
    assert store.warm_check(KEY).warm  # WARM by size
    assert not store.warm_check(KEY).missed
    store.append_usage(EntryMissed(KEY, "train-run"))  # what the training job records
    quick = store.warm_check(KEY)  # verify stays quick, and says why
    assert quick.warm and quick.missed and not quick.read_in_full
    check = store.warm_check(KEY, recheck_missed=True)  # the prewarm's check
    assert check.read_in_full  # here zlib's own checksum fails; else the recorded sha256
    assert check.problem is not None
    store.quarantine(IntegrityCheck(KEY, 0, check.problem, checksum_known=True))
    assert not store.entry_path(KEY).exists() and not store.warm_check(KEY).missed


def test_an_intact_missed_entry_is_checked_once_and_trusted_again(tmp_path: Path) -> None:
    store = a_cache(tmp_path)
    recorded(store)
    store.append_usage(EntryMissed(KEY, "train-run"))
    usage = store.usage_file.read_bytes()
    check = store.warm_check(KEY, recheck_missed=True)
    assert check.warm and check.read_in_full and check.missed
    assert store.usage_file.read_bytes() == usage  # the check wrote nothing
    store.record_check(check)  # the prewarm records it
    again = store.warm_check(KEY, recheck_missed=True)
    assert not again.missed
    assert again.warm and not again.read_in_full  # the quick check again
    assert store.entry_path(KEY).exists()


def test_a_training_miss_on_a_present_entry_is_recorded(tmp_path: Path) -> None:
    from jaxwarm.job.start.books import note_missed_entries
    store = a_cache(tmp_path)
    cache = store.path
    recorded(store)
    old = time.time() - 60
    os.utime(store.entry_path(KEY), (old, old))
    config = load_config(DEMO, [f"cache.dir={cache}", f"run.out_dir={tmp_path}"])
    report = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                        cache_dir=str(cache), init_budget_s=1.0,
                        functions=[FunctionRecord(name="jit_train_step", key=KEY, hit=False),
                                   FunctionRecord(name="jit_init", key=KEY.replace(
                                       "train_step", "init"), hit=False)])
    note_missed_entries(config, store, store, report, since=time.time())
    assert store.warm_check(KEY).missed
    lines = store.usage_file.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["event"] == "missed"  # only the present one


def test_an_entry_being_written_is_never_quarantined(tmp_path: Path) -> None:
    """Prewarm A holds KEY's writer lock while JAX writes it (0 bytes so far)."""
    store = a_cache(tmp_path)
    store.locks_dir.mkdir(mode=0o700)
    store.entry_path(KEY).write_bytes(b"")
    with locked(store.writer_lock_path(KEY), "compile"):
        assert store.warm_check(KEY, recheck_missed=True).problem == BEING_WRITTEN
        checks, _ = store.check_and_quarantine([KEY], strict=False)
        assert checks == [] and store.entry_path(KEY).exists()
    assert store.warm_check(KEY).problem == "empty file (a torn or interrupted write)"


def test_the_manifest_records_every_run_that_uses_a_key(tmp_path: Path) -> None:
    store = a_cache(tmp_path)
    first = recorded(store, run="a")
    store.uses_entries([first], "b")
    manifest = store.manifest()
    assert [e.key for e in manifest.for_run("b")] == [KEY]
    assert manifest[KEY].run == "a" and manifest[KEY].runs == ["b"]
    store.record_entries([first])  # a rewrite by run a (after a quarantine) keeps b
    assert store.manifest()[KEY].runs == ["b"]


def test_a_manifest_without_runs_still_reads(tmp_path: Path) -> None:
    store = a_cache(tmp_path)
    recorded(store, run="a")
    data = json.loads(store.manifest_file.read_text())
    del data["entries"][KEY]["runs"]  # as an older jaxwarm wrote it
    store.manifest_file.write_text(json.dumps(data))
    manifest = store.manifest()
    assert manifest[KEY].runs == [] and manifest.for_run("a")[0].key == KEY

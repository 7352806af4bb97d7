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
from jaxwarm.store.entries import entry_path, writer_lock_path
from jaxwarm.store.integrity import (
    BEING_WRITTEN,
    IntegrityCheck,
    check_and_quarantine,
    missed_since_check,
    quarantine,
    record_check,
    warm_check,
)
from jaxwarm.store.manifest import (
    ManifestEntry,
    latest_for_run,
    manifest_path,
    read_manifest,
    record_entries,
    uses_entries,
)
from jaxwarm.store.usage import append_usage
from tests.conftest import DEMO

KEY = "jit_train_step-" + hashlib.sha256(b"step").hexdigest()


def payload() -> bytes:
    return zlib.compress(bytes(4) + bytes(range(256)) * 8)


def recorded(cache: Path, run: str = "other") -> ManifestEntry:
    data = payload()
    entry = ManifestEntry(function="jit_train_step", key=KEY, run=run, config="c.yaml",
                          compile_s=1.0, lower_s=0.1, written=True, jax_version="0.10.2",
                          process_count=1, sha256=hashlib.sha256(data).hexdigest(),
                          size=len(data))
    entry_path(cache, KEY).write_bytes(data)
    record_entries(cache, [entry])
    return entry


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: the quick check cannot see it
    path.write_bytes(bytes(data))


def test_a_missed_same_size_flip_is_found_by_the_next_prewarm_check(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    recorded(cache)
    flip_a_byte(entry_path(cache, KEY))
    assert warm_check(str(cache), KEY).warm  # WARM by size
    assert not missed_since_check(cache, KEY)
    append_usage(cache, EntryMissed(KEY, "train-run"))  # what the training job records
    assert missed_since_check(cache, KEY)
    quick = warm_check(str(cache), KEY)  # verify stays quick, and says why
    assert quick.warm and quick.missed and not quick.read_in_full
    check = warm_check(str(cache), KEY, recheck_missed=True)  # the prewarm's check
    assert check.read_in_full  # here zlib's own checksum fails; else the recorded sha256
    assert check.problem is not None
    quarantine(cache, IntegrityCheck(KEY, 0, check.problem, checksum_known=True))
    assert not entry_path(cache, KEY).exists() and not missed_since_check(cache, KEY)


def test_an_intact_missed_entry_is_checked_once_and_trusted_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    recorded(cache)
    append_usage(cache, EntryMissed(KEY, "train-run"))
    usage = (cache / "jaxwarm-usage.jsonl").read_bytes()
    check = warm_check(str(cache), KEY, recheck_missed=True)
    assert check.warm and check.read_in_full and check.missed
    assert (cache / "jaxwarm-usage.jsonl").read_bytes() == usage  # the check wrote nothing
    record_check(cache, check)  # the prewarm records it
    assert not missed_since_check(cache, KEY)
    again = warm_check(str(cache), KEY, recheck_missed=True)
    assert again.warm and not again.read_in_full  # the quick check again
    assert entry_path(cache, KEY).exists()


def test_a_training_miss_on_a_present_entry_is_recorded(tmp_path: Path) -> None:
    from jaxwarm.job.start.books import note_missed_entries
    from jaxwarm.store.store import LocalStore
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    recorded(cache)
    old = time.time() - 60
    os.utime(entry_path(cache, KEY), (old, old))
    config = load_config(DEMO, [f"cache.dir={cache}", f"run.out_dir={tmp_path}"])
    report = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                        cache_dir=str(cache), init_budget_s=1.0,
                        functions=[FunctionRecord(name="jit_train_step", key=KEY, hit=False),
                                   FunctionRecord(name="jit_init", key=KEY.replace(
                                       "train_step", "init"), hit=False)])
    store = LocalStore(str(cache))
    note_missed_entries(config, store, store, report, since=time.time())
    assert missed_since_check(cache, KEY)
    lines = (cache / "jaxwarm-usage.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["event"] == "missed"  # only the present one


def test_an_entry_being_written_is_never_quarantined(tmp_path: Path) -> None:
    """Prewarm A holds KEY's writer lock while JAX writes it (0 bytes so far)."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / "jaxwarm-locks").mkdir(mode=0o700)
    entry_path(cache, KEY).write_bytes(b"")
    with locked(writer_lock_path(cache, KEY), "compile"):
        assert warm_check(str(cache), KEY, recheck_missed=True).problem == BEING_WRITTEN
        checks, _ = check_and_quarantine(cache, [KEY], strict=False)
        assert checks == [] and entry_path(cache, KEY).exists()
    assert warm_check(str(cache), KEY).problem == "empty file (a torn or interrupted write)"


def test_the_manifest_records_every_run_that_uses_a_key(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    first = recorded(cache, run="a")
    uses_entries(cache, [first], "b")
    manifest = read_manifest(cache)
    assert [e.key for e in latest_for_run(manifest, "b")] == [KEY]
    assert manifest[KEY].run == "a" and manifest[KEY].runs == ["b"]
    record_entries(cache, [first])  # a rewrite by run a (after a quarantine) keeps b
    assert read_manifest(cache)[KEY].runs == ["b"]


def test_a_manifest_without_runs_still_reads(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    recorded(cache, run="a")
    data = json.loads(manifest_path(cache).read_text())
    del data["entries"][KEY]["runs"]  # as an older jaxwarm wrote it
    manifest_path(cache).write_text(json.dumps(data))
    manifest = read_manifest(cache)
    assert manifest[KEY].runs == [] and latest_for_run(manifest, "a")[0].key == KEY

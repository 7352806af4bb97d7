"""Entry integrity (jaxwarm/store/integrity.py): the quick and the full check, quarantine, and
integrity that repairs itself (class 4 of issue 17). A same-size bit flip in an entry
another run recorded passes the quick (size) check; once a training job misses it, the miss
is in the usage log, `verify` says "WARM by size, but a previous run missed it", and the
next prewarm's warm check reads it in full, so it is quarantined and compiled again. The
check itself writes nothing (verify's); recording a full check is the prewarm's. An entry
whose writer lock is held is being written: left alone by every check. `cache verify`
quarantines an entry damaged the ways disks and interrupted writes do, and reads a zlib bomb
in blocks (class 1 of issue 17). Real files; no JAX."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from jaxwarm.core.files import locked
from jaxwarm.core.records import EntryMissed
from jaxwarm.store.entries import MIN_PAYLOAD_CAP
from jaxwarm.store.integrity import BEING_WRITTEN, IntegrityCheck
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore
from tests.conftest import REPO, Cli
from tests.hostile import entry_bytes, key, zlib_bomb
from tests.test_store_commands import corrupt

pytestmark = pytest.mark.hostile


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


def test_cache_verify_quarantines_an_entry_flipped_truncated_or_zeroed(tmp_path: Path,
                                                                      cli: Cli) -> None:
    """The flipped bit (recompressed: the stream stays valid) comes first, while the
    entry's record holds its checksum, which alone can tell; a truncated or zeroed entry,
    back unrecorded after a quarantine, fails the full read. (A real prewarm's entries go
    through the same in tests/test_store_commands.py's torn-entry story.)"""
    store = a_cache(tmp_path)
    recorded(store)
    entry = store.entry_path(KEY)
    intact = entry.read_bytes()
    for how in ("flipped", "truncated", "zeroed"):
        if not entry.exists():
            entry.write_bytes(intact)
        corrupt(entry, how)
        found = cli("cache", "verify", str(store.path))
        assert found.returncode == 1, found.stdout + found.stderr
        assert f"QUARANTINED {KEY}" in found.stdout
        assert not entry.exists()
    # Three quarantines of one key, within a second or not: each kept under its own name.
    assert store.quarantined() == 3


def test_the_digest_of_a_streamed_check_is_the_file_digest(tmp_path: Path) -> None:
    """The full check hashes what it decompresses: a recorded checksum still catches a flip."""
    store = LocalStore(tmp_path)
    store.entry_path(key(1)).write_bytes(entry_bytes(1))
    good_sum = hashlib.sha256(entry_bytes(1)).hexdigest()
    assert store.entry_problem(key(1), good_sum) is None
    assert "sha256 differs" in store.entry_problem(key(1), "0" * 64)


def verify_under_ulimit(cache: Path, kib: int) -> subprocess.CompletedProcess[str]:
    command = f'ulimit -v {kib} && exec "$0" -m jaxwarm cache verify "$1"'
    return subprocess.run(["bash", "-c", command, sys.executable, str(cache)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_verify_quarantines_a_zlib_bomb_and_reads_entries_in_blocks(tmp_path: Path) -> None:
    """Under a 1 GB address-space limit (less than the 4 GiB + 1 one read used to ask for,
    and than the bomb's payload), verify still checks every entry and names the bomb."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    store = LocalStore(cache)
    store.entry_path(key(1)).write_bytes(entry_bytes(1))
    store.entry_path(key(7)).write_bytes(zlib_bomb())
    result = verify_under_ulimit(cache, 1_000_000)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "jaxwarm bug" not in result.stderr
    assert f"QUARANTINED {key(7)}: decompresses to more than {MIN_PAYLOAD_CAP} bytes" \
        in result.stdout
    assert "2 entries checked" in result.stdout and "1 intact, 1 quarantined" in result.stdout
    assert store.entry_path(key(1)).read_bytes() == entry_bytes(1)
    assert not store.entry_path(key(7)).exists()

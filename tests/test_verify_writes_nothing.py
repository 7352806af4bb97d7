"""`jaxwarm verify` writes nothing into the cache dir: the warm decision it shares with the
prewarm (`jaxwarm.job.warm`) only reads, and what its checks find is repaired by the next
prewarm. Checked on a warm cache holding the two entries that call for a repair: an intact
entry no manifest or usage line records (verify reads it in full) and an entry a job missed
(verify says so), with two processes (process 0's decision reaches the other without a
collective, which would be compiled into the cache). Every path, its bytes, mode and mtime
are compared before and after."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from jaxwarm.core.jsonio import dumps
from jaxwarm.core.records import EntryMissed
from jaxwarm.core.rundir import report_path
from jaxwarm.store.store import LocalStore
from tests.conftest import ranks_layout, run_cli
from tests.test_store_commands import job_args

pytestmark = pytest.mark.e2e


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root` (itself included): kind, mode, mtime, and a file's bytes or a
    link's target."""
    found = {}
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        content: bytes | str | None = None
        if stat.S_ISREG(info.st_mode):
            content = path.read_bytes()
        elif stat.S_ISLNK(info.st_mode):
            content = os.readlink(path)
        found[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode),
                                              stat.S_IMODE(info.st_mode), info.st_mtime_ns,
                                              content)
    return found


def keys(cache: Path) -> dict[str, str]:
    return {entry.function: entry.key for entry in LocalStore(cache).scan(histories={})}


def test_verify_leaves_the_cache_dir_as_it_found_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = job_args(tmp_path, cache, *ranks_layout(2, 1, 2))
    prewarmed = run_cli("prewarm", *args)
    assert prewarmed.returncode == 0, prewarmed.stderr[-3000:]
    step, init = keys(cache)["jit_train_step"], keys(cache)["jit_init_state"]

    # init_state's entry, intact, recorded nowhere (its prewarm killed before the record);
    # train_step's, missed by a training job since its last check.
    store = LocalStore(cache)
    manifest = json.loads(store.manifest_file.read_text())
    del manifest["entries"][init]
    store.manifest_file.write_text(json.dumps(manifest))
    lines = [line for line in store.usage_file.read_text().splitlines() if init not in line]
    store.usage_file.write_text("".join(f"{line}\n" for line in
                                        [*lines, dumps(EntryMissed(step, "an-earlier-run"))]))
    assert init not in store.manifest() and store.warm_check(step).missed

    before = snapshot(cache)
    verified = run_cli("verify", *args)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
    assert f"WARM  jit_init_state  {init}" in verified.stdout  # read in full: intact
    assert f"WARM  jit_train_step  {step}" in verified.stdout
    assert "WARM by size, but a previous run missed it" in verified.stdout
    assert snapshot(cache) == before
    for process in (0, 1):  # nothing compiled, nothing looked up, on either process
        report = json.loads(report_path(tmp_path / "runs" / "demo", "verify", 0,
                                        process).read_text())
        assert (report["lookups"], report["functions"]) == (0, []), report

    # A same-size bit flip in the recorded entry: the cache check before the job reads it
    # in full and finds it; verify says COLD and still moves nothing.
    entry = store.entry_path(step)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0x01
    entry.write_bytes(bytes(data))
    before = snapshot(cache)
    flipped = run_cli("verify", *args)
    assert flipped.returncode == 1, flipped.stdout + flipped.stderr[-3000:]
    assert f"COLD  jit_train_step  {step}" in flipped.stdout
    assert "its entry is in the cache but corrupt" in flipped.stdout
    assert "left for the next prewarm or launch to quarantine" in flipped.stderr
    assert snapshot(cache) == before

    # The next prewarm repairs: it quarantines the corrupt entry and compiles it again, and
    # pins the unrecorded one.
    again = run_cli("prewarm", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "compiling train_step" in again.stderr and "1 quarantined" in again.stderr
    manifest = store.manifest()
    assert init in manifest and store.entry_problem(step, manifest[step].sha256) is None

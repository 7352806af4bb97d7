"""The cache store end to end: concurrent writers, restarts, torn and corrupt entries,
odd files under an entry's name, and pruning (file times from the future, entries in
flight, a size cap while JAX writes), with real jaxwarm jobs and real JAX processes on real
files, and the `jaxwarm cache` commands. (Bundles: tests/test_bundle.py; the cache dir's
safety: tests/test_security.py.)"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from jaxwarm.core.files import locked
from jaxwarm.core.rundir import report_path
from jaxwarm.jaxkey.entryformat import ATIME_SUFFIX, CACHE_SUFFIX, ZSTD_MAGIC, encode_atime
from jaxwarm.store.store import LocalStore
from testing.jaxproc import jax_env
from tests.conftest import DEMO, FAST_CHUNKWISE, FAST_STEP, Cli, run_cli
from tests.hostile import key, snapshot, write_entry
from tests.test_jsonio import guarded

pytestmark = pytest.mark.e2e

# One process x 2 devices and conftest's FAST_STEP (the small step, every compile cached):
# what is checked is what the store does with the entries, not the step they hold; each job
# takes seconds, so the tests can run many of them.
LAYOUT = ("topology.processes_per_node=1", "topology.devices_per_process=2",
          "mesh.axes={data: 1, fsdp: 2}", "train.steps=2", "train.checkpoint_every=0")
TINY = (*LAYOUT, *FAST_STEP)
# How often the concurrent writers' reader reads the manifest and lists the cache.
READ_EVERY_S = 0.05


def config_args(tmp_path: Path, cache: Path, *extra: str, run: str = "demo") -> list[str]:
    """CONFIG and overrides: what `jaxwarm cache` commands take."""
    return [str(DEMO), f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={cache}",
            f"run.name={run}", *extra]


def job_args(tmp_path: Path, cache: Path, *extra: str, run: str = "demo") -> list[str]:
    return [*config_args(tmp_path, cache, *extra, run=run), "--local"]


def init_report(tmp_path: Path, run: str = "demo", job: str = "train") -> dict:
    return json.loads(report_path(tmp_path / "runs" / run, job, 0, 0).read_text())


def step_record(report: dict) -> dict:
    return [f for f in report["functions"] if f["name"] == "jit_train_step"][-1]


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def corrupt(path: Path, how: str) -> None:
    """Damage an entry the ways disks and interrupted writes do."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif how == "zeroed":
        path.write_bytes(bytes(len(data)))
    elif how == "flipped":
        # One bit inside the executable, recompressed: the stream stays valid, so only the
        # recorded checksum can tell (JAX would load it and may die of SIGILL).
        if data.startswith(ZSTD_MAGIC):
            import zstandard
            payload = bytearray(zstandard.ZstdDecompressor().decompress(data))
            payload[len(payload) // 2] ^= 1
            path.write_bytes(zstandard.ZstdCompressor().compress(bytes(payload)))
        else:
            payload = bytearray(zlib.decompress(data))
            payload[len(payload) // 2] ^= 1
            path.write_bytes(zlib.compress(bytes(payload)))


def test_concurrent_prewarm_writers_with_readers_lose_nothing(tmp_path: Path, cli: Cli) -> None:
    cache = tmp_path / "cache"
    # Two prewarm the same step, a third another one (d_ff differs), all at once. Each race
    # needs no more: the same-step pair takes turns on one compile, and two writers of new
    # entries (the pair's compiling one, the third) record them in the manifest at once;
    # more writers add JAX processes. The tiny chunkwise step: the small step compiles in
    # less time than a prewarm takes to start, and the second of the pair found its entry
    # written before it looked up, compiling nothing.
    variants = ["step.args.d_ff=128"] * 2 + ["step.args.d_ff=64"]
    stop, seen, errors = threading.Event(), {"manifest_reads": 0, "ls": 0}, []
    store = LocalStore(cache)

    def reader() -> None:
        # The manifest and `cache ls` (in this process) read every READ_EVERY_S while the
        # writers run: many reads during each write, without a tight loop taking a core.
        while not stop.wait(READ_EVERY_S):
            try:
                store.manifest()  # raises on a torn manifest
                seen["manifest_reads"] += 1
            except ValueError as exc:
                errors.append(str(exc))
            listed = cli("cache", "ls", str(cache))
            if listed.returncode != 0:
                errors.append(listed.stderr)
            seen["ls"] += 1

    cache.mkdir(mode=0o700)
    reading = threading.Thread(target=reader, daemon=True)
    reading.start()
    writers = [subprocess.Popen(
        [sys.executable, "-m", "jaxwarm", "prewarm",
         *job_args(tmp_path, cache, *LAYOUT, *FAST_CHUNKWISE, variant, run=f"w{i}")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i, variant in enumerate(variants)]
    outputs = [w.communicate(timeout=600)[0] for w in writers]
    stop.set()
    reading.join(timeout=600)
    assert all(w.returncode == 0 for w in writers), outputs
    assert not errors and seen["manifest_reads"] > 0 and seen["ls"] > 0

    reports = [init_report(tmp_path, f"w{i}", "prewarm") for i in range(len(variants))]
    keys = {step_record(r)["key"] for r in reports}
    assert len(keys) == 2  # one shared step, a different one
    # The same-step writers took turns: one compiled and wrote, the other loaded its entry.
    shared = [step_record(r) for r in reports[:2]]
    assert sorted(f["hit"] for f in shared) == [False, True]
    manifest = store.manifest()
    for report in reports:
        for function in report["functions"]:
            assert store.has_entry(function["key"])
            if not function["hit"]:
                assert manifest[function["key"]].sha256
    checked = cli("cache", "verify", str(cache))
    assert_ok(checked)
    assert "0 quarantined" in checked.stdout
    assert all(store.entry_problem(e.key, manifest[e.key].sha256) is None
               for e in store.scan(histories={}))
    # The contended entry loads in a real run.
    run = run_cli("launch", *job_args(tmp_path, cache, *LAYOUT, *FAST_CHUNKWISE, variants[0],
                                      "--no-prewarm", run="w0"))
    assert_ok(run)
    assert step_record(init_report(tmp_path, "w0"))["hit"]


def test_relaunches_in_a_row_hit_and_corrupt_nothing(tmp_path: Path, cli: Cli) -> None:
    """A cold launch and two relaunches: the second relaunch is the first to start from
    what a hit left in the cache (its usage record) and the first to drop a checkpoint
    (orbax keeps two); a later relaunch would meet the same state again."""
    cache = tmp_path / "cache"
    hits = []
    for attempt in range(3):
        # Each relaunch resumes from the last checkpoint and trains two more steps.
        result = run_cli("launch", *job_args(tmp_path, cache, *TINY, "--no-prewarm",
                                             f"train.steps={2 * (attempt + 1)}",
                                             "train.checkpoint_every=2"))
        assert_ok(result)
        hits.append(step_record(init_report(tmp_path))["hit"])
        assert_ok(cli("cache", "verify", str(cache)))
    assert hits == [False, True, True]
    assert not LocalStore(cache).quarantine_dir.exists()


def entries_by_function(cache: Path) -> dict[str, str]:
    """The key of each entry in `cache`, by function."""
    return {entry.function: entry.key for entry in LocalStore(cache).scan(histories={})}


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


@pytest.mark.hostile
def test_torn_and_corrupt_entries_are_cold_quarantined_and_rewritten(tmp_path: Path,
                                                                     cli: Cli) -> None:
    """A torn entry is never WARM: verify, the pre-run check and the prewarm's own warm check
    all go through `integrity.warm_problem`; a torn or corrupt entry is quarantined (by the
    prewarm, `cache verify` or the launch's own check) and compiled afresh by the next
    prewarm or run. (`cache verify` on each kind of damage: tests/test_integrity.py.)"""
    cache = tmp_path / "cache"
    first = run_cli("prewarm", *job_args(tmp_path, cache, *TINY))
    assert first.returncode == 0, output(first)[-3000:]
    store = LocalStore(cache)
    key = entries_by_function(cache)["jit_train_step"]
    step = store.entry_path(key)

    # Recorded entry, torn (a kill -9 mid-write): the quick size check catches it.
    truncate(step)
    verdict = run_cli("verify", *job_args(tmp_path, cache, *TINY), "--no-check-cache")
    assert verdict.returncode == 1, output(verdict)[-3000:]
    assert "COLD  jit_train_step" in verdict.stdout and "(torn)" in verdict.stdout
    assert "WARM  jit_init_state" in verdict.stdout
    again = run_cli("prewarm", *job_args(tmp_path, cache, *TINY), "--no-check-cache")
    assert again.returncode == 0, output(again)[-3000:]
    assert "COLD  train_step" in output(again) and "WARM  init_state" in output(again)
    assert store.entry_problem(key, store.manifest()[key].sha256) is None

    # Unrecorded entry, torn: nobody knows its size, so it gets the full check.
    store.manifest_file.write_text(json.dumps({"version": 1, "entries": {}}))
    store.usage_file.unlink()
    init = entries_by_function(cache)["jit_init_state"]
    truncate(store.entry_path(init))
    third = run_cli("prewarm", *job_args(tmp_path, cache, *TINY))
    assert third.returncode == 0, output(third)[-3000:]
    assert "COLD  init_state" in output(third) and "does not decompress" in output(third)
    assert store.entry_problem(init) is None
    assert store.quarantined() == 2

    # One bit flipped inside the executable, recompressed: only the checksum the third
    # prewarm recorded (it pinned the intact step entry) can tell. The launch's own check
    # catches it before the job starts, and the run recompiles it and records it.
    corrupt(step, "flipped")
    run = run_cli("launch", *job_args(tmp_path, cache, *TINY, "--no-prewarm"))
    assert_ok(run)
    assert f"quarantined {key}" in run.stderr
    assert "cache check:" in run.stderr
    assert not step_record(init_report(tmp_path))["hit"]
    assert step.is_file()  # rewritten, and recorded, by the run that recompiled
    assert_ok(cli("cache", "verify", str(cache)))
    # Flipped again, without a launch: `cache verify` quarantines it, by the checksum the
    # run recorded.
    corrupt(step, "flipped")
    found = cli("cache", "verify", str(cache))
    assert found.returncode == 1, found.stdout + found.stderr
    assert f"QUARANTINED {key}" in found.stdout
    assert not step.exists()
    assert len(list(store.quarantine_dir.glob(f"{key}-cache.*[0-9]"))) >= 1


# Writes entries of distinct keys: COUNT of them, or (given a STOP file) until it appears;
# prints each one's number once it is written.
WRITER = """
import pathlib, sys
import jax, jax.numpy as jnp
count, stop = int(sys.argv[1]), pathlib.Path(sys.argv[2]) if sys.argv[2:] else None
for i in range(count):
    if stop is not None and stop.exists():
        break
    jax.jit(lambda x: jnp.tanh(x @ x.T) * (i + 1)).lower(jnp.ones((i + 8, 32))).compile()
    print(i + 1, flush=True)
"""


def next_write(writer: subprocess.Popen[str]) -> None:
    """Wait until the WRITER has written one more entry (or fail with what it said)."""
    said = []
    while line := writer.stdout.readline() if writer.stdout else "":
        if line.strip().isdigit():
            return
        said.append(line)
    raise AssertionError(f"the writer stopped: {''.join(said)[-3000:]}")


def writer_env(cache: Path, max_size: int) -> dict[str, str]:
    return {**jax_env(1), "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(max_size)}


def test_prune_under_a_size_cap_while_jax_writes_leaves_no_torn_entry(tmp_path: Path,
                                                                      cli: Cli) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    # Entries from an uncapped writer have no atime files: a capped JAX writer would crash
    # on them, unless the launcher adds them first (it does before every job).
    subprocess.run([sys.executable, "-c", WRITER, "4"], env=writer_env(cache, -1), check=True,
                   capture_output=True, timeout=300)
    assert not list(cache.glob(f"*{ATIME_SUFFIX}"))
    # Room for the prewarm's own entries (a smaller cap is a FAILED prewarm: JAX would
    # evict them, tests/test_prewarm.py); the writer below fills it beyond that.
    cap = 512 * 1024
    capped = (*TINY, f"cache.max_size={cap}")
    assert_ok(run_cli("prewarm", *job_args(tmp_path, cache, *capped)))
    assert len(list(cache.glob(f"*{ATIME_SUFFIX}"))) == len(list(cache.glob(f"*{CACHE_SUFFIX}")))

    # Four prunes, each after one more write, while the writer goes on writing until told.
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, "1000", str(stop)],
                              env=writer_env(cache, cap), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    for _ in range(4):
        next_write(writer)
        assert_ok(cli("cache", "prune", str(cache), "--max-size", "64K", "--include-pinned"))
    stop.touch()
    output = writer.communicate(timeout=300)[0]
    assert writer.returncode == 0, output[-3000:]
    entries = {p.name[:-len(CACHE_SUFFIX)] for p in cache.glob(f"*{CACHE_SUFFIX}")}
    atimes = {p.name[:-len(ATIME_SUFFIX)] for p in cache.glob(f"*{ATIME_SUFFIX}")}
    assert entries == atimes  # nothing half-deleted
    store = LocalStore(cache)
    assert all(store.entry_problem(e.key) is None for e in store.scan(histories={}))  # not torn
    assert_ok(cli("cache", "prune", str(cache), "--max-size", "64K", "--include-pinned"))
    assert sum(e.size for e in store.scan(histories={})) <= 64 * 1024


def odd_key(c: str) -> str:
    """A valid JAX key whose digest is the hex digit `c` repeated."""
    return f"jit_{c}-{c * 64}"


def odd_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    store = LocalStore(cache)
    store.entry_path(odd_key("a")).mkdir()  # a directory
    os.mkfifo(store.entry_path(odd_key("b")))  # would block a plain read forever
    store.entry_path(odd_key("c")).symlink_to("/dev/zero")  # would be read until MemoryError
    (cache / "x-cache").mkdir()  # not even named like an entry
    store.entry_path(odd_key("d")).write_bytes(zlib.compress(bytes(4) + b"x" * 100))
    return cache


@pytest.mark.hostile
def test_odd_files_are_skipped_with_a_line_and_left_alone(
        tmp_path: Path, cli: Cli, caplog: pytest.LogCaptureFixture) -> None:
    """The commands run in this process, `guarded` (tests/test_jsonio.py): one that blocked on
    the FIFO or read /dev/zero fails the test instead of hanging it or taking the memory."""
    cache = odd_cache(tmp_path)
    store = LocalStore(cache)
    before = snapshot(cache)
    for command in (["ls"], ["stats"], ["verify"], ["prune", "--max-size", "100G"]):
        caplog.clear()
        with caplog.at_level(logging.WARNING):  # the skip lines a user reads on stderr
            result = guarded(lambda command=command: cli("cache", command[0], str(cache),
                                                         *command[1:]))
        assert result.returncode == 0, (command, result.stderr)
        assert "Traceback" not in result.stderr + caplog.text
        for c, kind in (("a", "a directory"), ("b", "a FIFO"), ("c", "a symlink")):
            entry = store.entry_path(odd_key(c))
            assert f"skipping {entry}: {kind}, not a JAX entry" in caplog.text
        assert "x-cache" not in result.stderr + result.stdout + caplog.text
    verified = guarded(lambda: cli("cache", "verify", str(cache)))
    assert "1 entries checked" in verified.stdout and "1 intact" in verified.stdout
    after = snapshot(cache)
    assert {k: v for k, v in after.items() if not k.startswith("jaxwarm-")} == before


@pytest.mark.hostile
def test_cache_verify_touches_only_files_named_like_entries(tmp_path: Path, cli: Cli) -> None:
    cache = tmp_path / "cache"
    named = "jit_f-" + "b" * 64
    cache.mkdir(mode=0o700)
    (cache / "build-cache").write_text("not an entry\n")
    (cache / "notes-cache").write_bytes(b"garbage")
    LocalStore(cache).entry_path(named).write_bytes(b"torn")
    result = cli("cache", "verify", str(cache))
    assert result.returncode == 1, result.stderr
    assert f"QUARANTINED {named}" in result.stdout
    assert (cache / "build-cache").read_text() == "not an entry\n"
    assert (cache / "notes-cache").read_bytes() == b"garbage"


HOUR = 3600.0


@pytest.mark.hostile
def test_future_times_neither_protect_an_entry_from_older_than_nor_from_lru(
        tmp_path: Path, cli: Cli) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    now = time.time()
    future = write_entry(cache, 1, now + 10 * 365 * 86400)
    hour_old = write_entry(cache, 2, now - HOUR)
    fresh = write_entry(cache, 3, now)
    crafted = write_entry(cache, 4, now - HOUR)  # its atime file claims a use in 2100
    LocalStore(cache).atime_path(key(4)).write_bytes(encode_atime(int(4.1e18)))
    result = cli("cache", "prune", str(cache), "--older-than", "30m")
    assert result.returncode == 0, result.stderr
    assert "pruned 3 entries" in result.stdout
    assert fresh.exists() and not future.exists() and not hour_old.exists()
    assert not crafted.exists()
    future = write_entry(cache, 1, now + 10 * 365 * 86400)
    result = cli("cache", "prune", str(cache), "--max-size", str(fresh.stat().st_size))
    assert result.returncode == 0, result.stderr
    assert fresh.exists() and not future.exists()


@pytest.mark.hostile
def test_prune_never_removes_an_entry_in_flight(tmp_path: Path, cli: Cli) -> None:
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
            pruned = cli("cache", "prune", str(cache), "--max-size", "1", *extra)
            assert pruned.returncode == 0, pruned.stderr
            assert "pruned 0 entries" in pruned.stdout
            assert entry.is_file()
    pruned = cli("cache", "prune", str(cache), "--max-size", "1")
    assert "pruned 1 entry" in pruned.stdout and not entry.exists()

"""The cache store end to end: concurrent writers, restarts, corruption, unsafe dirs,
bundles and pruning, with real jaxwarm jobs and real JAX processes on real files."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import zlib
from pathlib import Path

import pytest

from bench.common import LEGACY_CPU_FUSION
from jaxwarm.core.config import load_config
from jaxwarm.core.rundir import report_path
from jaxwarm.jaxkey.entryformat import ATIME_SUFFIX, CACHE_SUFFIX, ZSTD_MAGIC
from jaxwarm.store.store import LocalStore
from jaxwarm.submit.prepare import pin_config
from testing.jaxproc import jax_env
from tests.conftest import DEMO, Cli, run_cli, with_xla_flag

pytestmark = pytest.mark.e2e

# One process x 2 devices and a one-layer step, compiled with XLA's older CPU fusion emitter
# (as conftest's FAST_STEP is): each job takes seconds, so the tests can run many of them.
# min_compile_time 0 so that JAX writes every compile.
TINY = ("topology.processes_per_node=1", "topology.devices_per_process=2",
        "mesh.axes={data: 1, fsdp: 2}", "step.args.n_layers=1", "cache.min_compile_time_secs=0",
        with_xla_flag(LEGACY_CPU_FUSION), "train.steps=2", "train.checkpoint_every=0")


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


def test_concurrent_prewarm_writers_with_readers_lose_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Two prewarm the same step, two each a different one (d_ff differs), all at once. Each
    # race needs no more: the same-step pair takes turns on one compile, and three writers
    # of new entries record them in the manifest at once; more writers add JAX processes.
    variants = ["step.args.d_ff=128"] * 2 + [f"step.args.d_ff={64 + 16 * i}" for i in range(2)]
    stop, seen, errors = threading.Event(), {"manifest_reads": 0, "ls": 0}, []
    store = LocalStore(cache)

    def reader() -> None:
        while not stop.is_set():
            try:
                store.manifest()  # raises on a torn manifest
                seen["manifest_reads"] += 1
            except ValueError as exc:
                errors.append(str(exc))
            listed = run_cli("cache", "ls", str(cache))
            if listed.returncode != 0:
                errors.append(listed.stderr)
            seen["ls"] += 1

    cache.mkdir(mode=0o700)
    reading = threading.Thread(target=reader, daemon=True)
    reading.start()
    writers = [subprocess.Popen(
        [sys.executable, "-m", "jaxwarm", "prewarm",
         *job_args(tmp_path, cache, *TINY, variant, run=f"w{i}")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i, variant in enumerate(variants)]
    outputs = [w.communicate(timeout=600)[0] for w in writers]
    stop.set()
    reading.join(timeout=600)
    assert all(w.returncode == 0 for w in writers), outputs
    assert not errors and seen["manifest_reads"] > 0 and seen["ls"] > 0

    reports = [init_report(tmp_path, f"w{i}", "prewarm") for i in range(len(variants))]
    keys = {step_record(r)["key"] for r in reports}
    assert len(keys) == 3  # one shared step, two different ones
    # The same-step writers took turns: one compiled and wrote, the other loaded its entry.
    shared = [step_record(r) for r in reports[:2]]
    assert sorted(f["hit"] for f in shared) == [False, True]
    manifest = store.manifest()
    for report in reports:
        for function in report["functions"]:
            assert store.has_entry(function["key"])
            if not function["hit"]:
                assert manifest[function["key"]].sha256
    checked = run_cli("cache", "verify", str(cache))
    assert_ok(checked)
    assert "0 quarantined" in checked.stdout
    assert all(store.entry_problem(e.key, manifest[e.key].sha256) is None
               for e in store.scan(histories={}))
    # The contended entry loads in a real run.
    run = run_cli("launch", *job_args(tmp_path, cache, *TINY, variants[0], "--no-prewarm",
                                      run="w0"))
    assert_ok(run)
    assert step_record(init_report(tmp_path, "w0"))["hit"]


def test_relaunches_in_a_row_hit_and_corrupt_nothing(tmp_path: Path) -> None:
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
        assert_ok(run_cli("cache", "verify", str(cache)))
    assert hits == [False, True, True]
    assert not LocalStore(cache).quarantine_dir.exists()


def test_corrupt_entries_are_quarantined_and_the_next_run_rewrites_them(
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert_ok(run_cli("prewarm", *job_args(tmp_path, cache, *TINY)))
    key = step_record(init_report(tmp_path, job="prewarm"))["key"]
    store = LocalStore(cache)
    entry = store.entry_path(key)
    intact = entry.read_bytes()
    # A quarantine leaves the same state whatever the damage (the entry moved aside, its
    # record void), so one run after the last shows what the next run after any of them
    # does. Before that the intact bytes go back, unrecorded like a copied-in entry: the
    # flipped bit, which only the recorded checksum can tell, comes first, while the
    # prewarm's record holds; a truncated or zeroed entry fails the full read either way.
    for how in ("flipped", "truncated", "zeroed"):
        if not entry.exists():
            entry.write_bytes(intact)
        corrupt(entry, how)
        found = run_cli("cache", "verify", str(cache))
        assert found.returncode == 1, found.stdout + found.stderr
        assert f"QUARANTINED {key}" in found.stdout
        assert not entry.exists()
    assert len(list(store.quarantine_dir.glob(f"{key}-cache.*[0-9]"))) >= 1
    run = run_cli("launch", *job_args(tmp_path, cache, *TINY, "--no-prewarm", run="after"))
    assert_ok(run)
    assert not step_record(init_report(tmp_path, "after"))["hit"]
    assert entry.is_file()  # rewritten, and recorded, by the run that recompiled
    assert_ok(run_cli("cache", "verify", str(cache)))
    # Without `cache verify`, the launch's own check catches it before the job starts.
    corrupt(entry, "flipped")
    run = run_cli("launch", *job_args(tmp_path, cache, *TINY, "--no-prewarm"))
    assert_ok(run)
    assert f"quarantined {key}" in run.stderr
    assert "cache check:" in run.stderr


def test_unsafe_cache_dirs_are_refused_before_anything_runs(tmp_path: Path, cli: Cli) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    refused = cli("launch", *job_args(tmp_path, shared, *TINY))
    assert refused.returncode == 2
    line, = refused.stderr.strip().splitlines()
    assert "cache.dir" in line and "writable by every user" in line and str(DEMO) in line
    assert not (tmp_path / "runs" / "demo" / "reports").exists()
    if os.geteuid() != 0:
        foreign = Path("/usr")  # owned by root, not by this user
    else:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o770)
        os.chown(foreign, 65534, 0)
    refused = cli("launch", *job_args(tmp_path, foreign, *TINY))
    assert refused.returncode == 2
    assert "not by you" in refused.stderr and "cache.trusted_group" in refused.stderr
    if os.geteuid() == 0:
        # Shared on purpose: another member owns it, the config trusts its group.
        trusted = cli("render", *config_args(tmp_path, foreign, *TINY, "cache.trusted_group=root"),
                      "--job", "train")
        assert_ok(trusted)
    new = tmp_path / "new-cache"
    pin_config(load_config(DEMO, config_args(tmp_path, new, *TINY)[1:]))
    assert new.stat().st_mode & 0o777 == 0o700


def test_bundle_round_trip_into_an_empty_cache_then_hit(tmp_path: Path) -> None:
    portable = ("cache.xla_caches=none",)
    source, target = tmp_path / "source-cache", tmp_path / "target-cache"
    assert_ok(run_cli("prewarm", *job_args(tmp_path, source, *TINY, *portable)))
    bundle = tmp_path / "demo-bundle.tar"
    exported = run_cli("cache", "export", *config_args(tmp_path, source, *TINY, *portable),
                       "-o", str(bundle))
    assert_ok(exported)
    assert "exported 2 entries" in exported.stdout and "portable" in exported.stdout
    elsewhere = config_args(tmp_path, target, *TINY, *portable, run="elsewhere")
    imported = run_cli("cache", "import", str(bundle), *elsewhere)
    assert_ok(imported)
    assert "imported 2 entries" in imported.stdout
    run = run_cli("launch", *elsewhere, "--local", "--no-prewarm")
    assert_ok(run)
    assert step_record(init_report(tmp_path, "elsewhere"))["hit"]
    # The imported entries keep their checksums: `cache verify` checks them.
    checked = run_cli("cache", "verify", str(target))
    assert_ok(checked)
    assert "against a recorded checksum" in checked.stdout

    # A bundle whose keys hold its cache path cannot hit anywhere else: refused.
    pinned_to_path = tmp_path / "path-bound.tar"
    assert_ok(run_cli("prewarm", *job_args(tmp_path, source, *TINY, run="bound")))
    assert_ok(run_cli("cache", "export", *config_args(tmp_path, source, *TINY, run="bound"),
                      "-o", str(pinned_to_path)))
    third = config_args(tmp_path, tmp_path / "third", *TINY)
    refused = run_cli("cache", "import", str(pinned_to_path), *third)
    assert refused.returncode == 2 and "include the cache path" in refused.stderr

    # Another jax version: refused, and nothing is added.
    other_version = tmp_path / "other-jax.tar"
    with tarfile.open(bundle) as tar, tarfile.open(other_version, "w") as out:
        for member in tar.getmembers():
            data = tar.extractfile(member).read()
            if member.name == "jaxwarm-bundle.json":
                meta = json.loads(data)
                meta["jax_version"] = "0.0.1"
                data = json.dumps(meta).encode()
                member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    empty = tmp_path / "empty-cache"
    refused = run_cli("cache", "import", str(other_version),
                      *config_args(tmp_path, empty, *TINY, *portable))
    assert refused.returncode == 2 and "jax 0.0.1" in refused.stderr
    assert not list(empty.glob(f"*{CACHE_SUFFIX}"))


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


def test_prune_under_a_size_cap_while_jax_writes_leaves_no_torn_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    # Entries from an uncapped writer have no atime files: a capped JAX writer would crash
    # on them, unless the launcher adds them first (it does before every job).
    subprocess.run([sys.executable, "-c", WRITER, "4"], env=writer_env(cache, -1), check=True,
                   capture_output=True, timeout=300)
    assert not list(cache.glob(f"*{ATIME_SUFFIX}"))
    # Room for the prewarm's own entries (a smaller cap is a FAILED prewarm: JAX would
    # evict them, tests/test_hostile_clamp.py); the writer below fills it beyond that.
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
        assert_ok(run_cli("cache", "prune", str(cache), "--max-size", "64K", "--include-pinned"))
    stop.touch()
    output = writer.communicate(timeout=300)[0]
    assert writer.returncode == 0, output[-3000:]
    entries = {p.name[:-len(CACHE_SUFFIX)] for p in cache.glob(f"*{CACHE_SUFFIX}")}
    atimes = {p.name[:-len(ATIME_SUFFIX)] for p in cache.glob(f"*{ATIME_SUFFIX}")}
    assert entries == atimes  # nothing half-deleted
    store = LocalStore(cache)
    assert all(store.entry_problem(e.key) is None for e in store.scan(histories={}))  # not torn
    assert_ok(run_cli("cache", "prune", str(cache), "--max-size", "64K", "--include-pinned"))
    assert sum(e.size for e in store.scan(histories={})) <= 64 * 1024

"""Node-local staging (`cache.stage`): the run's entries copied to a node's own disk, checked
by checksum, read there by JAX, and what the job writes published back.

The pure tests use real files and no JAX: what a node copies, reuses and replaces, that a
torn or wrong copy never lands, publishing, the wait for a node's stager and every fallback
to the shared dir (one line each). The e2e tests run the demo: a staged training job hits
the entry an unstaged prewarm wrote (the key does not change), a bad local copy is replaced
(these two check the jobs of one module fixture), and an entry a staged job compiles
reaches the shared dir recorded, where a node that cannot stage reads and hits it.
tests/test_jax_versions.py runs the staged hit on every tested jax.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import resource
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import locked
from jaxwarm.core.jsonio import dumps
from jaxwarm.core.records import Staging
from jaxwarm.core.rundir import report_path, stage_note_path, stage_notes_dir
from jaxwarm.jaxkey.versions import staging_problem
from jaxwarm.job.stage import node_cache_dir, stage_node, wait_for_note
from jaxwarm.job.start.place import Place
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore
from jaxwarm.submit.jobs import train_job
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, Cli, run_cli

STEP = "jit_train_step-" + hashlib.sha256(b"step").hexdigest()
INIT = "jit_init_state-" + hashlib.sha256(b"init").hexdigest()


def payload(seed: bytes) -> bytes:
    return zlib.compress(bytes(4) + seed * 2000)


def prewarmed(cache: LocalStore, run: str = "demo", seed: bytes = b"") -> dict[str, bytes]:
    """Two entries in `cache` as a prewarm of `run` records them (manifest, checksums)."""
    cache.path.mkdir(mode=0o700, exist_ok=True)
    entries = {}
    for key in (STEP, INIT):
        data = zlib.compress(bytes(4) + seed + key.encode() * 2000, 0 if seed else 6)
        cache.entry_path(key).write_bytes(data)
        entries[key] = data
        cache.record_entries([ManifestEntry(
            function=key.rsplit("-", 1)[0], key=key, run=run, config="c.yaml", compile_s=1.0,
            lower_s=0.1, written=True, jax_version="0.10.2", process_count=1,
            sha256=hashlib.sha256(data).hexdigest(), size=len(data))])
    return entries


def config_for(tmp: Path, *overrides: str):  # noqa: ANN201 (a Config)
    return load_config(DEMO, [f"cache.dir={tmp / 'cache'}", f"run.out_dir={tmp / 'runs'}",
                              f"cache.stage={tmp / 'stage'}", *overrides])


def place(local_rank: int, node: int = 0) -> Place:
    return Place(process_id=local_rank, num_processes=2, restart=0, coordinator=None,
                 slurm_job_id="77", node=node, local_rank=local_rank, job_id="77")


# -- the config and the key rule ------------------------------------------------------------

@pytest.mark.parametrize(("value", "problem"), [
    ("stage-here", "expected an absolute path"),
    ("{cache}/sub", "is inside cache.dir"),
])
def test_a_stage_dir_that_cannot_work_is_refused(tmp_path: Path, value: str,
                                                 problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(DEMO, [f"cache.dir={tmp_path / 'cache'}",
                           f"cache.stage={value.format(cache=tmp_path / 'cache')}"])
    assert "cache.stage: " in str(refused.value) and problem in str(refused.value)
    with pytest.raises(ConfigError, match="cache.stage: staging copies from a local"):
        load_config(DEMO, ["cache.dir=s3://bucket/cache", "cache.stage=/local/stage"])
    assert load_config(DEMO, ["cache.stage=$TMPDIR/jaxwarm"]).cache.stage == "$TMPDIR/jaxwarm"


def test_staging_is_refused_where_the_path_enters_the_key(tmp_path: Path) -> None:
    """Before jax 0.11 XLA's autotune dir (in the cache dir) is hashed into every key."""
    cache = config_for(tmp_path).cache
    problem = staging_problem(cache, "0.10.2", "c.yaml")
    assert problem is not None and problem.startswith("c.yaml: cache.stage: on jax 0.10.2")
    assert "cache.xla_caches: none" in problem and "\n" not in problem
    assert staging_problem(cache, "0.8.3", "c.yaml") is not None
    assert staging_problem(cache, "0.11.2", "c.yaml") is None
    assert staging_problem(cache, "0.12.0.1", "c.yaml") is None
    off = config_for(tmp_path, "cache.xla_caches=none").cache
    assert staging_problem(off, "0.8.3", "c.yaml") is None
    assert staging_problem(config_for(tmp_path, "cache.stage=null").cache, "0.8.3", "c") is None


def test_the_launcher_refuses_a_training_job_that_would_miss(tmp_path: Path) -> None:
    """On this venv's jax (0.10.2) the default XLA caches put the path in the key."""
    config = config_for(tmp_path)
    with pytest.raises(ConfigError, match="cache.stage: on jax 0.10.2"):
        train_job(config, tmp_path / "config.yaml")
    assert train_job(config_for(tmp_path, "cache.xla_caches=none"), tmp_path / "c.yaml")


def test_place_names_the_node_and_the_local_rank() -> None:
    slurm = Place.here({"SLURM_PROCID": "13", "SLURM_NTASKS": "64", "SLURM_NODEID": "1",
                        "SLURM_LOCALID": "5", "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "2"})
    assert (slurm.node, slurm.local_rank, slurm.attempt) == (1, 5, "42-r2")
    local = Place.here({"JAXWARM_COORDINATOR_ADDRESS": "127.0.0.1:1", "JAXWARM_PROCESS_ID": "3",
                        "JAXWARM_NUM_PROCESSES": "8", "JAXWARM_JOB_ID": "local-abc"})
    assert (local.node, local.local_rank, local.attempt) == (0, 3, "local-abc-r0")
    assert Place.here({}).local_rank == 0  # a lone process stages for itself


# -- what a node copies -------------------------------------------------------------------

def test_a_node_copies_verifies_and_reuses(tmp_path: Path) -> None:
    shared, local = LocalStore(tmp_path / "cache"), LocalStore(tmp_path / "stage")
    entries = prewarmed(shared)
    local.path.mkdir(mode=0o700)
    first = shared.stage_into(local.dir, "demo")
    assert sorted(first.copied) == sorted(entries) and not first.reused
    assert first.bytes_copied == sum(map(len, entries.values()))
    for key, data in entries.items():
        assert local.entry_path(key).read_bytes() == data
        # a staged copy keeps the shared entry's time: it is not an entry the job wrote
        assert local.entry_path(key).stat().st_mtime == shared.entry_path(key).stat().st_mtime
    second = shared.stage_into(local.dir, "demo")
    assert sorted(second.reused) == sorted(entries) and second.bytes_copied == 0
    assert not shared.stage_into(local.dir, "another-run").copied  # not its entries


def test_a_partial_or_corrupt_local_copy_is_replaced(tmp_path: Path) -> None:
    shared, local = LocalStore(tmp_path / "cache"), LocalStore(tmp_path / "stage")
    entries = prewarmed(shared)
    local.path.mkdir(mode=0o700)
    local.entry_path(STEP).write_bytes(entries[STEP][:100])  # partial
    flipped = bytearray(entries[INIT])
    flipped[len(flipped) // 2] ^= 1  # corrupt, same size
    local.entry_path(INIT).write_bytes(bytes(flipped))
    staged = shared.stage_into(local.dir, "demo")
    assert sorted(staged.replaced) == sorted(entries) and not staged.reused
    for key, data in entries.items():
        assert local.entry_path(key).read_bytes() == data


def test_a_wrong_or_missing_shared_entry_is_never_staged(tmp_path: Path) -> None:
    shared, local = LocalStore(tmp_path / "cache"), LocalStore(tmp_path / "stage")
    entries = prewarmed(shared)
    local.path.mkdir(mode=0o700)
    flipped = bytearray(entries[STEP])
    flipped[len(flipped) // 2] ^= 1
    shared.entry_path(STEP).write_bytes(bytes(flipped))
    shared.entry_path(INIT).unlink()
    staged = shared.stage_into(local.dir, "demo")
    assert "sha256 differs" in staged.skipped[STEP]
    assert staged.skipped[INIT] == "not in the shared cache dir"
    assert not list(local.path.iterdir()), "no entry and no temp file may be left"


def test_a_copy_that_fails_leaves_no_torn_file(tmp_path: Path) -> None:
    """A full disk, as the writer sees it (writes past 64 KiB fail with EFBIG; Python
    ignores SIGXFSZ): staging raises, and the stage dir holds no entry and no temp file."""
    shared, local = LocalStore(tmp_path / "cache"), LocalStore(tmp_path / "stage")
    prewarmed(shared, seed=os.urandom(100_000))  # incompressible: about 200 KB per entry
    local.path.mkdir(mode=0o700)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(OSError, match="File too large"):
            shared.stage_into(local.dir, "demo")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not list(local.path.iterdir())


# -- publishing what the job wrote ------------------------------------------------------------

def test_entries_the_job_wrote_are_published_never_over_another(tmp_path: Path) -> None:
    shared, local = LocalStore(tmp_path / "cache"), LocalStore(tmp_path / "stage")
    shared.path.mkdir(mode=0o700)
    local.path.mkdir(mode=0o700)
    since = time.time() - 1
    old = payload(b"staged earlier")
    local.entry_path(INIT).write_bytes(old)
    os.utime(local.entry_path(INIT), (since - 100, since - 100))  # a staged copy
    new = payload(b"compiled by the job")
    local.entry_path(STEP).write_bytes(new)
    published = shared.publish_from(local.dir, since)
    assert published == {STEP: (hashlib.sha256(new).hexdigest(), len(new))}
    assert shared.entry_path(STEP).read_bytes() == new
    assert not shared.entry_path(INIT).exists()
    # Another writer's entry under the key stays; a prewarm holding the key's writer lock
    # is left to write it.
    theirs = payload(b"another writer")
    shared.entry_path(STEP).write_bytes(theirs)
    other = "jit_eval-" + hashlib.sha256(b"eval").hexdigest()
    local.entry_path(other).write_bytes(payload(b"eval"))
    shared.writer_lock_path(other).parent.mkdir(exist_ok=True)
    with locked(shared.writer_lock_path(other), "compile"):
        assert shared.publish_from(local.dir, since) == {}
    assert shared.entry_path(STEP).read_bytes() == theirs
    assert not shared.entry_path(other).exists()


# -- the node's protocol, and every fallback ---------------------------------------------------

def test_the_stager_writes_the_note_the_others_read(tmp_path: Path) -> None:
    config = config_for(tmp_path, "cache.xla_caches=none")
    prewarmed(LocalStore(tmp_path / "cache"))
    stager = node_cache_dir(config, place(0))
    assert stager.dir == str(tmp_path / "stage") and stager.stager and len(stager.copied) == 2
    note = stage_note_path(config.run_dir, "77-r0", 0)
    assert json.loads(note.read_text())["dir"] == str(tmp_path / "stage")
    waiter = node_cache_dir(config, place(1))
    assert waiter.dir == stager.dir and not waiter.stager and waiter.fallback is None


def test_a_note_that_never_comes_falls_back_with_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = config_for(tmp_path, "cache.xla_caches=none", "cache.stage_wait_s=0.3")
    with caplog.at_level(logging.WARNING, "jaxwarm.stage"):
        staging = node_cache_dir(config, place(1, node=3))
    assert staging.dir == config.cache.dir and staging.waited_s >= 0.3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith("jaxwarm: node 3: the node's first process wrote no note")
    assert "0.3 s (cache.stage_wait_s)" in lines[0] and config.cache.dir in lines[0]


def test_an_unreadable_note_falls_back(tmp_path: Path) -> None:
    config = config_for(tmp_path, "cache.xla_caches=none")
    note = stage_note_path(config.run_dir, "77-r0", 0)
    note.parent.mkdir(parents=True)
    note.write_text(dumps({"node": "zero"}))
    staging = wait_for_note(config, note, 0)
    assert staging.dir == config.cache.dir and "cannot be read" in str(staging.fallback)


@pytest.mark.parametrize("bad", ["file", "unset-variable", "empty-variable", "world-writable"])
def test_a_node_that_cannot_stage_reads_the_shared_dir(
        tmp_path: Path, bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stage = tmp_path / "stage"
    value = str(stage)
    if bad == "file":
        stage.write_text("not a directory")
    elif bad == "unset-variable":
        value = "$JAXWARM_TEST_UNSET_VARIABLE/stage"
        monkeypatch.delenv("JAXWARM_TEST_UNSET_VARIABLE", raising=False)
    elif bad == "empty-variable":  # set but empty: never `/jaxwarm-test-stage` in the root
        value = "${JAXWARM_TEST_EMPTY_VARIABLE}/jaxwarm-test-stage"
        monkeypatch.setenv("JAXWARM_TEST_EMPTY_VARIABLE", "")
    else:
        stage.mkdir()
        stage.chmod(0o777)
    config = config_for(tmp_path, "cache.xla_caches=none", f"cache.stage={value}")
    prewarmed(LocalStore(tmp_path / "cache"))
    staging = stage_node(config, 0)
    assert staging.dir == config.cache.dir and staging.stager
    assert staging.fallback is not None and "\n" not in staging.fallback
    if bad.endswith("-variable"):
        assert staging.fallback == (f"cache.stage {value!r}: "
                                    f"${value.split('/')[0].strip('${}')} is unset or empty "
                                    f"on this node")
        assert not Path("/jaxwarm-test-stage").exists()
    if bad == "world-writable":
        assert "writable by every user" in staging.fallback
        assert not list(stage.iterdir()), "nothing may be staged into an unsafe dir"


def test_a_stage_record_reads_back(tmp_path: Path) -> None:
    from jaxwarm.core.jsonio import from_json, parse_json
    record = Staging(node=2, dir="/local", stager=True, copied=[STEP], bytes_copied=10)
    assert from_json(Staging, parse_json(dumps(record), "x"), "x") == record


# -- end to end: the demo, staged ----------------------------------------------------------------

# The demo on conftest's FAST_STEP: what is checked is where entries are copied, loaded and
# published, not the step they hold.
def launch(tmp: Path, *overrides: str, runs: str = "runs") -> str:
    result = run_cli("launch", str(DEMO), "--local", f"run.out_dir={tmp / runs}",
                     f"cache.dir={tmp / 'cache'}", "train.steps=1", "cache.xla_caches=none",
                     *FAST_STEP, *overrides, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def train_report(tmp: Path, process: int, run: str = "demo", runs: str = "runs") -> dict:
    return json.loads(report_path(tmp / runs / run, "train", 0, process).read_text())


# The demo's prewarmed functions. A test asks that they hit, not that nothing else does: a
# small function the trainer compiles (jit_slice) is stored too when its compile passed
# JAX's minimum compile time, which a loaded machine decides, and hits in the next launch.
PREWARMED = {"jit_train_step", "jit_init_state"}


def hits(report: dict) -> set[str]:
    return {fn["name"] for fn in report["functions"] if fn["hit"]}


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One unstaged prewarm of the demo (2 processes), then two training jobs staged from
    it, each in a fresh run dir (no checkpoint to resume): into an empty stage dir (run dir
    `runs`, the prewarm's), and into that dir again after its copy of `cut` was cut short
    (`again`). Each job's output by run dir, and the node's copies as the first job left
    them. A stage dir that cannot be made: the second run of
    test_what_a_staged_job_compiles_is_published_and_recorded."""
    tmp = tmp_path_factory.mktemp("staged")
    prewarm = run_cli("prewarm", str(DEMO), "--local", f"run.out_dir={tmp / 'runs'}",
                      f"cache.dir={tmp / 'cache'}", "cache.xla_caches=none", *FAST_STEP,
                      timeout=900)
    assert prewarm.returncode == 0, prewarm.stderr[-3000:]
    stage = tmp / "stage"
    runs = {"runs": launch(tmp, "--no-prewarm", f"cache.stage={stage}")}
    copied = train_report(tmp, 0)["stage"]["copied"]
    node = LocalStore(stage)
    copies = {key: node.entry_path(key).read_bytes() for key in copied}
    cut = next(key for key in copied if key.startswith("jit_train_step-"))
    node.entry_path(cut).write_bytes(node.entry_path(cut).read_bytes()[:1000])
    runs["again"] = launch(tmp, "--no-prewarm", f"cache.stage={stage}", runs="again")
    return {"tmp": tmp, "out": runs, "copies": copies, "cut": cut}


@pytest.mark.e2e
def test_a_staged_run_hits_what_an_unstaged_prewarm_wrote(staged: dict[str, Any]) -> None:
    """Prewarm unstaged, then train staged: process 0 loads both targets from its node's
    copy, which is byte for byte the prewarmed entry; process 1 waited for that copy. The
    next start of the run on the node copies nothing it holds intact."""
    tmp, stage = staged["tmp"], staged["tmp"] / "stage"
    first, second = train_report(tmp, 0), train_report(tmp, 1)
    assert PREWARMED <= hits(first), first["functions"]
    assert first["cache_dir"] == str(stage) and first["stage"]["stager"]
    assert len(first["stage"]["copied"]) == 2 and first["stage"]["fallback"] is None
    assert second["cache_dir"] == str(stage) and not second["stage"]["stager"]
    assert staged["copies"] == {key: LocalStore(tmp / "cache").entry_path(key).read_bytes()
                                for key in first["stage"]["copied"]}
    out = staged["out"]["runs"]
    assert "jit_train_step: HIT on process 0" in out
    assert "staging: 1 node(s) loaded the run's entries from their own copy" in out
    again = train_report(tmp, 0, runs="again")
    assert again["stage"]["reused"] == [key for key in first["stage"]["copied"]
                                        if key != staged["cut"]]
    assert not again["stage"]["copied"]
    assert PREWARMED <= hits(again)


@pytest.mark.e2e
def test_a_bad_local_copy_is_replaced(staged: dict[str, Any]) -> None:
    """A truncated local copy is replaced by a verified one (HIT from the stage dir): never
    a wrong or torn entry, never a miss."""
    tmp = staged["tmp"]
    report = train_report(tmp, 0, runs="again")
    assert report["stage"]["replaced"] == [staged["cut"]]
    assert report["cache_dir"] == str(tmp / "stage") and PREWARMED <= hits(report)
    assert staged["out"]["again"].count(
        "was partial or corrupt; replaced it with a verified copy") == 1


@pytest.mark.e2e
def test_what_a_staged_job_compiles_is_published_and_recorded(tmp_path: Path, cli: Cli) -> None:
    """No prewarm, empty cache: process 0 compiles into its node's copy, and the entries
    reach the shared dir with their checksums in the usage log. Then a run whose stage dir
    cannot be made: the node reads the shared dir, said in one line, and hits them there
    (never a wrong or torn entry, never a miss). One process: what it compiles is what the
    node publishes."""
    stage = tmp_path / "stage"
    launch(tmp_path, "--no-prewarm", f"cache.stage={stage}", *ONE_PROCESS)
    written = {fn["key"]: fn["sha256"] for fn in train_report(tmp_path, 0)["functions"]
               if fn["sha256"]}
    assert {key.rsplit("-", 1)[0] for key in written} >= {"jit_train_step", "jit_init_state"}
    shared = LocalStore(tmp_path / "cache")
    recorded = shared.recorded()
    for key, sha256 in written.items():
        assert hashlib.sha256(shared.entry_path(key).read_bytes()).hexdigest() \
            == sha256 == recorded[key].sha256
    assert any(getattr(record, "job", None) == "train" for record in shared.usage())
    verify = cli("cache", "verify", str(tmp_path / "cache"))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    out = launch(tmp_path, "--no-prewarm", "run.name=blocked", f"cache.stage={blocked}",
                 *ONE_PROCESS)
    report = train_report(tmp_path, 0, "blocked")
    assert report["cache_dir"] == str(tmp_path / "cache") and PREWARMED <= hits(report)
    fallback = [line for line in out.splitlines() if "reading the shared cache dir" in line]
    assert len(fallback) == 1 and f"staging into {blocked} failed" in fallback[0], out[-3000:]
    assert "staging: node 0 read the shared cache dir: staging into" in out


@pytest.mark.slurm(lane=2)
@pytest.mark.e2e
def test_under_slurm_one_process_per_node_stages(tmp_path: Path) -> None:
    """2 nodes x 2 processes: SLURM_LOCALID 0 of each node copies, its neighbour waits for
    that copy, and every process's JAX reads its own node's dir (a dir per node name, as the
    dev cluster's nodes share one disk)."""
    from tests.slurm_cluster import ensure_cluster
    ensure_cluster()
    args = [str(DEMO), "--slurm", "--wait", f"cache.dir={tmp_path / 'cache'}",
            "cache.xla_caches=none", "train.steps=1", "topology.nodes=2",
            "topology.processes_per_node=2", "topology.devices_per_process=2", *FAST_STEP]
    prewarm = run_cli("prewarm", *args, f"run.out_dir={tmp_path / 'prewarm'}", timeout=900)
    assert prewarm.returncode == 0, prewarm.stderr[-3000:]
    stage = tmp_path / "stage"
    result = run_cli("launch", *args, "--no-prewarm", f"run.out_dir={tmp_path / 'runs'}",
                     f"cache.stage={stage}/$SLURMD_NODENAME", timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    reports = [train_report(tmp_path, process) for process in range(4)]
    by_node: dict[int, list[dict]] = {}
    for report in reports:
        by_node.setdefault(report["stage"]["node"], []).append(report["stage"])
    assert sorted(by_node) == [0, 1]
    for stages in by_node.values():
        assert sorted(s["stager"] for s in stages) == [False, True], stages
        assert len({s["dir"] for s in stages}) == 1 and stages[0]["dir"].startswith(str(stage))
        assert all(s["fallback"] is None for s in stages)
    assert len({stages[0]["dir"] for stages in by_node.values()}) == 2  # a dir per node
    assert PREWARMED <= hits(reports[0])
    notes = sorted(p.name for p in stage_notes_dir(tmp_path / "runs" / "demo").iterdir())
    assert [name.rsplit("-", 1)[1] for name in notes] == ["n0.json", "n1.json"]

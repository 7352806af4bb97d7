"""`cache.prefetch`: the demo's training job loads its prewarmed executables ahead of the
trainer's lookups.

One launch per jax prewarms a cache (its prewarm records what loading each entry takes);
each test then launches training on a copy of it, as a user would, and reads the init
report: which executables were prefetched, and what became of each. The key a lookup uses
is always JAX's own, from the trainer's lowering; what is checked is that a prefetched
executable is used only under its key with the options it was loaded with, and that
everything else (nothing recorded, prefetch off, a cap, a key never asked for) leaves the
trainer's start as it is.

What depends on the jax version runs on the oldest and the newest supported jax (the legs)
and the main venv's: how an entry is read, deserialized and handed to JAX's lookup under its
key (a plain run, whose launch two tests share), and how a prefetched key that is not handed
over goes down JAX's own lookup (the cap). The rest is jaxwarm's own logic, the same on any
jax (what it compares, records, reports or refuses), and runs on the main venv only
(`MAIN_ONLY`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.core.records import NOT_LOADED, OVER_CAP, TRAIN, UNUSED, USED
from jaxwarm.core.rundir import report_path
from jaxwarm.jaxkey.entryload import Asked, LoadSpec
from jaxwarm.job.prefetch import NO_IDLE_CORE, SAMPLE_MAX_S, SAMPLE_S, Prefetch, sample_intervals
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore
from testing.legs import LEGS, leg_python, ready
from tests.conftest import DEMO, ONE_PROCESS, REPO, TINY_CACHED, legacy_fusion, with_xla_flag
from tests.hostile import snapshot
from tests.planting_factory import PLANT, PLANTED

pytestmark = pytest.mark.e2e

# The main venv's jax, and the oldest and newest supported (legs). The main venv's comes
# first: a test on it alone (MAIN_ONLY) gets the same prewarmed cache and the same xdist
# group as the others on it, which conftest names by the parameter's index.
PYTHONS = {"main": None, f"jax-{LEGS[0].jax}": LEGS[0], f"jax-{LEGS[-1].jax}": LEGS[-1]}
MAIN_ONLY = pytest.mark.parametrize("prewarmed", ["main"], indirect=True)


@dataclass(frozen=True)
class Prewarmed:
    python: Path
    root: Path
    cache: Path
    flags: tuple[str, ...]  # the XLA flags it compiles under besides the demo's (`demo`)

    @cached_property
    def trained(self) -> dict[str, Any]:
        """A plain run's report (`launch` on a copy of the cache, nothing changed), launched
        once for the tests that read what it prefetched."""
        return self.launch(self.root / "trained")

    def launch(self, tmp: Path, *overrides: str, cache: Path | None = None) -> dict[str, Any]:
        """Train the demo (one step) on `cache` (a copy of the prewarmed one by default);
        process 0's init report."""
        if cache is None:
            cache = tmp / "cache"
            shutil.copytree(self.cache, cache)
        runs = tmp / "runs"
        result = cli(self.python, "launch", *demo(runs, cache, self.flags), "--no-prewarm",
                     *overrides)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        report: dict[str, Any] = json.loads(report_path(runs / "demo", TRAIN, 0, 0).read_text())
        report["headline"], report["log"] = result.stdout, result.stderr
        return report


def cli(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JAXWARM_ALLOW_UNTESTED_JAX"}
    env["PATH"] = os.pathsep.join([str(python.parent), env.get("PATH", "")])
    return subprocess.run([str(python), "-m", "jaxwarm", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def demo(runs: Path, cache: Path, flags: tuple[str, ...]) -> list[str]:
    """The demo, one step, on `cache`, under the XLA flags `flags` besides its own; XLA's
    caches off, so that the cache dir's path is in no key on any jax (each test trains on
    its own copy of the prewarmed cache). The prefetch loads whether a core is idle or not
    (`true`): `auto` waits for an idle core, which a machine busy with other tests may never
    have."""
    return [str(DEMO), "--local", f"run.out_dir={runs}", f"cache.dir={cache}",
            "cache.xla_caches=none", "train.steps=1", "cache.prefetch=true", *TINY_CACHED,
            with_xla_flag(*flags), *ONE_PROCESS]


@pytest.fixture(scope="module", params=list(PYTHONS))
def prewarmed(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Prewarmed:
    leg = PYTHONS[request.param]
    python, jax = Path(sys.executable), version("jax")
    if leg is not None:
        found, why = leg_python(leg)
        if found is None:
            pytest.skip(why)
        assert ready(leg), f"{leg.venv} is missing or stale: run `make legs`"
        python, jax = leg.python, leg.jax
    root = tmp_path_factory.mktemp(f"prefetch-{request.param}")
    done = Prewarmed(python, root, root / "cache", legacy_fusion(jax))
    result = cli(python, "prewarm", *demo(root / "runs", done.cache, done.flags))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return done


def manifest(cache: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(LocalStore(cache).manifest_file.read_text())
    return data


def recorded(cache: Path) -> dict[str, tuple[str | None, list[int]]]:
    """What the manifest records for prefetch, by key: compile options and device ids."""
    return {key: (e.get("compile_options"), e.get("device_ids"))
            for key, e in manifest(cache)["entries"].items()}


def outcomes(report: dict[str, Any]) -> dict[str, str]:
    assert report["prefetch"] is not None, "nothing was prefetched"
    return {p["function"]: p["outcome"] for p in report["prefetch"]["executables"]}


def hits(report: dict[str, Any]) -> dict[str, bool]:
    return {f["name"]: f["hit"] for f in report["functions"]
            if f["name"] in ("jit_train_step", "jit_init_state")}


def test_prefetched_executables_are_used_under_their_keys(prewarmed: Prewarmed) -> None:
    entries = manifest(prewarmed.cache)["entries"]
    assert all(e["compile_options"] and e["device_ids"] for e in entries.values())
    report = prewarmed.trained
    assert outcomes(report) == {"jit_train_step": USED, "jit_init_state": USED}
    assert hits(report) == {"jit_train_step": True, "jit_init_state": True}
    used = {p["key"] for p in report["prefetch"]["executables"]}
    assert used == {f["key"] for f in report["functions"] if f["name"] in hits(report)}
    assert 0 < report["prefetch"]["peak_bytes"] <= report["prefetch"]["max_size"]
    assert "prefetch (process 0" in report["headline"]


@MAIN_ONLY
def test_a_planted_mismatch_takes_jaxs_path_and_is_reported(prewarmed: Prewarmed,
                                                            tmp_path: Path) -> None:
    """The manifest says the step was compiled for its devices in another order: the
    executable loaded that way is not handed over; JAX loads the entry itself (a hit)."""
    cache = tmp_path / "cache"
    shutil.copytree(prewarmed.cache, cache)
    data = manifest(cache)
    for entry in data["entries"].values():
        if entry["function"] == "jit_train_step":
            entry["device_ids"] = entry["device_ids"][::-1]
    LocalStore(cache).manifest_file.write_text(json.dumps(data))
    report = prewarmed.launch(tmp_path, cache=cache)
    found = outcomes(report)
    assert found["jit_train_step"].startswith("not used: the trainer's call runs on devices"), \
        found
    assert found["jit_init_state"] == USED
    assert hits(report) == {"jit_train_step": True, "jit_init_state": True}
    assert "jit_train_step not used: " in report["headline"]


@MAIN_ONLY
def test_prefetch_off_changes_nothing(prewarmed: Prewarmed, tmp_path: Path) -> None:
    report = prewarmed.launch(tmp_path, "cache.prefetch=off")
    assert report["prefetch"] is None
    assert hits(report) == {"jit_train_step": True, "jit_init_state": True}
    assert "prefetch (" not in report["headline"]


def test_the_memory_cap_is_respected(prewarmed: Prewarmed, tmp_path: Path) -> None:
    """A cap under the two executables together (their sizes from the plain run): the
    step, first in load order, is admitted, and the init function, which would pass the cap
    beside it, is not loaded (the trainer's lookup loads it JAX's usual way, a hit).
    Admission follows the sizes and the load order alone, so this is the outcome however
    the loads and lookups interleave."""
    cap = max(p["size"] for p in prewarmed.trained["prefetch"]["executables"]) + 1
    report = prewarmed.launch(tmp_path, f"cache.prefetch_max_size={cap}")
    assert outcomes(report) == {"jit_train_step": USED, "jit_init_state": OVER_CAP}
    assert 0 < report["prefetch"]["peak_bytes"] <= cap
    assert hits(report) == {"jit_train_step": True, "jit_init_state": True}


@MAIN_ONLY
def test_a_function_never_asked_for_is_named_and_released(prewarmed: Prewarmed,
                                                          tmp_path: Path) -> None:
    """The trainer runs under an XLA flag its prewarm did not have: its keys are others,
    the prewarmed executables are never asked for, and the report names them."""
    report = prewarmed.launch(tmp_path, with_xla_flag(*prewarmed.flags,
                                                      "--xla_cpu_enable_fast_math=true"))
    assert outcomes(report) == {"jit_train_step": UNUSED, "jit_init_state": UNUSED}
    assert hits(report) == {"jit_train_step": False, "jit_init_state": False}
    assert "not asked for by the first step, released" in report["headline"]


@MAIN_ONLY
def test_an_entry_recorded_before_prefetch_gets_what_loading_takes_at_the_next_prewarm(
        prewarmed: Prewarmed, tmp_path: Path) -> None:
    """A manifest written before `cache.prefetch` (no compile options): nothing to prefetch
    with, as for a run whose prewarm recorded nothing (an empty cache is every cold
    launch's): the run starts as without prefetch, JAX's lookups hit; the next prewarm
    finds the entries WARM, compiles nothing, and records them: what a prewarm that
    compiled them recorded, with which the plain run (`Prewarmed.trained`) uses both."""
    cache = tmp_path / "cache"
    shutil.copytree(prewarmed.cache, cache)
    data = manifest(cache)
    for entry in data["entries"].values():
        entry.pop("compile_options")
        entry.pop("device_ids")
    LocalStore(cache).manifest_file.write_text(json.dumps(data))
    before = prewarmed.launch(tmp_path / "before", cache=cache)
    assert before["prefetch"] is None and before["time_to_first_step_s"] is not None
    assert hits(before) == {"jit_train_step": True, "jit_init_state": True}
    again = cli(prewarmed.python, "prewarm", *demo(tmp_path / "runs", cache, prewarmed.flags))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # Its row counts what it found WARM, which it never looked up (its hits column is 0).
    row = next(line for line in again.stdout.splitlines() if line.split()[:2] == ["prewarm",
                                                                                   "0"])
    assert row.endswith("0 compiled, 2 already WARM"), again.stdout
    # The same cache as the plain run's, whose launch would be this one's next launch.
    assert recorded(cache) == recorded(prewarmed.cache)
    assert all(options for options, _ in recorded(cache).values())


def a_prefetch(tmp_path: Path, wait_for_core: bool) -> Prefetch:
    """A prefetch of one entry that has no file (its load, once begun, fails)."""
    entry = ManifestEntry("jit_train_step", "k1", "run", "config", 1.0, 0.1, True, "0", 1,
                          compile_options="", device_ids=[0])
    return Prefetch([entry], LocalStore(tmp_path / "cache"), 1 << 30, 0.0,
                    wait_for_core=wait_for_core)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_only_the_deserializing_thread_runs_at_idle_priority(tmp_path: Path) -> None:
    """Right before XLA's deserialization (which releases the GIL) the loading thread
    lowers itself to SCHED_IDLE (per thread, as Linux sets it); the reader, which holds the
    GIL as it reads and decompresses, and the trainer's thread keep their policy (a thread
    at idle priority preempted while it holds the GIL stops the trainer's Python). Once
    the trainer waits for a load, a load that begins is not lowered."""
    prefetch = a_prefetch(tmp_path, wait_for_core=False)
    policies: list[int] = []

    def load() -> None:
        prefetch._lower()
        policies.append(os.sched_getscheduler(0))

    for waited in (False, True):
        prefetch._waited = waited
        thread = threading.Thread(target=load)
        thread.start()
        thread.join()
    assert policies == [os.SCHED_IDLE, os.sched_getscheduler(0)]
    assert os.sched_getscheduler(0) != os.SCHED_IDLE
    prefetch.start()
    prefetch.join()  # the entry has no file: its load fails, JAX's path stays the trainer's
    assert prefetch.report.executables[0].outcome.startswith(f"{NOT_LOADED}: ")
    assert not [t for t in threading.enumerate() if t.name.startswith("jaxwarm-prefetch")]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_on_a_busy_core_auto_loads_nothing_and_the_lookup_takes_jaxs_path(
        tmp_path: Path) -> None:
    """`cache.prefetch: auto` on a node with no idle core: the prefetch (its reader started
    by a thread that may run on one core only, which a busy process keeps busy) never
    begins a load, and the trainer's lookup, when it comes, takes JAX's own path; the
    report says why. The same prefetch with `true` begins the load at once."""
    core = min(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {core})  # this thread only: the reader inherits it
        prefetch = a_prefetch(tmp_path, wait_for_core=True)
        prefetch.start()
        os.sched_setaffinity(0, allowed)
        # Several samples of the busy core go by before the lookup (however many, none
        # finds it idle: the outcome does not depend on how long this is).
        time.sleep(2 * SAMPLE_S)
        asked = Asked("k1", LoadSpec("", (0,)), str(tmp_path / "cache"), False)
        assert prefetch.take(asked) is None
    finally:
        os.sched_setaffinity(0, allowed)
        busy.kill()
        busy.wait()
    prefetch.join()
    assert prefetch.report.executables[0].outcome == NO_IDLE_CORE
    assert prefetch.report.executables[0].load_s == 0.0


def test_sample_intervals_double_while_no_core_is_idle_up_to_their_cap() -> None:
    """A busy node wakes the prefetch's reader ever less often (each wake takes the GIL from
    the trainer), and a core gone idle waits at most SAMPLE_MAX_S for its load."""
    intervals = sample_intervals()
    assert [next(intervals) for _ in range(6)] == [SAMPLE_S, 2 * SAMPLE_S, 4 * SAMPLE_S,
                                                   SAMPLE_MAX_S, SAMPLE_MAX_S, SAMPLE_MAX_S]


@MAIN_ONLY
def test_entries_swapped_after_the_checks_are_not_read_by_jax(prewarmed: Prewarmed,
                                                             tmp_path: Path) -> None:
    """Right before JAX's own lookups (the step's factory plants them, after the launch's
    pre-run check), the step's entry becomes a link to /dev/zero (JAX would read it until the
    OOM killer came) and the state initializer's a FIFO (JAX's open would block for ever):
    each quarantined, its lookup a miss, the function compiled, the training done, one line
    each. The prefetch is off, so that JAX's own reads are the ones asked."""
    cache = tmp_path / "cache"
    shutil.copytree(prewarmed.cache, cache)
    outside = snapshot(REPO / "tests")
    report = prewarmed.launch(tmp_path, "cache.prefetch=off",
                              "step.factory=tests.planting_factory:make_train_step_and_plant",
                              f"env={{{PLANT}: 1}}", cache=cache)
    assert hits(report) == {"jit_train_step": False, "jit_init_state": False}
    assert report["time_to_first_step_s"] is not None  # and the launch ended well: trained
    quarantine = LocalStore(cache).quarantine_dir
    moved = {path.name.split("-")[0]: path for path in quarantine.iterdir()
             if not path.name.endswith(".json")}
    assert set(moved) == set(PLANTED), moved
    for function, plant in PLANTED.items():
        kind = "a symlink" if plant == "link" else "a FIFO"
        said = [line for line in report["log"].splitlines() if f"{function}-" in line
                and "JAX's lookup of it is a miss" in line]
        assert len(said) == 1, report["log"][-3000:]
        assert f"not a regular file ({kind}), put there since the job's checks; quarantined " \
               f"(moved to {quarantine}" in said[0]
        found = moved[function]
        assert found.is_symlink() if plant == "link" else stat.S_ISFIFO(found.lstat().st_mode)
        # The report says why it missed: its entry was quarantined, not pruned or deleted.
        assert f"its entry was quarantined (not a regular file ({kind})) before this job " \
               f"could load it" in report["headline"], report["headline"]
    assert snapshot(REPO / "tests") == outside


def test_the_cap_bounds_the_inflation_itself(tmp_path: Path) -> None:
    """An entry of 256 MiB inflated against a 16 MiB cap: the prefetch stops inflating at
    the cap (what it allocates stays near the cap, not the 256 MiB), loads nothing and holds
    nothing; the trainer's lookup takes JAX's path."""
    import tracemalloc

    key = f"jit_train_step-{'ab' * 32}"
    squeeze = zlib.compressobj(1)
    block = bytes(1 << 20)
    with LocalStore(tmp_path).entry_path(key).open("wb") as entry:
        for _ in range(256):
            entry.write(squeeze.compress(block))
        entry.write(squeeze.flush())
    cap = 16 << 20
    record = ManifestEntry(function="jit_train_step", key=key, run="r", config="c",
                           compile_s=1.0, lower_s=0.1, written=True, jax_version="0",
                           process_count=1, compile_options="", device_ids=[0])
    prefetch = Prefetch([record], LocalStore(tmp_path), cap, 0.0)
    [item] = prefetch._items.values()
    tracemalloc.start()
    try:
        assert prefetch._read(item) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * cap, peak
    assert item.record.outcome == OVER_CAP
    assert prefetch.report.peak_bytes <= cap and item.held == 0

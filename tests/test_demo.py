"""The demo end to end, as real processes: prewarm then train is a HIT on process 0;
on a clean cache without prewarm, a MISS. Read from the report files a user would read."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.common import LEGACY_CPU_FUSION
from jaxwarm.core.rundir import checkpoints_dir, earlier_reports_dir, logs_dir, report_path
from jaxwarm.store.store import LocalStore, open_store
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, Cli, run_cli, with_xla_flag

pytestmark = pytest.mark.e2e


def report(run_dir: Path, job: str, process: int, restart: int = 0) -> dict:
    return json.loads(report_path(run_dir, job, restart, process).read_text())


def function(report: dict, name: str) -> dict:
    matches = [fn for fn in report["functions"] if fn["name"] == name]
    assert matches, f"{name} not in {[fn['name'] for fn in report['functions']]}"
    return matches[-1]


def phases_of(report: dict) -> set[str]:
    return {phase["phase"] for phase in report["phases"] if phase["seconds"] > 0}


@dataclass(frozen=True)
class Launched:
    result: subprocess.CompletedProcess[str]
    run_dir: Path
    cache: Path


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """The demo launched once on a clean cache (prewarm, then train), which the first test
    checks and the others verify and launch against: what they need is a cache the demo was
    prewarmed into, and each prewarm of it costs two JAX processes. They write into the
    cache only what a training job adds (its entries and usage lines), which none of the
    checks on this launch reads."""
    root = tmp_path_factory.mktemp("launched")
    result = run_cli("launch", str(DEMO), "--local", f"run.out_dir={root / 'runs'}",
                     f"cache.dir={root / 'cache'}", "train.steps=2")
    return Launched(result, root / "runs" / "demo", root / "cache")


def test_prewarm_then_train_hits_on_process_0(launched: Launched, cli: Cli) -> None:
    result, run_dir, cache = launched.result, launched.run_dir, launched.cache
    assert result.returncode == 0, result.stderr[-3000:]

    prewarm = report(run_dir, "prewarm", 0)
    assert not function(prewarm, "jit_train_step")["hit"]
    train = report(run_dir, "train", 0)
    step = function(train, "jit_train_step")
    assert step["hit"], train
    assert step["key"] == function(prewarm, "jit_train_step")["key"]
    assert train["hits"] >= 1 and train["time_to_first_step_s"] > 0
    # On CPU the other process's key includes its own devices: it always compiles.
    assert not function(report(run_dir, "train", 1), "jit_train_step")["hit"]

    # Where each process's time to first step went: the phases add up to it (within 5%), the
    # remainder named `other`; process 0 of the training job loaded what process 1 compiled.
    for job, process in [("prewarm", 0), ("prewarm", 1), ("train", 0), ("train", 1)]:
        measured = report(run_dir, job, process)
        phases = {}
        for phase in measured["phases"]:
            assert phase["seconds"] >= 0, phase
            phases[phase["phase"]] = phases.get(phase["phase"], 0.0) + phase["seconds"]
        total = measured["time_to_first_step_s"]
        assert abs(sum(phases.values()) - total) <= 0.05 * total, (job, process, phases, total)
        assert {"imports", "distributed", "trace", "lower", "other"} <= set(phases), phases
        assert ("first step" in phases) == (job == "train"), phases
    assert "compile" in phases_of(report(run_dir, "prewarm", 0))
    assert "cache load" in phases_of(train) and "compile" not in phases_of(train)
    assert "compile" in phases_of(report(run_dir, "train", 1))
    assert "warm start (train r0 p0): " in result.stdout
    assert "init phases (seconds from process start to the first step" in result.stdout

    assert step["key"] in open_store(str(cache)).manifest()
    assert LocalStore(cache).entry_path(step["key"]).is_file()
    assert "jit_train_step: HIT on process 0" in result.stdout

    table = cli("report", str(run_dir))
    assert table.returncode == 0
    assert "jit_train_step" in table.stdout and "HIT" in table.stdout
    listed = json.loads(cli("report", str(run_dir), "--json").stdout)
    assert [(r["job"], r["process_index"]) for r in listed] == \
        [("prewarm", 0), ("prewarm", 1), ("train", 0), ("train", 1)]
    assert "COLD  train_step" in result.stderr
    # The trainer's checkpoint line, without orbax's own INFO lines around it.
    output = result.stdout + result.stderr
    assert "checkpoint saved at step 2: " in output and "CheckpointManager" not in output


def test_verify_on_a_warm_cache_says_warm_without_compiling(tmp_path: Path,
                                                             launched: Launched) -> None:
    """The demo's verify, as the README runs it, on the cache the demo was prewarmed into.
    (Its COLD side, an XLA flag added since the prewarm, named in the why: the same line a
    launch prints, checked on the cold launch below; verify naming a flag:
    tests/test_mock_topology.py.)"""
    warm = run_cli("verify", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                   f"cache.dir={launched.cache}")
    assert warm.returncode == 0, warm.stdout + warm.stderr[-2000:]
    prewarm_key = function(report(launched.run_dir, "prewarm", 0), "jit_train_step")["key"]
    assert f"WARM  jit_train_step  {prewarm_key}" in warm.stdout
    verify = report(tmp_path / "runs" / "demo", "verify", 0)
    assert verify["lookups"] == 0 and verify["backend_compile_s"] == 0, verify


def test_clean_cache_without_prewarm_misses(tmp_path: Path) -> None:
    """On one process, the step tiny and compiled the cheapest way: a miss depends on none
    of these."""
    result = run_cli("launch", str(DEMO), "--local", "--no-prewarm", "train.steps=1",
                     f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}",
                     *ONE_PROCESS, *FAST_STEP)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "demo"
    assert not report_path(run_dir, "prewarm", 0, 0).exists()
    train = report(run_dir, "train", 0)
    assert not function(train, "jit_train_step")["hit"]
    assert train["hits"] == 0 and train["backend_compile_s"] > 0


def test_cold_and_warm_launches_of_a_run_are_timed_side_by_side(tmp_path: Path,
                                                                launched: Launched,
                                                                cli: Cli) -> None:
    """jaxwarm-train calls mark_first_step(): its time to first step is there cold and warm,
    and the report shows both launches. Cold: --no-prewarm with an XLA flag the prewarm did
    not have, so the step misses, and the training job says why (XLA's older CPU fusion
    emitter: the demo's step compiles in a quarter of the time). Warm: the prewarmed config,
    whose fingerprint the prewarm recorded, so its training job runs alone (--prewarm auto)
    and loads the step."""
    args = (str(DEMO), "--local", "train.steps=1", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={launched.cache}")
    run_dir = tmp_path / "runs" / "demo"
    cold = run_cli("launch", *args, "--no-prewarm", with_xla_flag(LEGACY_CPU_FUSION))
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert "jit_train_step: MISS on process 0" in cold.stdout
    assert "why: XLA_FLAGS changed since the prewarm of run 'demo': only this job's have " \
        f"{LEGACY_CPU_FUSION} (also compile_options)" in cold.stdout, cold.stdout
    assert not report_path(run_dir, "prewarm", 0, 0).exists()
    first = report(run_dir, "train", 0)
    assert not function(first, "jit_train_step")["hit"]
    assert first["hits"] == 0 and first["backend_compile_s"] > 0
    assert first["first_step_from"] == "trainer"
    assert first["time_to_first_step_s"] > first["backend_compile_s"]
    shutil.rmtree(checkpoints_dir(run_dir))

    warm = run_cli("launch", *args)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "prewarm job: skipped (--prewarm auto)" in warm.stdout
    assert "jit_train_step: HIT on process 0" in warm.stdout
    second = report(run_dir, "train", 0)
    assert function(second, "jit_train_step")["hit"] and second["first_step_from"] == "trainer"
    # The cold launch's report is kept, numbered, not overwritten by the warm one's.
    kept = json.loads((earlier_reports_dir(run_dir, 1) / "train-r0-p0.json").read_text())
    assert kept == first
    line = next(line for line in warm.stdout.splitlines()
                if line.startswith("time to first step on process 0"))
    cold_part, warm_part = line.split(": ", 1)[1].split("), warm ")
    assert cold_part.startswith(f"cold {first['time_to_first_step_s']:.2f} s (0 of "), line
    assert warm_part.startswith(f"{second['time_to_first_step_s']:.2f} s ("), line
    assert warm_part.endswith("restart 0, newest)") and " 0 of " not in warm_part

    # The same command again: the run is done and its trainer trains nothing. It ran no
    # step: no label of warmth, no time to first step, and the history keeps the two
    # attempts that ran one.
    again = run_cli("launch", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to train: the run's checkpoint is at step 1" in again.stderr
    assert "train restart 0, process 0: no step run" in again.stdout, again.stdout
    assert line in again.stdout.splitlines(), again.stdout
    listed = json.loads(cli("report", str(run_dir), "--json").stdout)
    assert [(r["label"], r["first_step_s"]) for r in listed if r["job"] == "train"] == \
        [("no step run", None)] * 2, listed
    status = cli("status", str(run_dir)).stdout
    assert "attempt r0: no step run; " in status and status.rstrip().endswith(
        "no first step"), status


def test_failing_entrypoint_fails_the_launch_with_its_log_tail(tmp_path: Path) -> None:
    result = run_cli("launch", str(DEMO), "--local", "--no-prewarm",
                     f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}",
                     "entrypoint={function: 'json:loads'}")  # called with no argument
    assert result.returncode == 1
    assert "train failed: process" in result.stderr
    assert "TypeError" in result.stderr


def test_a_missing_entrypoint_function_stops_the_launch_before_any_job(tmp_path: Path,
                                                                       cli: Cli) -> None:
    result = cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                 f"cache.dir={tmp_path / 'cache'}",
                 "entrypoint={function: 'json:no_such_function'}")
    assert result.returncode == 2
    assert "entrypoint.function: module 'json'" in result.stderr
    assert "defines no 'no_such_function'" in result.stderr
    assert not logs_dir(tmp_path / "runs" / "demo").exists()

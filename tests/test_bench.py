"""The benchmarks at their smallest, run the way a user runs them, so that they keep
working. It checks what a reader of their output relies on: a table per measurement with its
targets, every figure in the JSON as a number, the chart when matplotlib is there. Targets
are not asserted: whether they are met depends on the machine.

`bench.run` runs at one size, 1 layer of the step at its smallest width, compiled the
cheapest way (`--tiny`: its 5 processes per size are a fixed cost, which the step's width
and its compile only add to); what two sizes or more add, the per-layer row, is made by the
benchmark's own functions from that size's row and a second one, so it is checked too.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import parallel_compile, run, startup, step_cost
from tests.conftest import REPO

STEP_FIGURES = ("lower_s", "verify_extra_ms", "cold_compile_s", "warm_load_s",
                "cold_first_step_s", "warm_first_step_s", "entry_kb", "cold_train_wall_s",
                "warm_train_wall_s", "cold_train_rss_mb", "warm_train_rss_mb",
                "prewarm_wall_s", "prewarm_cpu_s", "prewarm_rss_mb", "bare_wall_s",
                "bare_cpu_s", "bare_rss_mb", "load_pct", "prewarm_wall_ratio",
                "prewarm_cpu_ratio", "prewarm_rss_ratio")
TABLES = ("Cold vs warm init of jit_train_step", "verify vs lowering",
          "Launcher overhead", "Prewarm job vs bare lower().compile()", "Targets")
TARGETS = {"warm retrieval", "verify", "prewarm wall", "prewarm peak RSS", "wrapper overhead"}


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.e2e
def test_benchmark_prints_tables_and_writes_every_figure(tmp_path: Path) -> None:
    figures, chart = tmp_path / "bench.json", tmp_path / "chart.png"
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--sizes", "1", "--repeats", "1",
                           "--tiny", "--json", str(figures), "--png", str(chart)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for title in TABLES:
        assert title in proc.stdout, proc.stdout

    data = json.loads(figures.read_text())
    assert data["settings"] == {"sizes": [1], "repeats": 1, "tiny": True}
    assert "the step at its smallest width" in proc.stdout
    (row,) = data["step"]["rows"]
    assert row["layers"] == 1 and all(positive(row[key]) for key in STEP_FIGURES), row
    assert data["step"]["per_layer"] == {} and "| per layer " not in proc.stdout  # one size
    # Two sizes: this row and one at twice the layers with every figure doubled, so that
    # each figure grows per layer by what it is here (at 1 layer).
    rows = [row, {key: 2 * value for key, value in row.items()}]
    slopes = step_cost.growth(rows)
    assert set(slopes) >= set(STEP_FIGURES)
    for key in STEP_FIGURES:
        assert slopes[key] == pytest.approx(row[key]), key
    assert "\n| per layer " in step_cost.init_table(rows, slopes)
    launch = data["launcher"]["row"]
    assert all(positive(launch[f"{path}_s"]) for path in ("direct", "local", "slurm")), launch
    assert all(math.isfinite(launch[f"{path}_overhead_s"]) for path in ("local", "slurm"))
    assert {check["measurement"] for check in data["targets"]} == TARGETS
    lines = proc.stdout.splitlines()
    for check in data["targets"]:
        result = "PASS" if check["met"] is True else "MISS" if check["met"] is False else None
        assert any(line.startswith(f"| {check['measurement']} ") and f"| {result} " in line
                   for line in lines), check
    assert len(data["load_average"]["start"]) == 3 and data["load_average"]["during"]
    assert data["machine"]["cpus"] >= 1 and data["machine"]["jax"]

    if importlib.util.find_spec("matplotlib") is not None:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not chart.exists()
        assert "matplotlib is not installed" in proc.stdout


def test_quick_is_two_sizes_and_one_repetition() -> None:
    """What `--quick` runs, against the defaults."""
    quick, full = run.parse_args(["--quick"]), run.parse_args([])
    assert (quick.sizes, quick.repeats) == ([2, 4], 1)
    assert (full.sizes, full.repeats) == ([2, 4, 8, 16, 32], 3)
    assert quick.png == quick.json.with_suffix(".png")


@pytest.mark.e2e
def test_growth_at_one_rank_compares_jaxwarm_with_the_cache_set_by_hand(tmp_path: Path) -> None:
    """`bench.growth` at its smallest size: both ways ran the trainer to its first step,
    every figure of the row is a number, and the chart is drawn when matplotlib is there;
    a budget already spent leaves the size its one repetition, and the row says so."""
    figures = tmp_path / "growth.json"
    proc = subprocess.run([sys.executable, "-m", "bench.growth", "--ranks", "1", "--repeats", "2",
                           "--budget-s", "0", "--json", str(figures)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "jaxwarm against the same trainer with JAX's cache set by hand" in proc.stdout
    (row,) = json.loads(figures.read_text())["rows"]
    assert row["repeats"] == 1, row
    for key in ("plain_first_step_s", "jaxwarm_first_step_s", "plain_wall_s",
                "jaxwarm_wall_s", "plain_rss_mb", "jaxwarm_rss_mb", "supervisor_rss_mb",
                "launcher_rss_mb", "report_s"):
        assert positive(row[key]), (key, row)
    assert math.isfinite(row["added_first_step_s"]) and row["lock_wait_s"] >= 0
    if importlib.util.find_spec("matplotlib") is not None:
        assert figures.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.e2e
def test_wakeups_counts_both_ways_threads_by_kind(tmp_path: Path) -> None:
    """`bench.wakeups` at 1 rank (what it counts is by kind of thread, the same at any rank
    count; a second rank only misses and compiles again): both ways' trainers were seen with
    their CPU time and context switches, jaxwarm's supervisor and launcher too, and the
    ledger's samples come from the init report."""
    figures = tmp_path / "wakeups.json"
    proc = subprocess.run([sys.executable, "-m", "bench.wakeups", "--ranks", "1", "--repeats",
                           "1", "--json", str(figures)], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "context switches (thousands) by kind" in proc.stdout
    (pair,) = json.loads(figures.read_text())["pairs"]
    for way in ("by hand", "jaxwarm"):
        assert positive(pair[way]["first_step_s"]), pair
        assert "trainer main" in pair[way]["cpu_s"] and "trainer main" in pair[way]["switches"]
    assert {"supervisor", "launcher"} <= set(pair["jaxwarm"]["cpu_s"]), pair
    assert "supervisor" not in pair["by hand"]["cpu_s"]
    assert pair["jaxwarm"]["sampling"]["samples"] > 0


@pytest.mark.e2e
def test_big_compile_at_one_layer_sets_the_warm_load_beside_its_limit(tmp_path: Path) -> None:
    """`bench.big_compile` at 1 layer (the Llama-3-8B mesh on 64 CPU devices): the prewarm
    compiled the step, a fresh process loaded it from the cache, and the limit is made of
    measured parts."""
    figures = tmp_path / "big.json"
    proc = subprocess.run([sys.executable, "-m", "bench.big_compile", "--layers", "1",
                           "--disk-mib", "16", "--json", str(figures)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    row = json.loads(figures.read_text())["row"]
    for key in ("cold_compile_s", "warm_load_s", "entry_bytes", "disk_read_mb_s",
                "decompress_s", "deserialize_s", "limit_s"):
        assert positive(row[key]), (key, row)
    assert row["load_log"][0].startswith("jit_train_step: HIT"), row["load_log"]


@pytest.mark.e2e
def test_startup_at_one_layer_times_warm_and_dropped_with_and_without_prefetch(
        tmp_path: Path) -> None:
    """`bench.startup` at 1 layer of the step at its smallest width, compiled the cheapest way
    (`--tiny`), a short data pipeline, one repetition of the warm arms: every launch reached
    its first step from the cache, the prefetched ones (`true`: a machine busy with other
    tests may have no idle core for `auto`) were handed the step, the page cache was dropped
    by posix_fadvise and said so; the table is printed, the JSON reads back as the
    benchmark's result, and the picture is drawn where matplotlib is."""
    figures = tmp_path / "startup.json"
    proc = subprocess.run([sys.executable, "-m", "bench.startup", "--layers", "1", "--tiny",
                           "--records", "1000", "--arms", "warm", "dropped", "--repeat", "1",
                           "--prefetch", "true", "--png", "--json", str(figures)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = startup.read_result(figures)
    assert sorted((launch.arm, launch.prefetch) for launch in result.launches) == [
        (startup.WARM, False), (startup.WARM, True), (startup.DROPPED, False),
        (startup.DROPPED, True)]
    assert all(launch.step_hit and positive(launch.time_to_first_step_s)
               for launch in result.launches)
    assert all((launch.step_waited_s is not None) == launch.prefetch
               for launch in result.launches)
    assert result.eviction == startup.FADVISE and "posix_fadvise" in proc.stdout
    assert result.prefetch_setting == "true" and "cache.prefetch true" in proc.stdout
    assert result.tiny and "bench.startup: reference, 1 unrolled layers of the step at its " \
        "smallest width" in proc.stdout
    assert "Targets" in proc.stdout
    assert "warm: the same, per alternated pair (median of 1)" in proc.stdout
    if importlib.util.find_spec("matplotlib") is not None:
        assert figures.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.e2e
def test_parallel_compile_times_serial_threads_and_processes(tmp_path: Path) -> None:
    """`bench.parallel_compile` at 1 layer of the step at its smallest width, compiled the
    cheapest way (`--tiny`: the ways' processes are what is tested, not their figures),
    once: each way compiled both
    targets and has a wall and a CPU time, and the table compares them with serial."""
    figures = tmp_path / "parallel.json"
    proc = subprocess.run([sys.executable, "-m", "bench.parallel_compile", "--layers", "1",
                           "--repeat", "1", "--tiny", "--json", str(figures)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = parallel_compile.read_result(figures)
    assert result.tiny and "1 unrolled layers, the step at its smallest width" in proc.stdout
    assert [sample.way for sample in result.samples] == list(parallel_compile.WAYS)
    assert all(positive(s.compile_wall_s) and positive(s.cpu_s) for s in result.samples)
    assert "serially, on threads and in processes" in proc.stdout and "1.00x" in proc.stdout

"""The benchmark's quick mode (2 sizes, 1 repetition), run the way a user runs it, so that
the benchmark keeps working. It checks what a reader of its output relies on: a table per
measurement with its targets, every figure in the JSON as a number, the chart when
matplotlib is there. Targets are not asserted: whether they are met depends on the machine.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e


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


def test_quick_benchmark_prints_tables_and_writes_every_figure(tmp_path: Path) -> None:
    figures, chart = tmp_path / "bench.json", tmp_path / "chart.png"
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--json", str(figures),
                           "--png", str(chart)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for title in TABLES:
        assert title in proc.stdout, proc.stdout

    data = json.loads(figures.read_text())
    assert data["settings"] == {"sizes": [2, 4], "repeats": 1}
    rows = data["step"]["rows"]
    assert [row["layers"] for row in rows] == [2, 4]
    for row in rows:
        assert all(positive(row[key]) for key in STEP_FIGURES), row
    assert set(data["step"]["per_layer"]) >= set(STEP_FIGURES)
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


def test_growth_at_one_rank_compares_jaxwarm_with_the_cache_set_by_hand(tmp_path: Path) -> None:
    """`bench.growth` at its smallest size: both ways ran the trainer to its first step,
    every figure of the row is a number, and the chart is drawn when matplotlib is there."""
    figures = tmp_path / "growth.json"
    proc = subprocess.run([sys.executable, "-m", "bench.growth", "--ranks", "1", "--json",
                           str(figures)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "jaxwarm against the same trainer with JAX's cache set by hand" in proc.stdout
    (row,) = json.loads(figures.read_text())["rows"]
    for key in ("plain_first_step_s", "jaxwarm_first_step_s", "plain_wall_s",
                "jaxwarm_wall_s", "plain_rss_mb", "jaxwarm_rss_mb", "supervisor_rss_mb",
                "launcher_rss_mb", "report_s"):
        assert positive(row[key]), (key, row)
    assert math.isfinite(row["added_first_step_s"]) and row["lock_wait_s"] >= 0
    if importlib.util.find_spec("matplotlib") is not None:
        assert figures.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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

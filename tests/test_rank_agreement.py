"""Rank agreement before each compile (`ranks.agree`), forced on for a CPU job of 2 ranks.

On GPU every rank of a job shares one key; on CPU each process hashes its own devices into
the accelerator config, so the agreement compares the other seven components there. Only
process 0 writes entries, so on CPU rank 1 never has one: after a prewarm, rank 0 sees the
entry and rank 1 does not, and both compile without the cache (a rejected hit), leaving the
entry exactly as it was. A key component that differs on one rank (LIBTPU_INIT_ARGS, which
JAX hashes into the key on every backend and jaxwarm does not own, planted by a shell
wrapper on rank 1) stops the job with one line naming the component and the rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from jaxwarm.core.records import RANKS
from jaxwarm.core.rundir import report_path
from tests.conftest import DEMO, ranks_layout, run_cli

pytestmark = pytest.mark.e2e

LAYOUT = ranks_layout(2, 2, 1)


def entries(cache: Path) -> dict[str, tuple[bytes, int]]:
    return {path.name: (path.read_bytes(), path.stat().st_mtime_ns)
            for path in cache.glob("*-cache")}


def test_agreeing_ranks_proceed_and_a_rejected_hit_leaves_the_entry(tmp_path: Path) -> None:
    args = (str(DEMO), "--local", *LAYOUT, f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", "ranks.agree=true")
    prewarm = run_cli("prewarm", *args, timeout=900)
    assert prewarm.returncode == 0, prewarm.stderr[-3000:]
    before = entries(tmp_path / "cache")
    assert any(name.startswith("jit_train_step-") for name in before), before

    result = run_cli("launch", *args, "--no-prewarm", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    after = entries(tmp_path / "cache")  # the training job wrote its small compiles beside
    # the prewarm's entries, which were neither read into a rank alone nor rewritten
    assert {name: entry for name, entry in after.items() if name in before} == before
    run_dir = tmp_path / "runs" / "demo"
    for rank in (0, 1):
        report = json.loads(report_path(run_dir, "train", 0, rank).read_text())
        said = [w["text"] for w in report["warnings"] if w["kind"] == RANKS]
        assert any(text.startswith("jit_train_step: the ranks do not see the same cache "
                                   "entry (") and "no entry on rank 1" in text
                   and text.endswith("the entry was left in place") for text in said), said
        [step] = [fn for fn in report["functions"] if fn["name"] == "jit_train_step"]
        assert step["key"] is None and not step["hit"]  # compiled without the cache


def test_a_key_component_that_differs_on_one_rank_stops_the_job(tmp_path: Path) -> None:
    plant = ('if [ "$JAXWARM_PROCESS_ID" = 1 ]; then export LIBTPU_INIT_ARGS=--xla_planted; '
             f'fi; exec {sys.executable} -m jaxwarm.workload.trainer')
    result = run_cli("launch", str(DEMO), "--local", "--no-prewarm", *LAYOUT,
                     f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}",
                     "ranks.agree=true", "stop_grace_s=5",
                     f"entrypoint.command=[sh, -c, {json.dumps(plant)}]", timeout=900)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines()
              if line.startswith("jaxwarm: train failed")]
    assert "the ranks would look it up under different cache keys: XLA flags differs on " \
           "rank 1 (against rank 0)" in line, line

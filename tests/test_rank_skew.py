"""16 ranks (16 processes x 1 CPU device, the tiny demo step) launched on this machine.

Before the ranks met after each compile, this launch died: process 0 loaded the step from
the cache and reached its first collective while the others still compiled it (on CPU only
process 0 can hit), Gloo's fixed 30 s wait for its peers ran out, and every rank aborted
with a C++ stack trace. On 2 cores the other 15 ranks compile each function for 30-70 s.
Now process 0 waits for them at the meeting after each compile, and the launch passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.rundir import report_path
from tests.conftest import DEMO, ranks_layout, run_cli

pytestmark = pytest.mark.e2e

RANKS = 16


def test_sixteen_ranks_meet_before_their_first_collective(tmp_path: Path) -> None:
    result = run_cli("launch", str(DEMO), "--local", *ranks_layout(RANKS, 4, 4),
                     f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}",
                     timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "demo"
    reports = [json.loads(report_path(run_dir, "train", 0, rank).read_text())
               for rank in range(RANKS)]
    steps = [next(fn for fn in r["functions"] if fn["name"] == "jit_train_step")
             for r in reports]
    # The skew this is about: process 0 loaded the step, every other process compiled it...
    assert steps[0]["hit"] and not any(step["hit"] for step in steps[1:])
    # ... and process 0 waited for them instead of running ahead into the collective.
    assert reports[0]["ranks_wait_s"] > 0
    assert all(r["time_to_first_step_s"] is not None for r in reports)
    assert "jit_train_step: HIT on process 0" in result.stdout

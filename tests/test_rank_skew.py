"""Ranks that reach their first collective far apart (2 processes x 1 CPU device; process 1
builds the step `tests.late_factory.LATE_S` = 40 s late: one late rank is all the skew
takes, and each more rank only compiles the step once more); and the same at the mission's
64 ranks, where the point is 64 processes meeting and folded in one report (skipped where
the machine has not the memory for them): there the last rank is late, by LATE_S after
process 0 reached the meeting, while the others compile. Both run
the reference trainer's small step (`jaxwarm.workload.small`, conftest's FAST_STEP) whose one
step is a collective of every rank: the ranks' meeting is the point here, not the model.

Before the ranks met after each compile, a launch of 8 or 16 ranks on this machine died:
process 0 loaded the step from the cache and reached its first collective while the others
still compiled it (on CPU only process 0 can hit), Gloo's fixed 30 s wait for its peers ran
out, and every rank aborted with a C++ stack trace. A real 16-rank launch made that skew by
load alone (47 s here, about 300 s of CPU); the late factory makes it certain at a fraction
of the cost. Now process 0 waits for the others at the meeting after each compile, and the
launch passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxwarm.core.rundir import report_path
from jaxwarm.report.read import load_reports
from jaxwarm.report.render import HEADLINE_LINES, summarize
from jaxwarm.store.store import open_store
from testing.procs import available_gib
from tests.conftest import DEMO, ranks_layout, run_cli
from tests.late_factory import LATE_S

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # its late rank waits 40 s: handed out early

RANKS = 2


def test_ranks_a_collective_would_not_wait_for_meet_before_it(tmp_path: Path) -> None:
    common = [str(DEMO), "--local", *ranks_layout(RANKS, 2, 1),
              f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}"]
    # The prewarm on time (the late factory builds the same step, so the same keys): the
    # skew that matters is the training job's, and a late prewarm only waited 40 s more.
    prewarmed = run_cli("prewarm", *common)
    assert prewarmed.returncode == 0, prewarmed.stderr[-3000:]
    # The trainer stops at its first step (`train_one_step`): a trainer's stop agreement and
    # checkpoint after it are no part of how the ranks reach it.
    result = run_cli("launch", *common, "--prewarm=never",
                     "step.factory=tests.late_factory:make_small_step_late",
                     "entrypoint={function: 'tests.late_factory:train_one_step'}")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "demo"
    reports = [json.loads(report_path(run_dir, "train", 0, rank).read_text())
               for rank in range(RANKS)]
    steps = [next(fn for fn in r["functions"] if fn["name"] == "jit_train_step")
             for r in reports]
    # The skew this is about: process 0 loaded the step, every other process compiled it...
    assert steps[0]["hit"] and not any(step["hit"] for step in steps[1:])
    # ... and process 0 waited for them, longer than Gloo would have, instead of running
    # ahead into the collective.
    assert reports[0]["ranks_wait_s"] > LATE_S - 10
    assert all(r["time_to_first_step_s"] is not None for r in reports)
    assert "jit_train_step: HIT on process 0" in result.stdout


# The mission's layout: 8 nodes x 8 processes, 1 CPU device each, the small step.
NODES, PER_NODE = 8, 8
# What 64 ranks of the reference trainer's cheapest step take from the machine at their peak,
# supervisors and launcher included (the sum of their PSS, bench/results/scale-64-local.json:
# 8.1 GiB; the small step takes less), and a margin: below that much available memory the
# test is skipped, not OOM-killed.
MEMORY_FLOOR_GIB = 11.0


@pytest.mark.alone  # beside the suite, 64 processes on 2 cores starved a SLURM trainer past
# its 30 s KillWait: `make test` runs it after the others, by itself
def test_64_ranks_meet_a_rank_late_beyond_gloos_wait_and_the_headline_fits(
        tmp_path: Path) -> None:
    """The same skew at the mission's 64 ranks, without a prewarm (every rank compiles:
    process 0 at once and alone, the others once process 0 waits at the meeting, the last
    one 40 s after that, `make_small_step_last_late`): process 0 waits at the meeting for 63
    ranks, the launch passes, and the report's headline names all 64 processes in a screen.
    The others compile during the last rank's lateness, not after it, and the trainer stops
    at its first step (`train_one_step`: the reference trainer's stop agreement and
    checkpoint took some 40 s at 64 ranks, and are no part of the meeting)."""
    available = available_gib()
    if available < MEMORY_FLOOR_GIB:
        pytest.skip(f"64 ranks need {MEMORY_FLOOR_GIB:.0f} GiB of available memory "
                    f"(MemAvailable); this machine has {available:.1f} GiB")
    ranks = NODES * PER_NODE
    cache = tmp_path / "cache"
    result = run_cli("launch", str(DEMO), "--local", "--no-prewarm",
                     *ranks_layout(ranks, NODES, PER_NODE), f"topology.nodes={NODES}",
                     f"topology.processes_per_node={PER_NODE}", "ranks.meet_timeout_s=1800",
                     "step.factory=tests.late_factory:make_small_step_last_late",
                     "entrypoint={function: 'tests.late_factory:train_one_step'}",
                     f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={cache}", timeout=2400)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "demo"
    reports = [r for r in load_reports(run_dir) if r.job == "train"]
    assert sorted(r.process_index for r in reports) == list(range(ranks))
    first = next(r for r in reports if r.process_index == 0)
    assert first.ranks_wait_s > LATE_S - 10
    assert all(r.time_to_first_step_s is not None for r in reports)
    store = open_store(str(cache))
    headline = summarize(reports, store.manifest(strict=False), "demo", store, run_dir)
    assert len(headline) <= HEADLINE_LINES
    assert not any("more line(s)" in line for line in headline), headline
    assert all(line in result.stdout for line in headline)
    assert any(line.startswith("time to first step (restart 0):") and "processes 0-63" in line
               for line in headline), headline

"""MLPerf's init lines: a demo launch with `report.mlperf: true` logs init_start / init_stop /
run_start through mlperf-logging on process 0, into the job's log and the run dir, and
mlperf-logging's own compliance checker (its init-time rule) passes them; a run whose init
goes over a tiny budget fails it. The pure tests write the lines with the same code and run
the same checker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import PREWARM, TRAIN, InitReport
from jaxwarm.core.rundir import log_path, mlperf_log_path, report_path
from jaxwarm.job.record.mlperf import INIT_KEYS, MlperfLog, check_init, init_rules
from tests.conftest import DEMO, FAST_STEP, run_cli

TOKEN = ":::MLLOG "


def mllog_keys(text: str) -> list[str]:
    return [json.loads(line[line.index(TOKEN) + len(TOKEN):])["key"]
            for line in text.splitlines() if TOKEN in line]


def test_the_checker_runs_the_packages_own_init_rule_with_the_budget(tmp_path: Path) -> None:
    rules = init_rules(1800, "6.1.0")
    assert [rule["KEY"]["NAME"] for rule in rules if "KEY" in rule] == list(INIT_KEYS)
    assert "s['compile_time_mins'] = 30.0" in rules[0]["BEGIN"]["CODE"]
    path = mlperf_log_path(tmp_path, 0)
    now = time.time()  # one clock reading: the 4 s between the lines do not depend on load
    lines = MlperfLog(path, now - 5)
    lines.stop(now - 1)
    assert mllog_keys(path.read_text()) == ["init_start", "init_stop", "run_start"]
    passed = check_init(path, 1800)
    assert passed.ok and passed.messages == [] and 3.9 < passed.init_s < 4.1
    failed = check_init(path, 2)
    assert not failed.ok
    assert "CHECK for 'init_stop' failed" in failed.messages[0]


def test_a_second_init_stop_fails_the_check(tmp_path: Path) -> None:
    path = mlperf_log_path(tmp_path, 0)
    lines = MlperfLog(path, time.time() - 5)
    lines.stop(time.time() - 2)
    lines.stop(time.time() - 1)
    assert not check_init(path, 1800).ok


@pytest.mark.e2e
def test_a_launched_run_logs_init_lines_the_checker_passes(tmp_path: Path) -> None:
    # The tiny step: the init lines and their check do not depend on how long it compiles.
    args = [str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", "report.mlperf=true", *FAST_STEP]
    result = run_cli("launch", *args, "train.steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "demo"
    log = mlperf_log_path(run_dir, 0).read_text()
    assert mllog_keys(log) == ["init_start", "init_stop", "run_start"]
    assert mllog_keys(log_path(run_dir, TRAIN, 0).read_text()) == mllog_keys(log)
    assert TOKEN not in log_path(run_dir, TRAIN, 1).read_text()  # process 0 only
    assert TOKEN not in log_path(run_dir, PREWARM, 0).read_text()
    check = check_init(mlperf_log_path(run_dir, 0), 1800)
    assert check.ok, check.messages
    report = read_record(InitReport, report_path(run_dir, TRAIN, 0, 0))
    assert report is not None and report.time_to_first_step_s is not None
    assert 0 < check.init_s < report.time_to_first_step_s  # init ends before the step
    assert "training 6.1.0 init rule, 1800 s budget: pass" in result.stdout

    # The same run resumed with an init budget it cannot keep: MLPerf's checker fails it.
    over = run_cli("launch", *args, "--no-prewarm", "train.steps=2", "init_budget_s=0.5")
    assert over.returncode == 0, over.stderr[-3000:]
    check = check_init(mlperf_log_path(run_dir, 0), 0.5)
    assert not check.ok and check.init_s > 0.5
    assert "0.5 s budget: FAIL: CHECK for 'init_stop' failed" in over.stdout


"""What `jaxwarm report`, `verify` and `cache ls|stats` print, rendered from fixture files
(tests/fixtures: a run's init reports and verify result, a cache's manifest), with no JAX and
no job: the typed records jaxwarm reads back, and readers that skip a bad file or usage line
with one line naming it instead of failing."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from pathlib import Path

import pytest

from jaxwarm.cli.cache import cache_stats, entry_rows
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.jsonio import dumps, from_json
from jaxwarm.core.records import (
    FIRST_STEP,
    IMPORTS,
    LOAD,
    OTHER,
    PREWARM_FORGOTTEN,
    SETTING_CHANGED,
    UNUSED,
    EntryChecked,
    EntryPruned,
    FirstStep,
    FunctionRecord,
    InitPhase,
    InitReport,
    JobUsage,
    Prefetched,
    PrefetchReport,
    ReportWarning,
    UsedFunction,
    Verdict,
    VerifyResult,
)
from jaxwarm.core.rundir import (
    ReportName,
    first_steps_path,
    parse_report_path,
    report_path,
    verify_result_path,
)
from jaxwarm.jaxkey.logs import input_elements
from jaxwarm.report.read import (
    PrewarmedFunctions,
    fold_owners,
    load_first_steps,
    load_reports,
    load_verdicts,
)
from jaxwarm.report.render import (
    attempt_summaries,
    did,
    first_step_lines,
    format_table,
    format_verdicts,
    function_lines,
    phase_table,
    summarize,
    trainer_cost,
    warm_start_lines,
)
from jaxwarm.store.store import LocalStore

FIXTURES = Path(__file__).parent / "fixtures"
RUN, CACHE = FIXTURES / "run", FIXTURES / "cache"
STORE = LocalStore(CACHE)
STEP = "jit_train_step-" + "a" * 64


def test_report_paths_are_formatted_and_parsed_by_one_spelling() -> None:
    path = report_path(RUN, "train", 2, 13)
    assert path == RUN / "reports" / "train-r2-p13.json"
    assert parse_report_path(path) == ReportName("train", 2, 13)
    assert parse_report_path(RUN / "reports" / "notes.json") is None
    assert parse_report_path("train-r2-p13.json.tmp") is None


def test_reports_load_in_run_order_and_a_malformed_one_is_skipped_by_name(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "jaxwarm"):
        reports = load_reports(RUN)
    assert [(r.job, r.process_index) for r in reports] == \
        [("prewarm", 0), ("prewarm", 1), ("train", 0), ("train", 1)]
    assert all(isinstance(fn, FunctionRecord) for r in reports for fn in r.functions)
    [skipped] = caplog.messages
    assert "train-r0-p2.json" in skipped and "restart_count" in skipped
    assert "expected an integer" in skipped


def test_the_headline_says_hit_what_it_saved_and_what_the_trainer_changed() -> None:
    lines = summarize(load_reports(RUN), STORE.manifest(), "demo", STORE)
    assert lines[0] == "train restart 0, process 0: warm"
    assert lines[1] == ("jit_train_step: HIT on process 0 (restart 0), loaded in 0.23 s; "
                        "prewarm compiled it in 6.84 s, so this saved 6.61 s")
    assert lines[2].startswith("process 1: no hits; on CPU JAX hashes")
    assert lines[3] == ("time to first step (restart 0): 10.95-10.99 s on processes 0-1 "
                        "(slowest: process 0), within the 1800 s budget")
    assert lines[4].startswith("the trainer set jax_persistent_cache_min_compile_time_secs")
    assert len(lines) == 5


def test_on_gpu_ranks_without_hits_are_not_explained_by_cpu_keys() -> None:
    reports = [dataclasses.replace(r, environment={**r.environment, "JAX_PLATFORMS": "cuda"})
               for r in load_reports(RUN)]
    lines = summarize(reports, STORE.manifest(), "demo", STORE)
    assert lines[2] == ("process 1: no hits; they share process 0's keys here, so their rows "
                        "below say why they missed")


def test_a_miss_is_explained_by_the_component_that_differs() -> None:
    reports = load_reports(RUN)
    train = next(r for r in reports if (r.job, r.process_index) == ("train", 0))
    step = train.functions[0]
    missed = dataclasses.replace(step, hit=False, seconds=7.2, key="jit_train_step-" + "f" * 64,
                                 components={**step.components, "XLA flags": "changed"})
    train.functions[0] = missed
    lines = summarize(reports, STORE.manifest(), "demo", STORE)
    assert lines[0] == "train restart 0, process 0: cold"
    assert lines[1] == "jit_train_step: MISS on process 0 (restart 0), compiled in 7.20 s"
    assert lines[2].startswith("  why: XLA flags differ") and "run 'demo'" in lines[2]
    assert len(lines) == 3 or not lines[3].startswith("  why: ")  # one cause, said once


def test_the_table_has_a_row_per_process_then_the_compiles_and_warnings() -> None:
    reports = load_reports(RUN)
    text = format_table(reports, PrewarmedFunctions.of(STORE.manifest()), 0.5)
    rows = text.splitlines()
    assert rows[0].split() == ["job", "restart", "proc", "lookups", "hits", "misses",
                               "compile_s", "retrieval_s", "first_step_s", "budget_s", "init",
                               "start"]
    # The two prewarm processes did the same: one row, their figures as ranges. A prewarm
    # runs no step (no first step, no budget) and its lookups that missed are what it
    # compiled, not misses.
    assert rows[1].split() == ["prewarm", "0", "0-1", "2", "0", "-", "8.34-8.61", "0.00",
                               "-", "-", "2", "compiled,", "0", "already", "WARM"]
    assert rows[2].split() == ["train", "0", "0", "3", "1", "2", "0.06", "0.23", "10.99",
                               "1800", "ok", "warm"]
    assert rows[3].split()[-2:] == ["ok", "cold"]  # on CPU process 1 compiles
    assert "  train   r0 p0     jit_train_step               HIT          0.23 s  " \
           "jit_train_step-aaaaaaaaaaaaaaaa  prewarmed" in rows
    assert "  train   r0 p0     + 2 small compile(s) under 0.5 s (not prewarmed, not stored), " \
           "0.06 s in all; --all lists them" in rows
    assert "  prewarm r0 p0-p1  jit_train_step               MISS     6.84-7.01 s  2 keys  " \
           "prewarmed" in rows
    assert any(row.startswith("  WARNING train   r0 p0: the trainer set ") for row in rows)
    everything = format_table(reports, PrewarmedFunctions.of(STORE.manifest()), 0.5,
                              show_all=True)
    assert "NO-CACHE" in everything and "small compile" not in everything


def test_the_table_leads_with_targets_and_sums_up_small_compiles() -> None:
    fn = FunctionRecord(name="jit_step", key="jit_step-ab", hit=True, seconds=0.02,
                        signature="s1")
    other = dataclasses.replace(fn, key="jit_step-cd", hit=False, seconds=0.2, signature="s2")
    small = [FunctionRecord(name=f"jit_op{i}", key=f"jit_op{i}-ef", hit=False, seconds=0.01)
             for i in range(40)]
    big = dataclasses.replace(small[0], name="jit_init", seconds=3.0)
    process = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                         cache_dir="/c", init_budget_s=60.0,
                         functions=[*small, fn, other, big])
    targets = PrewarmedFunctions(frozenset({"jit_step-ab"}), frozenset({("jit_step", "s1")}))
    lines = function_lines([process], targets, 0.5, show_all=False)
    assert [line.split()[3] for line in lines[:-1]] == ["jit_step", "jit_init"]
    assert "jit_step [s1]" in lines[0] and lines[0].endswith("prewarmed")
    assert "+ 41 small compile(s) under 0.5 s" in lines[-1] and "0.60 s in all" in lines[-1]
    assert len(function_lines([process], targets, 0.5, show_all=True)) == 43


def test_a_long_name_keeps_the_functions_columns_aligned() -> None:
    """`--all` of a trainer whose helpers share a name: `jit__identity_fn [86d3921f0b8a]`
    is longer than the name column; every row's outcome still starts in one column."""
    long = [FunctionRecord(name="jit__identity_fn", key=f"jit__identity_fn-{i}", hit=False,
                           seconds=0.01, signature=f"{i}" * 12) for i in range(2)]
    step = FunctionRecord(name="jit_step", key="jit_step-ab", hit=True, seconds=0.02)
    process = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                         cache_dir="/c", init_budget_s=60.0, functions=[step, *long])
    nothing = PrewarmedFunctions(frozenset(), frozenset())
    rows = [row for row in format_table([process], nothing, 0.5, show_all=True).splitlines()
            if row.startswith("  train")]
    assert len(rows) == 3 and len({row.index("HIT") if "HIT" in row else row.index("MISS")
                                   for row in rows}) == 1, rows


def test_pgle_s_two_compiles_and_the_restart_s_load_are_named() -> None:
    """PGLE on a GPU, as the recorder records it (the CPU's profiler gives JAX no profile,
    so no CPU run compiles twice: tests/test_pgle.py gets the load with a profile given by
    hand). Restart 0: the prewarmed first compile HITs, and after the profiled steps JAX
    compiles again under its PGLE-optimized key; restart 1 loads that one only."""
    reports = [r for r in load_reports(RUN) if r.job == "train" and r.process_index == 0]
    first = reports[0]
    optimized = "jit_train_step-" + "b" * 64
    second = dataclasses.replace(first.functions[0], hit=False, seconds=12.5, key=optimized,
                                 pgle_optimized=True)
    first.functions.append(second)
    lines = summarize(reports, STORE.manifest(), "demo", STORE)
    # The start was warm: the profile-guided compile comes after the first step.
    assert lines.pop(0) == "train restart 0, process 0: warm"
    assert lines[0].startswith("jit_train_step: HIT on process 0 (restart 0), loaded in")
    assert lines[1] == ("jit_train_step: PGLE's second, profile-guided compile on process 0 "
                        "(restart 0), 12.50 s after the profiled steps; stored under "
                        "jit_train_step-bbbbbbbbbbbbbbbb for the restarts")
    table = format_table(reports, PrewarmedFunctions.of(STORE.manifest()), threshold_s=1.0)
    assert "12.50 s  jit_train_step-bbbbbbbbbbbbbbbb  PGLE profile-guided" in table
    restart = dataclasses.replace(first, restart_count=1, functions=[dataclasses.replace(
        second, hit=True, seconds=0.4)])
    lines = summarize([*reports, restart], STORE.manifest(), "demo", STORE)
    assert lines.pop(0) == "train restart 1, process 0: warm"
    assert lines[0] == ("jit_train_step: HIT of PGLE's profile-guided executable on process "
                        "0 (restart 1), loaded in 0.40 s: no first compile, no profiled steps")


def test_verdicts_render_warm_and_cold_with_why(tmp_path: Path) -> None:
    result = load_verdicts(RUN, "")  # written before verifies had an invocation id
    assert result is not None and not result.warm
    assert load_verdicts(RUN, "another-verify") is None  # not this verify's: no answer
    lines = format_verdicts(result.functions)
    assert lines[0] == f"WARM  jit_train_step  {STEP}  (lowering 0.37 s + key 8.0 ms)"
    assert lines[1].startswith("COLD  jit_init_state  jit_init_state-dddd")
    assert lines[2].startswith("      why: prewarmed as jit_init_state-cccc")
    broken = verify_result_path(tmp_path)
    broken.parent.mkdir()
    broken.write_text('{"process_index": 0, "functions": [{"function": 3}]}')
    with pytest.raises(ConfigError, match=r"p0.json: functions\[0\].function: expected a string"):
        load_verdicts(tmp_path, "")


def test_a_function_the_trainer_never_looked_up_has_no_cost() -> None:
    """verify --trainer, a trainer that ended first: the function it never looked up has no
    key and no cost (not `lowering 0.00 s`), and the cost line says where the trainer ended."""
    heard = Verdict("jit_init", "jit_init-aaaa", True, 0.0, 0.0, reached_s=1.0)
    unheard = Verdict("jit_train_step", "-", False, 0.0, 0.0,
                      ["the trainer never looked it up: it ended first"])
    assert format_verdicts([heard, unheard]) == [
        "WARM  jit_init  jit_init-aaaa  (the trainer looked it up at 1.00 s)",
        "COLD  jit_train_step  -",
        "      why: the trainer never looked it up: it ended first"]
    assert trainer_cost(VerifyResult(0, [heard, unheard], 2.5)) == \
        "verify --trainer: the trainer ended 2.50 s after its start, before it looked up " \
        "jit_train_step"
    assert trainer_cost(VerifyResult(0, [heard], 1.0)) == \
        "verify --trainer: 1.00 s of the trainer's run, from its start to its last " \
        "prewarmed function's lookup"


def test_report_json_is_standard_and_round_trips(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    reports = load_reports(RUN)
    text = dumps(reports, indent=1)
    again = [from_json(InitReport, item, "again") for item in json.loads(text)]
    assert again == reports
    assert json.loads(text)[2]["warnings"][0]["kind"] == SETTING_CHANGED
    with pytest.raises(ValueError):
        dumps({"age_s": math.inf})
    # A report with NaN in it (not JSON other tools read) is skipped, not rendered.
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    path = report_path(run, "train", 0, 0)
    path.write_text(path.read_text().replace('"time_to_first_step_s": 10.99',
                                             '"time_to_first_step_s": NaN'))
    with caplog.at_level(logging.WARNING, "jaxwarm"):
        assert [(r.job, r.process_index) for r in load_reports(run)] == \
            [("prewarm", 0), ("prewarm", 1), ("train", 1)]
    assert any(str(path) in m and "NaN" in m for m in caplog.messages)


def test_a_bad_usage_line_is_skipped_with_its_file_and_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = LocalStore(tmp_path)
    store.append_usage(JobUsage(run="demo", job="train", functions=[
        UsedFunction(name="jit_train_step", key=STEP, hit=False, seconds=7.0, sha256="e" * 64,
                     size=5)]))
    with store.usage_file.open("a") as log:
        log.write('[1,2]\n{"event":"pruned"}\n{"event":"eaten","key":"k"}\n'
                  '{"run": "demo", "job": "train", "functions": [{"name": 1}]}\n{"torn": ')
    store.append_usage(EntryPruned(STEP, 5))
    store.append_usage(EntryChecked(STEP, "f" * 64, 5))
    store.entry_path(STEP).write_bytes(b"x" * 5)
    with caplog.at_level(logging.WARNING, "jaxwarm"):
        records = store.usage()
        rows, stats = entry_rows(store), cache_stats(store)
    assert [type(r).__name__ for r in records] == ["JobUsage", "EntryPruned", "EntryChecked"]
    history = store.histories()[STEP]
    assert (history.sha256, history.written_by) == ("f" * 64, "demo (train r0)")
    usage_log = str(store.usage_file)
    skipped = [m for m in caplog.messages if usage_log in m]
    for number, why in ((2, "expected a mapping"), (3, "missing required key 'key'"),
                        (4, "event: expected one of checked, quarantined, pruned"),
                        (5, "functions[0].name: expected a string"), (6, "not valid JSON")):
        assert any(f"{usage_log}:{number}: " in m and why in m for m in skipped), \
            (number, skipped)
    assert [r.used_by for r in rows] == [["demo (train r0)"]]
    assert (stats.jobs_recorded, stats.lookups, stats.hits) == (1, 1, 0)
    json.loads(dumps(stats))  # --json prints it as standard JSON
    # A job line without a written entry carries no checksum field: a warm check of its key
    # need not parse it.
    store.append_usage(JobUsage(run="demo", job="train", functions=[
        UsedFunction(name="jit_train_step", key=STEP, hit=True)]))
    assert '"sha256"' not in store.usage_file.read_text().splitlines()[-1]


def sixty_four_ranks() -> list[InitReport]:
    """A GPU-like training attempt of 64 ranks made from the fixture's process 0: every rank
    loads the step under one key (rank 17 slower, rank 40 over the budget), one rank with a
    warning of its own; and a 64-rank prewarm before it."""
    train = next(r for r in load_reports(RUN) if (r.job, r.process_index) == ("train", 0))
    reports = []
    for rank in range(64):
        first_step = {17: 30.5, 40: 1900.0}.get(rank, 10.0 + rank / 100)
        functions = [dataclasses.replace(fn, seconds=fn.seconds + rank / 1000)
                     for fn in train.functions]
        reports.append(dataclasses.replace(
            train, process_index=rank, process_count=64, functions=functions,
            time_to_first_step_s=first_step, ranks_wait_s=20.0 if rank == 0 else 0.5,
            warnings=train.warnings if rank == 0 else []))
        reports.append(dataclasses.replace(
            train, job="prewarm", process_index=rank, process_count=64, lookups=1, hits=0,
            functions=[dataclasses.replace(train.functions[0], hit=False, seconds=6.8)],
            warnings=[], time_to_first_step_s=16.0))
    return sorted(reports, key=lambda r: (r.job != "prewarm", r.process_index))


def test_a_report_of_64_ranks_reads_in_a_screen_and_all_shows_every_row() -> None:
    reports = sixty_four_ranks()
    manifest = STORE.manifest()
    headline = summarize(reports, manifest, "demo", STORE)
    assert len(headline) <= 10
    assert headline[0] == "train restart 0, process 0: warm"
    assert headline[1] == ("jit_train_step: HIT on processes 0-63 (restart 0), loaded in "
                           "0.23-0.29 s; prewarm compiled it in 6.84 s, so this saved "
                           "6.55-6.61 s on each")
    assert headline[2] == (
        "time to first step (restart 0): 10.00-1900.00 s on processes 0-63 (slowest: process "
        "40), OVER the 1800 s budget on process 40; waiting for the other ranks up to 20.00 s "
        "(process 0)")
    text = format_table(reports, PrewarmedFunctions.of(manifest), 0.5)
    rows = text.splitlines()
    table = rows[:rows.index("")]
    assert [row.split()[:3] for row in table[1:]] == [
        ["prewarm", "0", "0-63"], ["train", "0", "0-39,"], ["train", "0", "40"]]
    assert table[2].split()[3] == "41-63" and table[3].endswith("OVER BUDGET  warm")
    functions = rows[rows.index("") + 2:]
    assert functions[0].startswith("  prewarm r0 p0-p63  jit_train_step")
    assert "  train   r0 p0      jit_train_step               HIT          0.23 s  " \
           "jit_train_step-aaaaaaaaaaaaaaaa  prewarmed" in functions  # its warning sets it apart
    assert "  train   r0 p1-p63  jit_train_step               HIT      0.23-0.29 s  " \
           "jit_train_step-aaaaaaaaaaaaaaaa  prewarmed" in functions
    assert len(rows) < 20
    everything = format_table(reports, PrewarmedFunctions.of(manifest), 0.5,
                              show_all=True).splitlines()
    assert len(everything[:everything.index("")]) == 1 + 128
    assert sum(line.startswith("  train   r0 p63 ") for line in everything) == 3


def test_the_init_phases_add_up_per_process_and_the_headline_names_the_dominant_one() -> None:
    reports = load_reports(RUN)
    lines = phase_table(reports, PrewarmedFunctions.of(STORE.manifest()))
    header = next(line for line in lines if line.startswith("processes"))
    assert header.split() == ["processes", "imports", "distributed", "trace", "lower",
                              "compile", "cache", "load", "first", "step", "other", "total"]
    row = next(line.split() for line in lines if line.startswith("train r0 p0  warm"))
    assert row[-1] == "10.99" and row[4] == "2.10" and row[-2] == "0.50"
    assert any(line.startswith("train r0 p1  cold") for line in lines)
    assert "  train   r0 p0  jit_train_step: trace 0.45 + lower 0.20 + cache load 0.23" in lines
    assert not any("jit_helper:" in line for line in lines)  # not a prewarmed target
    assert warm_start_lines(reports) == [
        "warm start (train r0 p0): 10.99 s to the first step, most of it first step (6.85 s, "
        "62%); then imports 2.10 s, distributed 0.60 s, other 0.50 s, trace 0.45 s, "
        "cache load 0.23 s, lower 0.20 s, compile 0.06 s",
        "  the first step's collectives wait for every process: process 1 compiled for 7.16 s"]


def test_cold_and_warm_attempts_are_shown_side_by_side(tmp_path: Path) -> None:
    """The run dir's first-step history: each attempt's last finding (a guess replaced by a
    later one), the newest cold and the newest warm attempt; how each first step was found
    when they differ; a torn line skipped."""
    guess = "the first execution of jit_step, the function with the largest inputs so far"
    lines = [FirstStep(0, 100.0, 0.9, "the first execution of jit__lambda", 0, 2),
             FirstStep(0, 100.0, 7.33, guess, 0, 7,  # the same attempt, later
                       prewarmed_missed={"jit_step": 5.0}),
             FirstStep(0, 200.0, 1.62, "the first execution of jit_step", 7, 7,
                       prewarmed_hit=["jit_step"])]
    path = first_steps_path(tmp_path)
    path.write_text("".join(dumps(line) + "\n" for line in lines) + '{"restart": 0, "sta')
    history = load_first_steps(tmp_path)
    assert history == lines
    assert first_step_lines(history) == [
        "time to first step on process 0, this run's attempts: cold 7.33 s (0 of 7 lookups "
        "hit, restart 0), warm 1.62 s (7 of 7 lookups hit, restart 0, newest)",
        f"  cold first step: {guess}",
        "  warm first step: the first execution of jit_step"]
    assert first_step_lines([]) == []
    # One prewarmed function of two hit, the other compiled: not warm, whatever the lookups.
    partly = FirstStep(0, 300.0, 79.49, "trainer", 1, 4, prewarmed_hit=["jit_init"],
                       prewarmed_missed={"jit_train_step": 52.04})
    assert first_step_lines([*history, partly])[0] == (
        "time to first step on process 0, this run's attempts: partly warm (1 of 2 prewarmed "
        "functions hit: jit_train_step compiled 52.0 s) 79.49 s (1 of 4 lookups hit, "
        "restart 0, newest), warm 1.62 s (7 of 7 lookups hit, restart 0)")


def test_an_attempt_that_ran_no_step_is_neither_warm_nor_cold(tmp_path: Path) -> None:
    """A relaunch of a finished run: its trainer resumes at the last step and trains
    nothing; its one lookup is a checkpoint restore's helper, none of the run's two
    prewarmed functions. It ran no step, and says so with no time to first step in the
    headline, the table, status and the JSON; the first-step history shows the attempts
    that ran one."""
    guess = ("the first execution of jit__identity_fn, the function with the largest inputs "
             "so far (no prewarmed step has run yet; mark_first_step() says it exactly)")
    helper = FunctionRecord(name="jit__identity_fn", key="jit__identity_fn-ab", hit=False,
                            seconds=0.04)
    report = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                        cache_dir=str(tmp_path), init_budget_s=1.0, lookups=1,
                        time_to_first_step_s=4.05, first_step_from=guess, run_prewarmed=2,
                        functions=[helper])
    assert (report.label, report.first_step_s, report.over_budget) == ("no step run", None,
                                                                       False)
    empty = LocalStore(tmp_path)
    assert summarize([report], empty.manifest(), "demo", empty)[0] == \
        "train restart 0, process 0: no step run"
    row = format_table([report], PrewarmedFunctions.of({}), 1.0).splitlines()[1].split()
    assert row[8:] == ["-", "1", "no", "step", "run"], row  # first_step_s, budget_s, start
    assert attempt_summaries([report]) == [
        "attempt r0: no step run; 0 hit(s) of 1 lookup(s) on process 0, compile 0.00 s, "
        "no first step"]
    data = json.loads(dumps(report))
    assert (data["label"], data["first_step_s"]) == ("no step run", None)
    assert from_json(InitReport, data, "again") == report
    # A step the trainer said it ran (mark_first_step), or a run with nothing prewarmed:
    # labelled by its lookups, as before.
    assert dataclasses.replace(report, first_step_from="trainer").label == "cold"
    assert dataclasses.replace(report, run_prewarmed=0).label == "cold"
    # A step renamed since its prewarm looks none of the prewarmed names up, but compiles a
    # step-sized program: cold, with its time to first step.
    renamed = dataclasses.replace(report, functions=[dataclasses.replace(
        helper, name="jit_step", key="jit_step-cd", seconds=3.2)])
    assert (renamed.label, renamed.first_step_s) == ("cold", 4.05)

    warm = FirstStep(0, 100.0, 1.62, "the first execution of jit_step", 2, 2,
                     prewarmed_hit=["jit_step", "jit_init"], run_prewarmed=2)
    idle = FirstStep(0, 200.0, 4.05, guess, 0, 1, run_prewarmed=2)
    assert idle.label == "no step run"
    assert dataclasses.replace(idle, compiled_a_step=True).label == "cold"
    assert first_step_lines([warm, idle]) == [
        "time to first step on process 0, this run's attempts: warm 1.62 s (2 of 2 lookups "
        "hit, restart 0, newest)"]


def test_input_elements_are_counted_from_jax_s_lowering_line() -> None:
    assert input_elements("(ShapedArray(bfloat16[4,5]), ShapedArray(uint32[2]), "
                          "ShapedArray(key<fry>[]), ShapedArray(float32[]))") == 24


def test_the_prewarm_row_the_prefetch_and_a_forgotten_record_say_what_they_saw(
        tmp_path: Path) -> None:
    """Each line says what its part saw: a prewarm that found every target WARM looked
    nothing up, and its row counts what it found (`N compiled, M already WARM`); a
    prefetched executable nobody asked for by the first step was released then (a lookup
    of it after the step, which hit, is no contradiction); a prewarm record the attempt's
    miss made the run forget is one line in the headline and in `jaxwarm status`."""
    prewarm = InitReport(job="prewarm", restart_count=0, process_index=0, process_count=1,
                         cache_dir=str(tmp_path), init_budget_s=1.0, judged_warm=2)
    assert did(prewarm) == "0 compiled, 2 already WARM"
    assert did(dataclasses.replace(prewarm, judged_warm=0, lookups=2, hits=1)) == \
        "1 compiled, 1 already WARM"

    decode = FunctionRecord(name="jit_decode", key="jit_decode-ab", hit=True, seconds=0.01,
                            prewarmed=True)
    forgot = ReportWarning(PREWARM_FORGOTTEN, "the prewarm record of run 'mx64' is forgotten")
    train = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                       cache_dir=str(tmp_path), init_budget_s=60.0, lookups=1, hits=1,
                       time_to_first_step_s=2.0, first_step_from="trainer",
                       functions=[decode], warnings=[forgot],
                       prefetch=PrefetchReport(1.0, 100, 10, [Prefetched(
                           "jit_decode", "jit_decode-ab", UNUSED, 10, 0.02)]))
    empty = LocalStore(tmp_path)
    lines = summarize([train], empty.manifest(), "demo", empty)
    assert "prefetch (process 0, from 1.00 s): jit_decode not asked for by the first step, " \
           "released (loaded in 0.02 s); at most 10 bytes held (cache.prefetch_max_size " \
           "100)" in lines, lines
    assert lines.count(forgot.text) == 1
    assert attempt_summaries([train])[1:] == [f"attempt r0: {forgot.text}"]


def test_the_warm_start_names_the_trainer_s_own_init_as_the_ledger_did(tmp_path: Path) -> None:
    """A MaxText-like warm start whose time went mostly to the trainer's imports after jax's
    and its own set-up: the headline says the trainer's own init, by the names the init
    ledger gave it (`import maxtext`), and "other" only for what nothing named (jaxwarm's
    bookkeeping, what no sample saw)."""
    step = FunctionRecord(name="jit_train_step", key="jit_train_step-ab", hit=True,
                          seconds=0.5, prewarmed=True)
    phases = [InitPhase(IMPORTS, 1.2), InitPhase(LOAD, 0.5, "jit_train_step"),
              InitPhase(FIRST_STEP, 0.3), InitPhase(OTHER, 3.71, "import maxtext"),
              InitPhase(OTHER, 0.57, "import pathwaysutils"),
              InitPhase(OTHER, 0.4, "maxtext.train"), InitPhase(OTHER, 0.3, "jaxwarm"),
              InitPhase(OTHER, 0.25)]
    warm = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                      cache_dir=str(tmp_path), init_budget_s=60.0, lookups=1, hits=1,
                      time_to_first_step_s=7.23, first_step_from="trainer",
                      functions=[step], phases=phases)
    assert warm_start_lines([warm]) == [
        "warm start (train r0 p0): 7.23 s to the first step, most of it the trainer's own "
        "init (4.68 s, 65%, import maxtext 3.71 s, import pathwaysutils 0.57 s, maxtext.train "
        "0.40 s); then imports 1.20 s, other 0.55 s, cache load 0.50 s, first step 0.30 s"]
    # The phase table (and --plot, from the same folded rows) says the same: a column of its
    # own for the trainer's init, "other" only for what nothing named.
    table = phase_table([warm], PrewarmedFunctions.of({}))
    header = table[table.index(next(line for line in table if line.startswith("processes")))]
    assert "the trainer's own init" in header
    row = next(line for line in table if line.startswith("train r0 p0"))
    assert row.split()[-3:] == ["4.68", "0.55", "7.23"]
    # Where it is not the largest phase, the headline still names its largest part.
    slow_load = dataclasses.replace(warm, phases=[*phases, InitPhase(LOAD, 6.0)],
                                    time_to_first_step_s=13.23)
    assert "then the trainer's own init 4.68 s (import maxtext 3.71 s), imports" in \
        warm_start_lines([slow_load])[0]
    assert fold_owners([warm], PrewarmedFunctions.of({})) == [
        {"import maxtext": 3.71, "import pathwaysutils": 0.57, "maxtext.train": 0.4}]

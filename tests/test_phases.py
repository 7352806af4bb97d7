"""The init phases split a process's time to first step among JAX's own spans and jaxwarm's
timers: every instant to exactly one phase, the most specific, and the rest to `other`. Pure:
spans made by hand (the demo's real ones are checked in tests/test_demo.py)."""

from __future__ import annotations

import pytest

from jaxwarm.core.records import (
    COMPILE,
    DISTRIBUTED,
    FIRST_STEP,
    IMPORTS,
    LOAD,
    LOWER,
    OTHER,
    RANKS_WAIT,
    TRACE,
)
from jaxwarm.job.record.phases import PhaseClock, Span, partition


def seconds(phases: list, phase: str, function: str | None = None) -> float:
    return sum(p.seconds for p in phases if p.phase == phase
               and (function is None or p.function == function))


def test_phases_add_up_and_the_most_specific_span_wins() -> None:
    spans = [Span(IMPORTS, 0.0, 3.0),
             Span(DISTRIBUTED, 2.0, 4.0),           # inside the start-up: carved out of it
             Span(TRACE, 5.0, 7.0, "jit_step"),
             Span(COMPILE, 5.5, 6.0, "jit_helper"),  # an eager compile during the trace
             Span(LOWER, 7.0, 8.0, "jit_step"),
             Span(LOAD, 8.0, 8.5, "jit_step"),
             Span(FIRST_STEP, 8.5, 10.0)]
    phases = partition(spans, 0.0, 10.0)
    assert sum(p.seconds for p in phases) == pytest.approx(10.0)
    assert seconds(phases, IMPORTS) == pytest.approx(2.0)
    assert seconds(phases, DISTRIBUTED) == pytest.approx(2.0)
    assert seconds(phases, TRACE, "jit_step") == pytest.approx(1.5)
    assert seconds(phases, COMPILE, "jit_helper") == pytest.approx(0.5)
    assert seconds(phases, LOAD, "jit_step") == pytest.approx(0.5)
    assert seconds(phases, OTHER) == pytest.approx(1.0)  # 4-5: no timer ran
    assert [p.phase for p in phases][0] == IMPORTS and phases[-1].phase == OTHER


def test_a_nested_span_of_the_same_phase_counts_for_the_outer_function() -> None:
    phases = partition([Span(TRACE, 1.0, 4.0, "jit_outer"), Span(TRACE, 2.0, 3.0, "jit_inner")],
                       0.0, 4.0)
    assert seconds(phases, TRACE, "jit_outer") == pytest.approx(3.0)
    assert seconds(phases, TRACE, "jit_inner") == 0.0


def test_spans_outside_the_window_are_clipped() -> None:
    phases = partition([Span(COMPILE, -5.0, 1.0, "f"), Span(COMPILE, 9.0, 20.0, "g")], 0.0, 10.0)
    assert sum(p.seconds for p in phases) == pytest.approx(10.0)
    assert seconds(phases, COMPILE, "g") == pytest.approx(1.0)


def test_the_first_step_starts_where_the_steps_compile_or_load_ended() -> None:
    clock = PhaseClock(start_time=0.0)
    clock.hook_time = 1.0
    clock.add(Span(LOAD, 2.0, 3.0, "jit_step"))
    clock.add(Span(COMPILE, 3.0, 3.5, "jit_metrics"))  # a small compile after the step's load
    phases = clock.finish(6.0, {"jit_step"})
    assert seconds(phases, FIRST_STEP) == pytest.approx(2.5)  # 3.5 to 6: the compile wins 3-3.5
    assert sum(p.seconds for p in phases) == pytest.approx(6.0)
    clock.add(Span(COMPILE, 7.0, 8.0, "later"))  # after the first step: not kept
    assert all(span.function != "later" for span in clock.spans())


def test_the_first_execution_starts_after_the_ranks_meeting() -> None:
    """Process 0 loaded the step, then waited at the meeting for a rank still compiling it:
    its first execution (where MLPerf's init_stop is dated) begins after that wait."""
    clock = PhaseClock(start_time=0.0)
    clock.hook_time = 1.0
    clock.add(Span(LOAD, 2.0, 3.0, "jit_step"))
    clock.add(Span(RANKS_WAIT, 3.0, 5.0, "jit_step"))
    phases = clock.finish(6.0, {"jit_step"})
    assert clock.first_step_start == 5.0
    assert seconds(phases, RANKS_WAIT) == pytest.approx(2.0)
    assert seconds(phases, FIRST_STEP) == pytest.approx(1.0)
    alone = PhaseClock(start_time=0.0)  # no meeting (one process): where the load ended
    alone.add(Span(LOAD, 2.0, 3.0, "jit_step"))
    alone.finish(6.0, {"jit_step"})
    assert alone.first_step_start == 3.0


def test_a_job_without_a_step_has_no_first_step_phase() -> None:
    clock = PhaseClock(start_time=0.0)
    clock.hook_time = 1.0
    clock.add(Span(COMPILE, 2.0, 3.0, "jit_step"))
    phases = clock.finish(4.0, None)
    assert seconds(phases, FIRST_STEP) == 0.0 and seconds(phases, OTHER) == pytest.approx(2.0)

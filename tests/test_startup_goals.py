"""bench.startup's targets: issue 40's "warm with prefetch never slower than warm" judged on
the medians of the arms and on each repetition's pair (the two launches of a pair ran one
after the other, so a drift of the machine's load falls on both). Pure: no launch."""

from __future__ import annotations

from bench.startup import DROPPED, WARM, Launch, goals, pair_ratios


def launch(arm: str, prefetch: bool, repeat: int, seconds: float) -> Launch:
    return Launch(arm, prefetch, repeat, seconds, {"other": seconds / 2}, step_hit=True)


def test_pair_ratios_and_goals_judge_the_medians_and_the_pairs_apart() -> None:
    # The medians say 101/100 (slower); two of three pairs were faster with prefetch.
    launches = [launch(WARM, False, 0, 100.0), launch(WARM, True, 0, 99.0),
                launch(WARM, True, 1, 101.0), launch(WARM, False, 1, 98.0),
                launch(WARM, False, 2, 120.0), launch(WARM, True, 2, 119.0)]
    assert pair_ratios(launches, WARM) == [0.99, 101.0 / 98.0, 119.0 / 120.0]
    assert pair_ratios(launches, DROPPED) == []
    checks = {check.measurement: check for check in goals(launches)}
    medians = checks["warm: with prefetch / without (time to first step)"]
    assert (medians.measured, medians.met) == ("1.010", False)
    paired = checks["warm: the same, per alternated pair (median of 3)"]
    assert paired.measured.startswith("0.992 (0.990, 1.031, 0.992)") and paired.met
    assert not any(name.startswith(DROPPED) for name in checks)

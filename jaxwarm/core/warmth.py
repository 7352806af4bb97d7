"""The one label of a training attempt: `warm`, `partly warm (...)`, `cold`, or `no step
run`, from the prewarmed functions it looked up. Every reader says it in these words (the
report's table and headline, the plot, `jaxwarm status`, the JSON), through the records'
properties (`InitReport.label`, `FirstStep.label`).

Pure: a function of a record's fields, apart from the schema that holds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the schema imports this module for its derived fields
    from jaxwarm.core.records import FunctionRecord


def prewarmed_outcomes(functions: list[FunctionRecord]) -> tuple[list[str], dict[str, float]]:
    """The prewarmed functions a process looked up, by name, each decided by its first
    lookup (a later compile of other shapes, after the first step, is not the start's):
    those that hit, and those that missed with their compile seconds."""
    hit: list[str] = []
    missed: dict[str, float] = {}
    for fn in functions:
        # key None: compiled without a lookup (the cache off for it); a name already seen
        # was decided by its first lookup.
        if fn.prewarmed and fn.key is not None and fn.name not in hit and fn.name not in missed:
            if fn.hit:
                hit.append(fn.name)
            else:
                missed[fn.name] = fn.seconds
    return hit, missed


# The label of a training process that ran no step (`ran_no_step`): neither warm nor cold.
NO_STEP = "no step run"


# JAX's default persistent-cache threshold: a compile shorter than this is a helper (a
# checkpoint restore's identity function), not a step worth caching.
STEP_COMPILE_S = 1.0


def compiled_a_step(functions: list[FunctionRecord]) -> bool:
    """Whether a process compiled (missed) anything as long as a step's compile."""
    return any(not fn.hit and fn.seconds >= STEP_COMPILE_S for fn in functions)


def ran_no_step(run_prewarmed: int, hit: list[str], missed: dict[str, float],
                first_step_from: str | None, compiled: bool) -> bool:
    """A training process of a run with prewarmed functions that looked up none of them,
    compiled nothing of a step's size (`compiled_a_step`) and was not told of a step by its
    trainer (mark_first_step) ran no step: e.g. a relaunch of a finished run, whose trainer
    resumes at its last step and trains nothing. Its lookups (a checkpoint restore's small
    helpers) say nothing of the prewarm. One that compiled a step-sized program (a step
    renamed since its prewarm, so none of the prewarmed names is looked up) ran a program
    the prewarm did not cover, and is labelled by its lookups (`cold`)."""
    return (run_prewarmed > 0 and not hit and not missed and not compiled
            and first_step_from != "trainer")


def warmth(hit: list[str], missed: dict[str, float], hits: int, lookups: int) -> str:
    """The one label of a training attempt (report table, headline, plot, status, JSON):
    `warm` only when every prewarmed function it looked up hit, `partly warm (1 of 2
    prewarmed functions hit: jit_train_step compiled 52.0 s)`, or `cold`. Without a
    prewarmed function among its lookups, `cold` when none hit, else it says that nothing
    was prewarmed, with its lookups; with no lookup at all (the cache off), nothing."""
    if not hit and not missed:
        if not lookups:
            return ""
        return "cold" if not hits else f"no prewarm on record ({hits} of {lookups} lookups hit)"
    if not missed:
        return "warm"
    if not hit:
        return "cold"
    compiled = ", ".join(f"{name} compiled {seconds:.1f} s" for name, seconds in missed.items())
    return (f"partly warm ({len(hit)} of {len(hit) + len(missed)} prewarmed functions hit: "
            f"{compiled})")

"""Reading a run's records back, and what they say before any word is written: the init
reports, verify's answer and the first-step log of a run dir (`jaxwarm.core.rundir`), the
prewarmed targets among a trainer's many compiles, and the processes that did the same
folded together. `render` turns these into text, `plot` into a picture.

A report among many that cannot be read is skipped with one line naming it; the one file a
command answers from (verify's result) is an error naming it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import RefusedFile, read_bounded
from jaxwarm.core.jsonio import RECORD_CAP, from_json, parse_json, read_lines, read_record
from jaxwarm.core.records import (
    ORDER,
    OTHER,
    TRAINER_INIT,
    FirstStep,
    FunctionRecord,
    InitReport,
    PrewarmDecision,
    VerifyResult,
    differences,
    parse_first_step,
)
from jaxwarm.core.rundir import (
    first_steps_path,
    prewarm_decision_path,
    report_paths,
    verify_result_path,
)
from jaxwarm.core.words import ranges
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.manifest import ManifestEntry

# One line (a few hundred bytes) per training attempt of the run.
FIRST_STEPS_CAP = 16 << 20


def load_reports(run_dir: str | Path) -> list[InitReport]:
    """Every readable report of a run, in job, restart, process order; an unreadable or
    malformed one is skipped with one line naming it (`jsonio.read_record`)."""
    return [report for _, path in report_paths(run_dir)
            if (report := read_record(InitReport, path)) is not None]


def load_verdicts(run_dir: str | Path, invocation: str) -> VerifyResult | None:
    """The answer the verify job of `invocation` wrote for the run; None when it wrote none
    (no file, or one an earlier verify left). Unlike a report among many, it is the one file
    the command answers from, so an unreadable one is an error naming it."""
    path = verify_result_path(run_dir)
    try:
        text = read_bounded(path, RECORD_CAP, "a verify result")
    except FileNotFoundError:
        return None
    except RefusedFile:  # an OSError too, whose own line says what the file is instead
        raise
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the verify job's result ({exc.strerror})") \
            from None
    result = from_json(VerifyResult, parse_json(text, str(path)), str(path))
    return result if result.invocation == invocation else None


def load_first_steps(run_dir: str | Path) -> list[FirstStep]:
    """Every training attempt's first step, across launches of the run, in order."""
    return read_lines(first_steps_path(run_dir), parse_first_step, FIRST_STEPS_CAP,
                      "a first-step log")


def moved_cache_dir(report: InitReport) -> bool:
    """Whether the process ended up on another cache dir than the one jaxwarm gave it (a
    trainer's own, followed under `cache.enforce: false`): then that is why it missed. A
    staged process was given its node's copy."""
    given = report.stage.dir if report.stage is not None else \
        report.environment.get("JAX_COMPILATION_CACHE_DIR", report.cache_dir)
    return report.cache_dir != given


def fingerprinted_decision(run_dir: str | Path | None) -> PrewarmDecision | None:
    """The latest launch's prewarm decision, with its fingerprint (None: not on record)."""
    if run_dir is None:
        return None
    path = prewarm_decision_path(run_dir)
    decision = read_record(PrewarmDecision, path) if path.is_file() else None
    return decision if decision is not None and decision.fingerprint is not None else None


def since_prewarm(run_dir: str | Path | None, store: CacheStore, key: str) -> list[str] | None:
    """What changed between the prewarm that left the entry `key` and the latest launch of
    the run, as their fingerprints say (`fingerprint.differences`): [] when the launch ran
    under the prewarm's own fingerprint (it ran that prewarm, or relied on it), None when
    either fingerprint is unknown."""
    decision = fingerprinted_decision(run_dir)
    if decision is None or decision.fingerprint is None:
        return None
    record = next((r for r in reversed(store.prewarms().values()) if key in r.keys),
                  None)
    if record is not None:
        return differences(record.fingerprint, decision.fingerprint)
    # A record a miss made the training job forget had the launch's fingerprint.
    return [] if decision.prewarm or key in decision.keys else None


@dataclass(frozen=True)
class PrewarmedFunctions:
    """What the prewarm put in the cache, to pick a run's rows that matter out of the many
    compiles a real trainer makes: keys the manifest lists, and the (name, abstract
    signature) of each prewarmed function. The signature tells two functions of one name
    apart: only the one the prewarm compiled is a target."""

    keys: frozenset[str]
    functions: frozenset[tuple[str, str | None]]

    @classmethod
    def of(cls, manifest: dict[str, ManifestEntry]) -> PrewarmedFunctions:
        return cls(frozenset(manifest),
                   frozenset((e.function, e.signature) for e in manifest.values()))

    def __contains__(self, fn: FunctionRecord) -> bool:
        if fn.prewarmed or fn.key in self.keys:
            return True
        # Without a signature on either side, the name alone decides.
        return any(None in (fn.signature, known) or known == fn.signature
                   for name, known in self.functions if name == fn.name)


def fold(reports: list[InitReport], shape: Callable[[InitReport], Hashable],
         show_all: bool) -> list[list[InitReport]]:
    """The processes of each job attempt whose `shape` is equal, together (in the order of
    their first process): 64 ranks that did the same read as one line. `show_all`: one
    process per group."""
    groups: dict[Hashable, list[InitReport]] = {}
    for r in reports:
        groups.setdefault((r.job, r.restart_count,
                           r.process_index if show_all else shape(r)), []).append(r)
    return list(groups.values())


# The init ledger's name for jaxwarm's own code (`jaxwarm.job.record.ledger.package_of`): its
# bookkeeping stays in "other".
JAXWARM = "jaxwarm"


def trainer_owners(report: InitReport) -> list[tuple[str, float]]:
    """What the init ledger named of the trainer's own code in one process's "other" (its
    imports by package, `import maxtext`, and its modules), largest first."""
    return sorted(((p.function, p.seconds) for p in report.phases
                   if p.phase == OTHER and p.function and p.function != JAXWARM),
                  key=lambda item: -item[1])


def phase_totals(report: InitReport) -> dict[str, float]:
    """Seconds per init phase of one process (all functions together), in `ORDER`, with
    "other" split as the init ledger named it: what it named of the trainer's own code is
    TRAINER_INIT (`trainer_owners`); "other" keeps only what nothing names (jaxwarm's own
    bookkeeping, what no sample saw). The table, the plot and the headline say the same."""
    totals: dict[str, float] = {}
    for phase in report.phases:
        totals[phase.phase] = totals.get(phase.phase, 0.0) + phase.seconds
    named = sum(seconds for _, seconds in trainer_owners(report))
    if named > 0.0:
        totals[TRAINER_INIT] = named
        totals[OTHER] = totals.get(OTHER, 0.0) - named
    return {name: totals[name] for name in ORDER if name in totals}


def _folded(reports: list[InitReport], targets: PrewarmedFunctions) -> list[list[InitReport]]:
    """The processes folded into one row (or bar): one job attempt's processes that hit and
    missed the same prewarmed functions."""
    def outcome(report: InitReport) -> Hashable:
        return tuple(sorted((fn.name, fn.hit) for fn in report.functions
                            if fn in targets or fn.hit))

    return fold([r for r in reports if r.phases], outcome, show_all=False)


def fold_phases(reports: list[InitReport],
                targets: PrewarmedFunctions) -> list[tuple[str, dict[str, float]]]:
    """One row (or bar) per job attempt and outcome: its label and the median seconds per
    phase of the processes that hit and missed the same prewarmed functions."""
    bars = []
    for members in _folded(reports, targets):
        job, restart = members[0].job, members[0].restart_count
        who = _processes([r.process_index for r in members])
        state = members[0].label
        totals = [phase_totals(r) for r in members]
        phases = {name: statistics.median(t.get(name, 0.0) for t in totals) for name in ORDER
                  if any(name in t for t in totals)}
        bars.append((f"{job} r{restart} {who}" + (f"  {state}" if state else ""), phases))
    return bars


def fold_owners(reports: list[InitReport], targets: PrewarmedFunctions) -> list[dict[str, float]]:
    """For each row of `fold_phases`, what the init ledger named of the trainer's own init
    (seconds, largest first) in its first process."""
    return [dict(trainer_owners(members[0])) for members in _folded(reports, targets)]


def _processes(indices: list[int]) -> str:
    """`p0`, `p1-p63 (63 processes, median)`, `p1, p4, p9 (3 processes, median)`."""
    if len(indices) == 1:
        return f"p{indices[0]}"
    return f"{ranges(indices, 'p')} ({len(indices)} processes, median)"

"""Init reports as text: the headline, one row per job attempt and process, the init phases,
verify's verdicts. What the reports say is read and folded in `jaxwarm.report.read`.

On CPU only process 0 can hit (JAX hashes each process's local devices into the key there),
so the table shows every process as it is instead of summarising the run as "hit".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from jaxwarm.core.environment import size_cap
from jaxwarm.core.records import (
    AFTER_FIRST_STEP,
    COMPILE,
    FIRST_STEP,
    LOAD,
    NOT_LOADED,
    NOT_LOOKED_UP,
    ORDER,
    OTHER,
    PREWARM_FORGOTTEN,
    RANKS,
    SETTING_CHANGED,
    TRAIN,
    TRAINER_INIT,
    USED,
    VERIFY,
    FirstStep,
    FunctionRecord,
    InitReport,
    Verdict,
    VerifyResult,
)
from jaxwarm.core.words import plural, ranges
from jaxwarm.jaxkey.entryformat import split_key
from jaxwarm.report.read import (
    PrewarmedFunctions,
    fingerprinted_decision,
    fold,
    fold_phases,
    moved_cache_dir,
    phase_totals,
    since_prewarm,
    trainer_owners,
)
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.manifest import Manifest, ManifestEntry
from jaxwarm.store.misses import MissContext


def short_key(key: str | None) -> str:
    """Module name plus the first 16 hex digits: enough to tell keys apart in a table."""
    if key is None:
        return "-"
    name, digest = split_key(key)
    return f"{name}-{digest[:16]}" if name else key[:16]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _span(values: list[float | None]) -> str:
    """One figure for one process, the range for several: `0.23`, `0.23-0.91`."""
    known = [value for value in values if value is not None]
    if not known:
        return "-"
    low, high = _seconds(min(known)), _seconds(max(known))
    return low if low == high else f"{low}-{high}"


def _status(report: InitReport) -> str:
    if report.job != TRAIN or report.first_step_s is None:
        return ""
    return "OVER BUDGET" if report.over_budget else "ok"


def did(report: InitReport) -> str:
    """What a job's process did with the cache, in the table's last column: a training
    attempt's label (`InitReport.label`: warm, partly warm, cold); what a prewarm compiled
    and found; a verify job looks nothing up (its keys are predicted, not looked up)."""
    if report.job == TRAIN:
        return report.label
    if report.job == VERIFY:
        return "predicted keys, compiled nothing" if not report.lookups else \
            f"looked up {report.lookups}, {report.hits} in the cache"
    # What it judged WARM it never looked up; a target that hit at its compile was WARM too.
    return f"{report.misses} compiled, {report.judged_warm + report.hits} already WARM"


def _outcome(fn: FunctionRecord) -> str:
    if fn.key is None:
        return "NO-CACHE"
    return "HIT" if fn.hit else "MISS"


def _where(group: list[InitReport]) -> str:
    r = group[0]
    return f"{r.job:<7} r{r.restart_count} {ranges([g.process_index for g in group], 'p')}"


def _shared_names(functions: list[FunctionRecord]) -> set[str]:
    """Names that more than one function of a process carries (told apart by signature)."""
    seen: dict[str, set[str | None]] = {}
    for fn in functions:
        seen.setdefault(fn.name, set()).add(fn.signature)
    return {name for name, signatures in seen.items() if len(signatures) > 1}


@dataclass(frozen=True)
class _Shown:
    """Which compiles of one process get a line of their own, and which are summed up."""

    lines: list[tuple[str, FunctionRecord, bool]]  # (name shown, record, prewarmed)
    small: list[float]

    @classmethod
    def of(cls, r: InitReport, targets: PrewarmedFunctions, threshold_s: float,
           show_all: bool) -> _Shown:
        shared = _shared_names(r.functions)
        lines, small = [], []
        for fn in r.functions:
            target = fn in targets
            if not (target or show_all or fn.seconds >= threshold_s):
                small.append(fn.seconds)
                continue
            name = f"{fn.name} [{fn.signature or '?'}]" if fn.name in shared else fn.name
            lines.append((name, fn, target))
        return cls(lines, small)

    def shape(self) -> tuple:
        return (tuple((name, _outcome(fn), target) for name, fn, target in self.lines),
                bool(self.small))


def function_lines(group: list[InitReport], targets: PrewarmedFunctions, threshold_s: float,
                   show_all: bool, width: int = 0, name_width: int = 28) -> list[str]:
    """The compiles of a group of processes that did the same (`fold`): the prewarmed
    targets and every compile of at least `threshold_s` (what JAX would store), then the
    rest as one line unless `show_all`; seconds as a range and keys counted over the group.
    `width`, `name_width`: of the where column (job, restart, processes) and the name
    column, to align several groups."""
    shown = [_Shown.of(r, targets, threshold_s, show_all) for r in group]
    where = _where(group).ljust(width)
    lines: list[str] = []
    for index, (name, fn, target) in enumerate(shown[0].lines):
        records = [s.lines[index][1] for s in shown]
        keys = {record.key for record in records}
        key = short_key(fn.key) if len(keys) == 1 else f"{len(keys)} keys"
        tag = "PGLE profile-guided" if fn.pgle_optimized else "prewarmed" if target else ""
        lines.append(f"  {where}  {name:<{name_width}} {_outcome(fn):<8} "
                     f"{_span([record.seconds for record in records]):>8} s  {key}  "
                     f"{tag}".rstrip())
    if shown[0].small:
        counts = sorted({len(s.small) for s in shown})
        count = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        lines.append(f"  {where}  + {count} small compile(s) under {threshold_s:g} s "
                     f"(not prewarmed, not stored), {_span([sum(s.small) for s in shown])} s "
                     f"in all; --all lists them")
    for warning in group[0].warnings:
        if warning.kind != PREWARM_FORGOTTEN:  # the headline's line, not the process's doing
            lines.append(f"  WARNING {where.rstrip()}: {warning.text}")
    return lines


def format_table(reports: list[InitReport], targets: PrewarmedFunctions, threshold_s: float,
                 show_all: bool = False) -> str:
    """The init report as text: a summary row per process, then per-function rows; the
    processes of a job attempt that did the same are folded into one row (`p1-p63`), with
    their figures as ranges, unless `show_all`."""
    if not reports:
        return "no init reports yet"
    header = ("job", "restart", "proc", "lookups", "hits", "misses", "compile_s",
              "retrieval_s", "first_step_s", "budget_s", "init", "start")
    rows = [header]
    for group in fold(reports, lambda r: (r.lookups, r.hits, _status(r), did(r)), show_all):
        r = group[0]
        train = r.job == TRAIN  # only a training job runs a step, and its misses compile
        rows.append((r.job, str(r.restart_count), ranges([g.process_index for g in group]),
                     str(r.lookups), str(r.hits), str(r.misses) if train else "-",
                     _span([g.backend_compile_s for g in group]),
                     _span([g.retrieval_s for g in group]),
                     _span([g.first_step_s for g in group]) if train else "-",
                     f"{r.init_budget_s:.0f}" if train else "-", _status(r), did(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.append("")
    lines.append("functions (cache lookups and compiles, per process; [signature] where "
                 "functions share a name):")
    groups = fold(reports, lambda r: (_Shown.of(r, targets, threshold_s, show_all).shape(),
                                      tuple(w.text for w in r.warnings)), show_all)
    width = max(len(_where(group)) for group in groups)
    # A name with its signature (`jit__identity_fn [86d3921f0b8a]`) may pass the 28 columns.
    name_width = max([28] + [len(name) for group in groups for name, _, _ in
                             _Shown.of(group[0], targets, threshold_s, show_all).lines])
    for group in groups:
        lines.extend(function_lines(group, targets, threshold_s, show_all, width, name_width))
    return "\n".join(lines)


def phase_table(reports: list[InitReport], targets: PrewarmedFunctions) -> list[str]:
    """Where each process's time to first step went: one row per process (processes of one
    attempt that hit and missed the same functions folded into one row of their medians),
    one column per phase (they add up to `total`), then each prewarmed target's trace,
    lowering and compile or load on process 0 of each attempt."""
    timed = [r for r in reports if r.phases]
    if not timed:
        return []
    folded = fold_phases(timed, targets)
    columns = [name for name in ORDER if any(name in phases for _, phases in folded)]
    rows = [("processes", *columns, "total")]
    for label, phases in folded:
        rows.append((label, *(_seconds(phases.get(name)) for name in columns),
                     _seconds(sum(phases.values()))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["", "init phases (seconds from process start to the first step; they add up to "
                 "the total):"]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip() for row in rows]
    for r in timed:
        if r.process_index != 0:
            continue
        for name, parts in _target_phases(r, targets).items():
            lines.append(f"  {_where([r])}  {name}: " + " + ".join(
                f"{phase} {seconds:.2f}" for phase, seconds in parts))
        lines += ledger_lines(r)
    return lines


# The owners of "other" shown by name; the rest are summed.
LEDGER_OWNERS = 6


def ledger_lines(report: InitReport) -> list[str]:
    """The init ledger of one process: "other" by what its main thread was doing (the
    sampled owners, largest first; `unsampled`: what no sample saw), and what sampling cost."""
    owners = sorted(((p.function, p.seconds) for p in report.phases
                     if p.phase == OTHER and p.function), key=lambda item: -item[1])
    if not owners:
        return []
    shown = [f"{name} {seconds:.2f}" for name, seconds in owners[:LEDGER_OWNERS]]
    if len(owners) > LEDGER_OWNERS:
        shown.append(f"{len(owners) - LEDGER_OWNERS} more "
                     f"{sum(seconds for _, seconds in owners[LEDGER_OWNERS:]):.2f}")
    unsampled = sum(p.seconds for p in report.phases if p.phase == OTHER and not p.function)
    cost = report.sampling
    return [f"  {_where([report])}  init ledger: " + " + ".join(shown) + f" + unsampled "
            f"{unsampled:.2f}" + (f" ({cost.samples} samples, {cost.interval_s * 1000:g} ms "
                                  f"apart at first, {cost.cost_s:.3f} s of CPU)"
                                  if cost is not None else "")]


def _target_phases(report: InitReport,
                   targets: PrewarmedFunctions) -> dict[str, list[tuple[str, float]]]:
    """The phases spent on each prewarmed target of a process, by function name."""
    names = {name for name, _ in targets.functions} | \
        {fn.name for fn in report.functions if fn in targets}
    found: dict[str, list[tuple[str, float]]] = {}
    for phase in report.phases:
        if phase.function in names:
            found.setdefault(phase.function, []).append((phase.phase, phase.seconds))
    return found


def warm_start_lines(reports: list[InitReport]) -> list[str]:
    """Which phase dominates the latest warm start: the training attempt whose process 0
    loaded every prewarmed function it looked up from the cache (`InitReport.label`); the
    trainer's own init by what the ledger named (`trainer_owners`)."""
    starts = [r for r in reports if r.job == TRAIN and r.process_index == 0 and r.phases
              and r.label == "warm" and r.time_to_first_step_s]
    if not starts:
        return []
    start = max(starts, key=lambda r: r.restart_count)
    totals, owners = phase_totals(start), trainer_owners(start)
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    (top, seconds), rest = ranked[0], ranked[1:]
    total = sum(totals.values())
    named = "".join(f", {name} {value:.2f} s" for name, value in owners[:3]) + \
        (", ..." if len(owners) > 3 else "") if top == TRAINER_INIT else ""
    # The trainer's own init further down still names its largest part (`import maxtext`).
    largest = f" ({owners[0][0]} {owners[0][1]:.2f} s)" if owners else ""
    lines = [f"warm start (train r{start.restart_count} p0): {total:.2f} s to the first step, "
             f"most of it {top} ({seconds:.2f} s, {100 * seconds / total:.0f}%{named}); then "
             + ", ".join(f"{name} {value:.2f} s" + (largest if name == TRAINER_INIT else "")
                         for name, value in rest if value >= 0.005)]
    if top == FIRST_STEP:
        peers = [r for r in reports if r.job == TRAIN and r.restart_count == start.restart_count
                 and r.process_index != 0 and r.phases]
        slowest = max(peers, key=lambda r: phase_totals(r).get(COMPILE, 0.0), default=None)
        compiled = 0.0 if slowest is None else phase_totals(slowest).get(COMPILE, 0.0)
        if slowest is not None and compiled > phase_totals(start).get(LOAD, 0.0):
            lines.append(f"  the first step's collectives wait for every process: process "
                         f"{slowest.process_index} compiled for {compiled:.2f} s")
    return lines


def stage_lines(attempt: list[InitReport]) -> list[str]:
    """Node-local staging in one training attempt: one line for the nodes that read their
    own copy, one per node (and reason) that read the shared cache dir instead."""
    staged = [r.stage for r in attempt if r.stage is not None]
    copies = [s for s in staged if s.stager and s.fallback is None]
    lines = []
    if copies:
        dirs = sorted({s.dir for s in copies})
        where = dirs[0] if len(dirs) == 1 else f"{len(dirs)} dirs such as {dirs[0]}"
        lines.append(
            f"staging: {len(copies)} node(s) loaded the run's entries from their own copy "
            f"({where}): {sum(len(s.copied) + len(s.replaced) for s in copies)} copied "
            f"({sum(s.bytes_copied for s in copies)} bytes), "
            f"{sum(len(s.reused) for s in copies)} already there, at most "
            f"{max(s.seconds for s in copies):.2f} s per node")
    fallbacks = sorted({(s.node, s.fallback) for s in staged if s.fallback is not None},
                       key=lambda item: (item[0], str(item[1])))
    lines += [f"staging: node {node} read the shared cache dir: {why}" for node, why in fallbacks]
    return lines


def prefetch_lines(attempt: list[InitReport]) -> list[str]:
    """What `cache.prefetch` did on the first process that prefetched in one training
    attempt: each executable's outcome, load and wait, and the most it held."""
    report = next((r for r in attempt if r.prefetch is not None), None)
    if report is None or report.prefetch is None:
        return []
    done = report.prefetch
    each = "; ".join(
        f"{p.function} {p.outcome}" + ("" if p.outcome.startswith(NOT_LOADED) else
                                       f" (loaded in {p.load_s:.2f} s"
                                       + (f", the trainer waited {p.waited_s:.2f} s)"
                                          if p.outcome == USED else ")"))
        for p in done.executables)
    return [f"prefetch (process {report.process_index}, from {done.started_s:.2f} s): {each}; "
            f"at most {done.peak_bytes} bytes held (cache.prefetch_max_size "
            f"{done.max_size})"]


# The headline reads in a screen whatever the number of processes.
HEADLINE_LINES = 10


def summarize(reports: list[InitReport], manifest: Manifest, run: str, store: CacheStore,
              run_dir: str | Path | None = None) -> list[str]:
    """Headline lines, at most HEADLINE_LINES: the latest training attempt's label (warm,
    partly warm, cold), what it did with each prewarmed target (hit, on which processes,
    and how much that saved; or process 0's miss, and why: inputs that differ from the
    prewarm's, or the step's code, then the key components, against the same target
    only), its time to first step against the budget, and what the processes said once
    (a cache setting the trainer changed, ranks that did not see the same entry)."""
    train = [r for r in reports if r.job == TRAIN]
    if not train:
        return []
    latest = max(r.restart_count for r in train)
    attempt = sorted((r for r in train if r.restart_count == latest),
                     key=lambda r: r.process_index)
    targets = PrewarmedFunctions.of(manifest)
    # The attempt's label is process 0's (`InitReport.label`); without its report, none.
    label = attempt[0].label if attempt[0].process_index == 0 else ""
    lines: list[str] = [f"train restart {latest}, process 0: {label}"] if label else []
    said: list[str] = []
    for report in attempt:
        # A setting that differs from the prewarm's is said by the miss's own why line.
        said += [w.text for w in report.warnings if w.kind == RANKS or (
            report.process_index == 0 and w.kind in (SETTING_CHANGED, PREWARM_FORGOTTEN))]
        if report.process_index != 0:
            continue
        for fn in report.functions:
            if fn.key is None or fn not in targets:
                continue
            if fn.pgle_optimized:
                lines.append(pgle_line(fn, latest))
                continue
            if fn.hit:
                line = _hit_line(fn, attempt, manifest.get(fn.key), latest)
                if line not in lines:  # looked up again (PGLE on CPU, after its profiled runs)
                    lines.append(line)
                continue
            lines.append(f"{fn.name}: MISS on process 0 (restart {latest}), "
                         f"compiled in {fn.seconds:.2f} s")
            if moved_cache_dir(report):
                lines.append(f"  why: this process looked its entries up in "
                             f"{report.cache_dir}, the trainer's cache dir (below)")
            lines.extend(f"  why: {line}"
                         for line in _why(fn, report, manifest, run, store, run_dir))
    others = [r.process_index for r in attempt if r.process_index != 0]
    if others and not any(r.hits for r in attempt if r.process_index != 0):
        which = plural(len(others), "process", "processes")
        why = "on CPU JAX hashes each process's local devices into the key, so only " \
              "process 0 can hit" if attempt[0].environment.get("JAX_PLATFORMS") == "cpu" else \
            "they share process 0's keys here, so their rows below say why they missed"
        lines.append(f"{which} {ranges(others)}: no hits; {why}")
    lines += budget_lines(attempt) + stage_lines(attempt) + prefetch_lines(attempt) + \
        list(dict.fromkeys(said))
    if len(lines) > HEADLINE_LINES:
        more = len(lines) - HEADLINE_LINES + 1
        lines = lines[:HEADLINE_LINES - 1] + [
            f"... and {more} more line(s): the table below has them all"]
    return lines


def _why(fn: FunctionRecord, report: InitReport, manifest: Manifest, run: str,
         store: CacheStore, run_dir: str | Path | None) -> list[str]:
    """Why process 0 missed `fn`, against the prewarm the job compared it with, with what
    the launch's fingerprint saw change since that prewarm."""
    prewarmed = _prewarmed_entry(fn, manifest, run)
    decision = fingerprinted_decision(run_dir)
    return store.explain_miss(fn, manifest, MissContext(
        run=run, process_count=report.process_count, max_size=size_cap(report.environment),
        xla_flags=report.environment.get("XLA_FLAGS"),
        looked_in=report.cache_dir if moved_cache_dir(report) else None,
        since_prewarm=None if prewarmed is None else
        since_prewarm(run_dir, store, prewarmed.key), prewarm=prewarmed,
        changed=None if prewarmed is None or decision is None else
        store.changed_variables(prewarmed.key, decision.fingerprint)))


def pgle_line(fn: FunctionRecord, restart: int) -> str:
    """A target's PGLE-optimized executable (jaxwarm.jaxkey.pgle): JAX's second compile,
    with the profile of the first steps, or its load at a restart in place of both."""
    if fn.hit:
        return (f"{fn.name}: HIT of PGLE's profile-guided executable on process 0 (restart "
                f"{restart}), loaded in {fn.seconds:.2f} s: no first compile, no profiled steps")
    return (f"{fn.name}: PGLE's second, profile-guided compile on process 0 (restart "
            f"{restart}), {fn.seconds:.2f} s after the profiled steps; stored under "
            f"{short_key(fn.key)} for the restarts")


def _prewarmed_entry(fn: FunctionRecord, manifest: Manifest, run: str) -> ManifestEntry | None:
    """The prewarm the job compared the lookup `fn` with (perhaps another run's), else the
    run's newest prewarm of the function."""
    if fn.compared_with is not None and fn.compared_with in manifest:
        return manifest[fn.compared_with]
    return next((e for e in manifest.for_run(run) if e.function == fn.name), None)


def _hit_line(fn: FunctionRecord, attempt: list[InitReport], entry: ManifestEntry | None,
              restart: int) -> str:
    """A target process 0 loaded: which processes loaded it, how fast, what that saved."""
    loads = [other.seconds for r in attempt for other in r.functions
             if (other.name, other.signature) == (fn.name, fn.signature) and other.hit]
    hit_on = [r.process_index for r in attempt if any(
        (other.name, other.signature) == (fn.name, fn.signature) and other.hit
        for other in r.functions)]
    which = plural(len(hit_on), "process", "processes")
    if entry is None:
        saved = ""
    elif entry.compile_s <= 0.0:  # a prewarm that found the entry, not one that compiled it
        saved = "; the prewarm found it in the cache (no compile time on record)"
    else:
        slower = " (loading took longer than compiling)" if max(loads) > entry.compile_s \
            else ""
        saved = (f"; prewarm compiled it in {entry.compile_s:.2f} s, so this saved "
                 f"{_span([max(entry.compile_s - load, 0.0) for load in loads])} s"
                 f"{' on each' if len(hit_on) > 1 else ''}{slower}")
    return (f"{fn.name}: HIT on {which} {ranges(hit_on)} (restart {restart}), "
            f"loaded in {_span(list(loads))} s{saved}")


def budget_lines(attempt: list[InitReport]) -> list[str]:
    """One training attempt's time to first step over its processes, against the budget,
    and the longest any of them waited for the others (`jaxwarm.job.ranks`)."""
    timed = [r for r in attempt if r.first_step_s is not None]
    if not timed:
        return []
    budget = timed[0].init_budget_s
    slowest = max(timed, key=lambda r: r.first_step_s or 0.0)
    where = f"process {slowest.process_index}" if len(timed) == 1 else \
        f"processes {ranges([r.process_index for r in timed])} " \
        f"(slowest: process {slowest.process_index})"
    over = [r.process_index for r in timed if r.over_budget]
    verdict = f"OVER the {budget:.0f} s budget on {plural(len(over), 'process', 'processes')} " \
        f"{ranges(over)}" if over else \
        f"within the {budget:.0f} s budget"
    line = (f"time to first step (restart {timed[0].restart_count}): "
            f"{_span([r.first_step_s for r in timed])} s on {where}, {verdict}")
    waited = max(timed, key=lambda r: r.ranks_wait_s)
    if waited.ranks_wait_s >= 0.005:
        line += (f"; waiting for the other ranks up to {waited.ranks_wait_s:.2f} s "
                 f"(process {waited.process_index})")
    return [line]


def first_step_lines(history: list[FirstStep]) -> list[str]:
    """The newest attempt that was not warm (cold, partly warm) and the newest warm one of
    this run (`FirstStep.label`), side by side; each attempt's last finding counts (a
    guess may be replaced). An attempt that ran no step has no time to show."""
    attempts = sorted((step for step in {step.started: step for step in history}.values()
                       if not step.ran_no_step), key=lambda step: step.started)
    if not attempts:
        return []
    newest = attempts[-1]
    shown = [step for step in (
        next((s for s in reversed(attempts) if s.label != "warm"), None),
        next((s for s in reversed(attempts) if s.label == "warm"), None)) if step]

    def said(step: FirstStep) -> str:
        return (f"{step.label or 'no lookup'} {step.seconds:.2f} s ({step.hits} of "
                f"{step.lookups} lookups hit, restart {step.restart}"
                f"{', newest' if step is newest else ''})")

    lines = [f"time to first step on process 0, this run's attempts: "
             f"{', '.join(said(step) for step in shown)}"]
    if len({step.first_step_from for step in shown}) > 1:
        lines += [f"  {step.label or 'no lookup'} first step: {step.first_step_from}"
                  for step in shown]
    return lines


def missing_train_report(reports: list[InitReport]) -> list[str]:
    """What it means when the training job ran but wrote no init report."""
    if any(r.job == TRAIN for r in reports):
        return []
    return [("the training job wrote no init report: none of its processes lowered a "
            "function with jaxwarm's recorder installed (it stopped before its first compile, "
            "or its Python could not import jaxwarm or skipped the bootstrap: the launch "
            "said which entrypoint form it found), so nothing says whether it loaded the "
            "prewarmed entries or even used jaxwarm's cache dir")]


def format_verdicts(verdicts: list[Verdict]) -> list[str]:
    """verify's answer per function: WARM, COLD or UNKNOWN (verify --trainer: not looked up
    before it stopped), the key, the cost, and why when not warm."""
    lines = []
    for v in verdicts:
        cost = f"lowering {v.lower_s:.2f} s + key {1e3 * v.predict_s:.1f} ms" \
            if v.reached_s is None else f"the trainer looked it up at {v.reached_s:.2f} s"
        cost = "" if v.key == NOT_LOOKED_UP else f"  ({cost})"  # no key, no cost: why says
        state = "UNKNOWN" if v.unknown else "WARM" if v.warm else "COLD"
        lines.append(f"{state}  {v.function}  {v.key}{cost}")
        lines.extend(f"      why: {line}" for line in v.explanation)
    return lines


def trainer_cost(result: VerifyResult) -> str:
    """What verify --trainer's answer cost: the trainer's time from its start to its last
    prewarmed function's lookup, or, when it ended before it looked some up, to its end."""
    unheard = [v.function for v in result.functions if v.key == NOT_LOOKED_UP]
    if unheard and all(v.explanation[0].startswith(AFTER_FIRST_STEP)
                       for v in result.functions if v.key == NOT_LOOKED_UP):
        return (f"verify --trainer: {result.trainer_s:.2f} s of the trainer's run, stopped "
                f"before its first step ran (no step, none of its outputs); "
                f"{', '.join(unheard)} unknown")
    if unheard:
        return (f"verify --trainer: the trainer ended {result.trainer_s:.2f} s after its "
                f"start, before it looked up {', '.join(unheard)}")
    return (f"verify --trainer: {result.trainer_s:.2f} s of the trainer's run, from its start "
            f"to its last prewarmed function's lookup")


def with_cache_check(verdicts: list[Verdict], bad: dict[str, str]) -> list[Verdict]:
    """Verdicts with what the cache check found of their entries: the verify job's check of
    a recorded entry is the quick one (its size), the cache check reads it in full, so an
    entry it found corrupt (a same-size bit flip) is COLD, whatever its size says."""
    return [dataclasses.replace(v, warm=False, explanation=[
                f"its entry is in the cache but corrupt: {bad[v.key]} (found by the cache "
                f"check, which reads it in full; the next prewarm or launch quarantines it "
                f"and compiles it again)"])
            if v.key in bad else v for v in verdicts]


def attempt_summaries(reports: list[InitReport]) -> list[str]:
    """One line per attempt of the training job (restart 0, 1, ...), from process 0, and
    one for a prewarm record its miss made the run forget."""
    lines = []
    for r in reports:
        if r.job == TRAIN and r.process_index == 0:
            step = "no first step" if r.first_step_s is None else \
                (f"first step {_seconds(r.first_step_s)} s of a {r.init_budget_s:.0f} s "
                 f"budget {_status(r)}")
            lines.append(f"attempt r{r.restart_count}: {r.label or 'no lookup'}; {r.hits} "
                         f"hit(s) of {r.lookups} lookup(s) on process 0, compile "
                         f"{r.backend_compile_s:.2f} s, {step}")
            lines += [f"attempt r{r.restart_count}: {w.text}" for w in r.warnings
                      if w.kind == PREWARM_FORGOTTEN]
    return lines

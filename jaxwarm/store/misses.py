"""Why a function missed: the closest prewarm of the *same* target in the manifest, and the key
components that differ from it.

This is store policy (which manifest entry counts as "the same target"), built on the
adapter's JAX knowledge (`jaxwarm.jaxkey.components`: the components and their causes).
It is asked of the store that holds the manifest (`CacheStore.explain_miss`): whether the
entry is in that dir is part of the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jaxwarm.core.records import Fingerprint, FunctionRecord, PrewarmRecord
from jaxwarm.jaxkey.components import differing_components, likely_causes
from jaxwarm.jaxkey.globalopts import differing, shown, variable
from jaxwarm.store.manifest import ManifestEntry

if TYPE_CHECKING:
    from jaxwarm.store.cachestore import CacheStore

# A cause line's length, at most: one line on a wide terminal beside `why: `.
CAUSE_WIDTH = 160
# The components a miss is said by, most telling first, when several differ: XLA flags also
# show up in the compile options, and a changed program (computation) often in its output
# shardings too.
SPECIFICITY = ("XLA flags", "accelerator_config", "jax_lib version", "backend version",
               "compression", "custom_hook", "computation", "compile_options")


@dataclass(frozen=True)
class MissContext:
    """Where a function missed, beside what its record says: the `run` and the `job` (as
    its settings lines name it), the job's process count, its cache's size cap (`max_size`)
    and XLA_FLAGS, the dir the process looked its entries up in when it is not the
    manifest's (`looked_in`: a trainer's own, under cache.enforce off), what the launch's
    fingerprint saw change since the prewarm (`since_prewarm`; None: unknown), the prewarm
    the job compared the lookup with (`prewarm`: `Manifest.compared`, perhaps another
    run's), and the key environment variables that differ between that prewarm's
    fingerprint and this job's (`changed`; None: unknown)."""

    run: str | None = None
    job: str = "run"
    process_count: int | None = None
    max_size: int = -1
    xla_flags: str | None = None
    looked_in: str | None = None
    since_prewarm: list[str] | None = None
    prewarm: ManifestEntry | None = None
    changed: set[str] | None = None


def explain_miss(store: CacheStore, missed: FunctionRecord, manifest: dict[str, ManifestEntry],
                 context: MissContext) -> list[str]:
    """Why a function's key is not in the cache, as one line of at most about CAUSE_WIDTH
    characters: the most specific cause found (what can change each component in general is
    in docs/verify.md, not here), against a manifest entry of the *same* target only (same
    function name and abstract signature), on the same process layout (another layout is
    said as that); the prewarm compared with first (`context.prewarm`), else this run's,
    else the closest (fewest differences, then newest). In order: an entry JAX could not
    load (`not_loaded`); the process-global JAX settings that differ from the prewarm's
    (`settings_differences`: they can change the input types too); inputs that differ
    (`input_changes`); equal inputs with another computation (the code changed, with what
    the fingerprint saw change since the prewarm); else the one differing key component
    that says the most (`SPECIFICITY`, the others named after it); none: the entry is in
    another dir than the one looked in, or gone (`gone_line`)."""
    function, components, run = missed.name, missed.components, context.run
    input_changes, prewarm = missed.input_changes, context.prewarm
    if missed.not_loaded is not None:
        return [f"its entry was in the cache, but JAX could not load it: {missed.not_loaded}; "
                f"the next prewarm reads it in full and compiles it again"]
    named = [e for e in manifest.values() if e.function == function and e.components]
    if not named:
        others = sorted({e.function for e in manifest.values()})
        known = f"; it has {_listed(others, 60)} (renamed? a function's name is part of " \
            f"its program)" if others else ": run `jaxwarm prewarm`"
        return [f"no prewarm of {function} is recorded in the manifest{known}"]
    settings = settings_differences(named, missed.global_options, components, context)
    if settings:
        return settings
    if input_changes:
        return [inputs_line(input_changes, prewarm, run)]
    same = [e for e in named
            if missed.signature is None or e.signature in (None, missed.signature)]
    if not same:
        return [f"no prewarm of {function} had these input types, and none recorded its "
                f"inputs: other inputs than prewarmed, or another function of that name"]
    layout = [e for e in same if context.process_count in (None, e.process_count)]
    if not layout:
        other = max(same, key=lambda e: e.created)
        return [f"the process layout differs (part of the key): run {other.run!r} prewarmed "
                f"it on {other.process_count} process(es), this job has "
                f"{context.process_count}"]
    pool = [e for e in layout if prewarm is not None and e.key == prewarm.key] or \
        [e for e in layout if of_run(e, run)] or layout
    closest = min(pool, key=lambda e: (len(differing_components(e.components, components)),
                                       -e.created))
    differing = differing_components(closest.components, components)
    if not differing:
        return [gone_line(store, missed, closest.key, context)]
    if input_changes == [] and "computation" in differing:
        return [code_line(context.since_prewarm, closest, run)]
    first = min(differing, key=lambda c: SPECIFICITY.index(c) if c in SPECIFICITY
                else len(SPECIFICITY))
    also = [c for c in differing if c != first]
    line = component_line(first, closest, context.xla_flags)
    return [line + (f" (also {', '.join(also)})" if also else "")]


def gone_line(store: CacheStore, missed: FunctionRecord, key: str, context: MissContext) -> str:
    """The key is the prewarm's, yet the lookup missed: the entry is in another dir than the
    one the process looked in, or gone: quarantined (the miss's record says, or the usage
    log's last word on it), evicted by JAX's LRU (under a size cap), pruned or deleted."""
    if context.looked_in not in (None, store.dir) and store.has_entry(key):
        return (f"its entry is in {store.dir}, but this process looked it up in "
                f"{context.looked_in}")
    quarantined = missed.quarantined or _quarantined(store, key)
    if quarantined is not None:
        return (f"its entry was quarantined ({quarantined}) before this job could load it, "
                f"and compiled again; unless this job wrote it, run `jaxwarm prewarm`")
    if context.max_size > 0:
        return (f"the prewarm's entry is gone: JAX's LRU evicts to stay within "
                f"cache.max_size={context.max_size} bytes (or it was pruned); raise it, "
                f"prewarm again")
    return "the prewarm's entry is gone (pruned or deleted): run `jaxwarm prewarm` again"


def _listed(items: list[str], room: int) -> str:
    """Items joined while they fit in `room` characters, then how many more."""
    shown: list[str] = []
    for index, item in enumerate(items):
        more = len(items) - index
        if shown and len("; ".join([*shown, item])) > room - (len(f" (+{more} more)")
                                                               if more > 1 else 0):
            return "; ".join(shown) + f" (+{more} more)"
        shown.append(item)
    return "; ".join(shown)


def whose(entry: ManifestEntry | None, run: str | None) -> str:
    """How a line names the prewarm it compares with: another run's by its name."""
    return "" if entry is None or run is None or entry.used_by(run) else \
        f" (run {entry.run!r})"


def inputs_line(changes: list[str], prewarm: ManifestEntry | None = None,
                run: str | None = None) -> str:
    """The first difference of a prewarmed function's inputs, and how many more; the
    prewarm's run when it is another run's. A long pytree path loses its start."""
    more = f" (+{len(changes) - 1} more)" if len(changes) > 1 else ""
    head = f"its inputs differ from the prewarmed ones{whose(prewarm, run)}: "
    first = changes[0]
    room = CAUSE_WIDTH - len(head) - len(more)
    if len(first) > room:
        first = "..." + first[len(first) - room + 3:]
    return f"{head}{first}{more}"


def code_line(since_prewarm: list[str] | None, prewarm: ManifestEntry | None = None,
              run: str | None = None) -> str:
    """Equal inputs, another program: the step's code changed (or a static argument); what
    the fingerprint saw change since the prewarm, when it knows (nothing: code it cannot
    see, a module imported by a computed name or code only the trainer runs)."""
    head = f"same inputs as the prewarm{whose(prewarm, run)}: the step's code changed"
    if since_prewarm is None:
        return f"{head} (or a static argument)"
    if not since_prewarm:
        return (f"{head}, in code the launch's fingerprint cannot see (imported by a "
                f"computed name, or run by the trainer only)")
    prefix = f"{head}; since the prewarm: "
    return prefix + _listed(since_prewarm, CAUSE_WIDTH - len(prefix))


def component_line(component: str, prewarmed: ManifestEntry, xla_flags: str | None) -> str:
    """One differing component, against the prewarm's run, with what the prewarm recorded
    that narrows it: the XLA flags it compiled under (the flags that differ, by name), the
    layout it mocked, its jax version."""
    against = f"the prewarm of run {prewarmed.run!r}"
    if component == "XLA flags" and prewarmed.xla_flags is not None and xla_flags is not None:
        theirs, ours = prewarmed.xla_flags.split(), xla_flags.split()
        named = [f"{whose} {' '.join(flags)}" for whose, flags in (
            ("only the prewarm's have", [f for f in theirs if f not in ours]),
            ("only this job's have", [f for f in ours if f not in theirs])) if flags]
        if named:  # the config's xla_flags (or prewarm.layout) moved since
            return f"XLA_FLAGS changed since {against}: {'; '.join(named)}"
    if component == "accelerator_config" and prewarmed.mock_topology:
        return (f"accelerator_config differs from {against}, compiled through the mock "
                f"topology {prewarmed.mock_topology}: the GPU model or layout differs")
    if component == "jax_lib version":
        return f"jax_lib version differs from {against} (jax {prewarmed.jax_version})"
    return f"{component} differs from {against}: {likely_causes(component)}"


def settings_differences(named: list[ManifestEntry], global_options: dict[str, str],
                         components: dict[str, str], context: MissContext) -> list[str]:
    """The global JAX settings that differ from those of the prewarm the lookup was compared
    with, else of this run's prewarm of the function (its own, or one it uses: `of_run`),
    else of the closest by key `components`, then the newest (never another run's settings
    when this run's differ in something else), as one line (none when either side
    recorded none), said by where the difference comes from: a setting
    whose variable the config gives the job (`jax:` -> JAX_*, `env:`) and that changed
    between the prewarm's fingerprint and this job's (`context.changed`) is a change since
    the prewarm; one that did not change means the prewarm's process and this one set it
    differently under one config, and only that calls for the step factory to apply the
    trainer's settings. `changed` None: either fingerprint is unknown, no advice."""
    recorded = [e for e in named if e.global_options]
    if not recorded or not global_options:
        return []
    prewarm, changed = context.prewarm, context.changed
    newest = prewarm if prewarm is not None and prewarm.global_options else \
        min(recorded, key=lambda e: (not of_run(e, context.run), len(differing_components(
            e.components, components)), -e.created))
    found = differing(newest.global_options, global_options)
    if not found:
        return []
    against = f"the prewarm of run {newest.run!r}"

    def kind(name: str) -> str:
        if changed is None:
            return f"(against {against})"
        if variable(name) in changed:
            where = "config `jax:`" if variable(name).startswith("JAX_") else "`env:` or the shell"
            return f"changed since {against} ({where})"
        return "under one config: the step factory must apply the trainer's JAX settings"

    first = kind(found[0][0])
    same = [f"{name} differs: prewarm {shown(before)}, {context.job} {shown(now)}"
            for name, before, now in found if kind(name) == first]
    more = len(found) - len(same)
    tail = f"; {first}" if changed is not None else f" {first}"
    return [_listed(same, CAUSE_WIDTH - len(tail)) + tail + (f" (+{more} more)" if more else "")]


def changed_variables(prewarms: dict[str, PrewarmRecord], key: str,
                      now: Fingerprint | None) -> set[str] | None:
    """The key environment variables (JAX_* from the config's `jax:`, `env:`, XLA_FLAGS
    ...) that differ between the fingerprint of the newest recorded prewarm that left `key`
    and `now`; None where either is unknown."""
    record = next((r for r in reversed(prewarms.values()) if key in r.keys), None)
    if record is None or now is None or not record.fingerprint.variables or \
            not now.variables:
        return None
    before, after = record.fingerprint.variables, now.variables
    return {name for name in set(before) | set(after) if before.get(name) != after.get(name)}


def of_run(entry: ManifestEntry, run: str | None) -> bool:
    """Whether `entry` is run `run`'s: its prewarm wrote it, or found it WARM and uses it."""
    return run is not None and (entry.run == run or run in entry.runs)


def _quarantined(store: CacheStore, key: str) -> str | None:
    """Why the entry of `key` was quarantined, when that is why it is gone (the usage log)."""
    if store.has_entry(key):
        return None
    history = store.histories().get(key)
    return history.quarantined if history is not None else None

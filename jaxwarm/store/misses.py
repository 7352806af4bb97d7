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

from jaxwarm.core.records import FunctionRecord
from jaxwarm.jaxkey.components import differing_components, likely_causes
from jaxwarm.jaxkey.globalopts import differences
from jaxwarm.store.manifest import ManifestEntry

if TYPE_CHECKING:
    from jaxwarm.store.cachestore import CacheStore

# What a miss whose inputs equal the prewarm's says first: the commonest cause by far.
CODE_CHANGED = ("its inputs equal the prewarmed ones, so the program differs: the step's code "
                "(or a shape or dtype inside it, or a static argument) changed")


@dataclass(frozen=True)
class MissContext:
    """Where a function missed, beside what its record says: the `run` and the `job` (as
    its settings lines name it), the job's process count, its cache's size cap (`max_size`)
    and XLA_FLAGS, the dir the process looked its entries up in when it is not the
    manifest's (`looked_in`: a trainer's own, under cache.enforce off), and what the
    launch's fingerprint saw change since the prewarm (`since_prewarm`; None: unknown)."""

    run: str | None = None
    job: str = "run"
    process_count: int | None = None
    max_size: int = -1
    xla_flags: str | None = None
    looked_in: str | None = None
    since_prewarm: list[str] | None = None


def explain_miss(store: CacheStore, missed: FunctionRecord, manifest: dict[str, ManifestEntry],
                 context: MissContext) -> list[str]:
    """Why a function's key is not in the cache (`missed`: its lookup's record, the name,
    key components, signature, global settings, input changes and full read of an entry JAX
    could not load), against a manifest entry of the *same* target only: same function name
    and abstract signature (another function of the same name is no explanation), on the
    same process layout (a different layout is said as that, not as the component it shows
    up in); this run's entries first, then the closest others (fewest differences, then
    newest). First of all, the process-global JAX settings that differ from those the
    function was prewarmed under, since they can change its input types too (the PRNG
    implementation). With a size cap, an entry the manifest lists that is gone is most
    likely JAX's own LRU eviction, and is named as that. An entry prewarmed through a mock
    of the layout on one node says so, and with the job's XLA_FLAGS a difference in the XLA
    flags names the flags. A process that looked its entries up in another dir than the
    manifest's (`store`'s) is told where the entry is, when it is there. Before all that:
    an entry that was there and that JAX could not load (`not_loaded`). An entry the
    manifest lists that is not there was quarantined (the record's `quarantined`, or the
    usage log's last word on it), or pruned or deleted.

    Its `input_changes` (see `jaxwarm.core.inputdiff.input_differences`) come next: inputs
    that differ are the cause, said as them; equal inputs with another computation mean the
    step's code changed, said with what changed since the prewarm."""
    function, components, run = missed.name, missed.components, context.run
    process_count, input_changes = context.process_count, missed.input_changes
    if missed.not_loaded is not None:
        return [f"its entry was in the cache, but JAX could not load it: {missed.not_loaded}; "
                f"the job recorded the miss, so the next launch runs its prewarm, which reads "
                f"the entry in full, quarantines it and compiles it again"]
    named = [e for e in manifest.values() if e.function == function and e.components]
    if not named:
        others = sorted({e.function for e in manifest.values()})
        known = (f"; the manifest has {', '.join(others)} (was the function renamed? its name "
                 f"is part of the program)") if others else ""
        return [f"no prewarm of {function} is recorded in the manifest{known}: "
                f"run `jaxwarm prewarm`"]
    settings = settings_differences(named, run, missed.global_options, context.job,
                                    components)
    if input_changes:
        return [*settings, inputs_line(input_changes)]
    same = [e for e in named
            if missed.signature is None or e.signature in (None, missed.signature)]
    if settings and not same:
        return settings
    if not same:
        return [f"no prewarm of {function} had these input types (its prewarm recorded no "
                f"inputs to compare them with): it was called with other inputs than "
                f"prewarmed, or it is another function of the same name"]
    layout = [e for e in same if process_count is None or e.process_count == process_count]
    if not layout:
        other = max(same, key=lambda e: e.created)
        return [f"prewarmed as {other.key} by run {other.run!r} on {other.process_count} "
                f"process(es), but this job has {process_count}: the process layout differs "
                f"(it is part of the key); prewarm on the run's own layout"]
    pool = [e for e in layout if of_run(e, run)] or layout
    closest = min(pool, key=lambda e: (len(differing_components(e.components, components)),
                                       -e.created))
    lines = [component_line(component, closest, context.xla_flags) for component
             in differing_components(closest.components, components)]
    if not lines and context.looked_in not in (None, store.dir) and \
            store.has_entry(closest.key):
        return [f"the manifest lists {closest.key} and its entry is in {store.dir}, but this "
                f"process looked it up in {context.looked_in}"]
    if not lines:
        return [gone_line(store, missed, closest.key, context.max_size)]
    mocked = f" on one node through JAX's mock GPU topology {closest.mock_topology}" \
        if closest.mock_topology else ""
    code = [code_line(context.since_prewarm)] if input_changes == [] and \
        "computation" in differing_components(closest.components, components) else []
    return [*settings, *code, f"prewarmed as {closest.key} by run {closest.run!r}{mocked}; "
            + lines[0], *lines[1:]]


def inputs_line(changes: list[str]) -> str:
    """The first difference of a prewarmed function's inputs, and how many more."""
    more = f" (+{len(changes) - 1} more)" if len(changes) > 1 else ""
    return f"its inputs differ from the prewarmed ones: {changes[0]}{more}"


def code_line(since_prewarm: list[str] | None) -> str:
    """Equal inputs, another program: the step's code changed; what the fingerprint saw
    change since the prewarm, when it knows (nothing: the trainer's step is not the one
    its step factory builds)."""
    if since_prewarm is None:
        return CODE_CHANGED
    if not since_prewarm:
        return (f"{CODE_CHANGED}; nothing the launch's fingerprint covers changed since the "
                f"prewarm, so the trainer's step is not the program the step factory builds "
                f"(a setting of its own, or code only the trainer runs)")
    return f"{CODE_CHANGED}; since the prewarm: {'; '.join(since_prewarm)}"


def component_line(component: str, prewarmed: ManifestEntry, xla_flags: str | None) -> str:
    """One differing component and its likely causes; what the prewarm recorded narrows
    two of them: the XLA flags it compiled under, and the layout it mocked."""
    line = f"{component} differs: {likely_causes(component)}"
    if component == "XLA flags" and prewarmed.xla_flags is not None and xla_flags is not None:
        theirs, ours = prewarmed.xla_flags.split(), xla_flags.split()
        named = [f"{whose} {' '.join(flags)}" for whose, flags in (
            ("only the prewarm's XLA_FLAGS have", [f for f in theirs if f not in ours]),
            ("only this job's have", [f for f in ours if f not in theirs])) if flags]
        if named:
            line = (f"{component} differs: {'; '.join(named)}; every XLA flag is part of the "
                    f"key, so the run must carry the prewarm's flags (those a prewarm.layout: "
                    f"mock compile needs go to every job of its run)")
    if component == "accelerator_config" and prewarmed.mock_topology:
        line += (f"; the mock {prewarmed.mock_topology} did not give this layout's topology: "
                 f"the prewarm node's GPU model or GPUs per process differ from this job's, "
                 f"or XLA groups its processes otherwise than one partition per node (it "
                 f"groups by NVLink domain on multi-node NVLink systems)")
    return line


def settings_differences(named: list[ManifestEntry], run: str | None,
                         global_options: dict[str, str], job: str,
                         components: dict[str, str]) -> list[str]:
    """The global JAX settings that differ from those of the prewarm of the function this
    miss is explained against, as one line each; none when either side recorded none. That
    prewarm is this run's (its own, or one it uses: `of_run`), else the closest by key
    components, then the newest: never another run's settings (its LIBTPU_INIT_ARGS) when
    this run's differ in something else."""
    recorded = [e for e in named if e.global_options]
    if not recorded or not global_options:
        return []
    closest = min(recorded, key=lambda e: (not of_run(e, run), len(differing_components(
        e.components, components)), -e.created))
    lines = differences(closest.global_options, global_options, job)
    return [f"{line} (prewarmed by run {closest.run!r}; the step factory must apply the same "
            f"process-global JAX settings as the trainer)" for line in lines]


def gone_line(store: CacheStore, missed: FunctionRecord, key: str, max_size: int) -> str:
    """Why the entry the manifest lists under the very key that missed was not there: it
    was quarantined (the miss's record says, or the usage log's last word on it), JAX's
    LRU evicted it (under a size cap), or it was pruned or deleted."""
    quarantined = missed.quarantined or _quarantined(store, key)
    if quarantined is not None:
        return (f"the manifest lists {key}, but its entry was quarantined ({quarantined}) "
                f"before this job could load it: it was compiled again; if this job did not "
                f"write it (a size cap, a threshold), run `jaxwarm prewarm`")
    if max_size > 0:
        return (f"the manifest lists {key} but its cache entry is gone: with "
                f"cache.max_size={max_size} bytes JAX evicts least recently used entries to "
                f"stay within it (or it was pruned or deleted); raise cache.max_size and run "
                f"`jaxwarm prewarm` again")
    return (f"the manifest lists {key} but its cache entry is gone (pruned or deleted): run "
            f"`jaxwarm prewarm` again")


def of_run(entry: ManifestEntry, run: str | None) -> bool:
    """Whether `entry` is run `run`'s: its prewarm wrote it, or found it WARM and uses it."""
    return run is not None and (entry.run == run or run in entry.runs)


def _quarantined(store: CacheStore, key: str) -> str | None:
    """Why the entry of `key` was quarantined, when that is why it is gone (the usage log)."""
    if store.has_entry(key):
        return None
    history = store.histories().get(key)
    return history.quarantined if history is not None else None

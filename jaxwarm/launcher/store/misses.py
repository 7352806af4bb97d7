"""Why a function missed: the closest prewarm of the *same* target in the manifest, and the key
components that differ from it.

This is store policy (which manifest entry counts as "the same target"), built on the
adapter's JAX knowledge (`jaxwarm.launcher.jaxkey.components`: the components and their causes).
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import zip_longest

from jaxwarm.launcher.jaxkey.components import differing_components, likely_causes
from jaxwarm.launcher.jaxkey.globalopts import differing, shown, variable
from jaxwarm.launcher.records import Fingerprint, InputLeaf, InputSignature, PrewarmRecord
from jaxwarm.launcher.store.manifest import ManifestEntry
from jaxwarm.launcher.store.store import CacheStore

# A cause line's length, at most: one line on a wide terminal beside `why: `.
CAUSE_WIDTH = 160
# The components a miss is said by, most telling first, when several differ: XLA flags also
# show up in the compile options, and a changed program (computation) often in its output
# shardings too.
SPECIFICITY = ("XLA flags", "accelerator_config", "jax_lib version", "backend version",
               "compression", "custom_hook", "computation", "compile_options")


def explain_miss(function: str, components: dict[str, str],
                 manifest: dict[str, ManifestEntry], *, run: str | None = None,
                 process_count: int | None = None, signature: str | None = None,
                 global_options: dict[str, str] | None = None, job: str = "run",
                 max_size: int = -1, xla_flags: str | None = None,
                 store: CacheStore | None = None, looked_in: str | None = None,
                 not_loaded: str | None = None, input_changes: list[str] | None = None,
                 since_prewarm: list[str] | None = None,
                 prewarm: ManifestEntry | None = None,
                 changed: set[str] | None = None) -> list[str]:
    """Why a function's key is not in the cache, as one line: the most specific cause found,
    against a manifest entry of the *same* target only (same function name and abstract
    signature: another function of the same name is no explanation), on the same process
    layout (a different layout is said as that, not as the component it shows up in).
    `prewarm` is the one the job compared the lookup with (`compared_prewarms`, perhaps
    another run's); without it this run's entries come first, then the closest others
    (fewest differences, then newest). In order:

    - an entry that was there and that JAX could not load (`not_loaded`: what the job's
      full read of it found);
    - the process-global JAX settings that differ from those the function was prewarmed
      under (`global_options`, this `job`'s), since they can change its input types too
      (the PRNG implementation), as changed since the prewarm or set otherwise under one
      config (`changed`: the key variables that differ between the prewarm's fingerprint
      and this job's; `settings_differences`);
    - inputs that differ from the prewarm's (`input_changes`, see `input_differences`);
    - equal inputs with another computation: the step's code changed, with what changed
      since the prewarm (`since_prewarm`: the launch's fingerprint against the prewarm's);
    - else the one key component that differs that says the most (`SPECIFICITY`, the
      others named after it): with this job's `xla_flags` (XLA_FLAGS) the flags that
      differ, an entry prewarmed through a mock of the layout on one node as that;
    - no component differs: a process that looked its entries up in another dir
      (`looked_in`, a trainer's own under cache.enforce off) than the manifest's (`store`)
      is told where the entry is; with a size cap (`max_size`), an entry that is gone is
      most likely JAX's own LRU eviction.

    What can change each component in general is in docs/verify.md, not here: a line says
    what was found, in at most about `CAUSE_WIDTH` characters."""
    if not_loaded is not None:
        return [f"its entry was in the cache, but JAX could not load it: {not_loaded}; the "
                f"next prewarm reads it in full and compiles it again"]
    named = [e for e in manifest.values() if e.function == function and e.components]
    if not named:
        others = sorted({e.function for e in manifest.values()})
        known = f"; it has {_listed(others, 60)} (renamed? a function's name is part of " \
            f"its program)" if others else ": run `jaxwarm prewarm`"
        return [f"no prewarm of {function} is recorded in the manifest{known}"]
    settings = settings_differences(named, run, global_options or {}, job, prewarm, changed)
    if settings:
        return settings
    if input_changes:
        return [inputs_line(input_changes, prewarm, run)]
    same = [e for e in named if signature is None or e.signature in (None, signature)]
    if not same:
        return [f"no prewarm of {function} had these input types, and none recorded its "
                f"inputs: other inputs than prewarmed, or another function of that name"]
    layout = [e for e in same if process_count is None or e.process_count == process_count]
    if not layout:
        other = max(same, key=lambda e: e.created)
        return [f"the process layout differs (part of the key): run {other.run!r} prewarmed "
                f"it on {other.process_count} process(es), this job has {process_count}"]
    pool = [e for e in layout if prewarm is not None and e.key == prewarm.key] or \
        [e for e in layout if e.run == run] or layout
    closest = min(pool, key=lambda e: (len(differing_components(e.components, components)),
                                       -e.created))
    differing = differing_components(closest.components, components)
    if not differing:
        return [_gone_line(closest, store, looked_in, max_size)]
    if input_changes == [] and "computation" in differing:
        return [code_line(since_prewarm, closest, run)]
    first = min(differing, key=lambda c: SPECIFICITY.index(c) if c in SPECIFICITY
                else len(SPECIFICITY))
    also = [c for c in differing if c != first]
    line = component_line(first, closest, xla_flags)
    return [line + (f" (also {', '.join(also)})" if also else "")]


def _gone_line(entry: ManifestEntry, store: CacheStore | None, looked_in: str | None,
               max_size: int) -> str:
    """The key is the prewarm's, yet the lookup missed: the entry is elsewhere or gone."""
    if store is not None and looked_in not in (None, store.dir) and \
            store.local is not None and store.local.has_entry(entry.key):
        return f"its entry is in {store.dir}, but this process looked it up in {looked_in}"
    if max_size > 0:
        return (f"the prewarm's entry is gone: JAX's LRU evicts to stay within "
                f"cache.max_size={max_size} bytes (or it was pruned); raise it, prewarm again")
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


def compared_prewarms(manifest: dict[str, ManifestEntry], run: str | None,
                      same_fingerprint: Collection[str] = ()) -> dict[str, ManifestEntry]:
    """For each function name a prewarm recorded, the one prewarm a lookup of that name is
    compared with: this run's newest; else the newest of another run whose prewarm ran
    under this launch's fingerprint (`same_fingerprint`: the keys its record left); else
    the newest of any run. A relaunch under a new run name on a warm cache is the common
    case of the last two: its misses are said against the prewarm it would have used."""
    chosen: dict[str, ManifestEntry] = {}
    for entry in manifest.values():
        best = chosen.get(entry.function)
        if best is None or _preference(entry, run, same_fingerprint) > \
                _preference(best, run, same_fingerprint):
            chosen[entry.function] = entry
    return chosen


def prewarmed_functions(manifest: dict[str, ManifestEntry], run: str,
                        same_fingerprint: Collection[str] = ()) -> set[str]:
    """The functions of the prewarm a run is compared with as a whole (`verify --trainer`
    waits for their lookups): its own, else the run's whose prewarm had this fingerprint,
    else the newest prewarm's run (`compared_prewarms`' order); none: no prewarm at all."""
    if not manifest:
        return set()
    best = max(manifest.values(), key=lambda e: _preference(e, run, same_fingerprint))
    owner = run if best.used_by(run) else best.run
    return {entry.function for entry in manifest.values() if entry.used_by(owner)}


def _preference(entry: ManifestEntry, run: str | None,
                same_fingerprint: Collection[str]) -> tuple[bool, bool, float]:
    return (run is not None and entry.used_by(run), entry.key in same_fingerprint,
            entry.created)


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
    the fingerprint saw change since the prewarm, when it knows (nothing: the trainer's step
    is not the program its step factory builds)."""
    head = f"same inputs as the prewarm{whose(prewarm, run)}: the step's code changed"
    if since_prewarm is None:
        return f"{head} (or a static argument)"
    if not since_prewarm:
        return (f"{head}, and nothing the launch's fingerprint covers did: the trainer's step "
                f"is not the program its step factory builds")
    prefix = f"{head}; since the prewarm: "
    return prefix + _listed(since_prewarm, CAUSE_WIDTH - len(prefix))


def input_differences(prewarmed: InputSignature, now: InputSignature) -> list[str]:
    """How a function's inputs now differ from those its prewarm lowered, one line per
    input (`state['params']['embed'] f32[256,96] vs f32[256,64]`: now, then prewarmed):
    its type (shape, dtype, weak type), sharding or donation; an input only one side has;
    a mesh the shardings name that differs. Inputs are paired by pytree path when every
    path is known and unique on both sides, else by position. Empty: equal."""
    lines = [f"mesh @{name} {now.meshes.get(name, 'absent')} vs "
             f"{prewarmed.meshes.get(name, 'absent')}"
             for name in sorted(set(prewarmed.meshes) | set(now.meshes))
             if now.meshes.get(name) != prewarmed.meshes.get(name)]
    pairs: list[tuple[InputLeaf | None, InputLeaf | None]]
    if _by_path(prewarmed) and _by_path(now):
        before = {leaf.path: leaf for leaf in prewarmed.leaves}
        paths = [leaf.path for leaf in now.leaves]
        pairs = [(leaf, before.get(leaf.path)) for leaf in now.leaves]
        pairs += [(None, leaf) for leaf in prewarmed.leaves if leaf.path not in paths]
    else:
        pairs = list(zip_longest(now.leaves, prewarmed.leaves))
    for index, (ours, theirs) in enumerate(pairs):
        line = _leaf_difference(ours, theirs, index)
        if line:
            lines.append(line)
    return lines


def _by_path(signature: InputSignature) -> bool:
    paths = [leaf.path for leaf in signature.leaves]
    return all(paths) and len(set(paths)) == len(paths)


def _donated(leaf: InputLeaf) -> str:
    return "donated" if leaf.donated else "not donated"


def _leaf_difference(ours: InputLeaf | None, theirs: InputLeaf | None, index: int) -> str:
    known = ours or theirs
    assert known is not None
    name = known.path or f"input {index}"
    if theirs is None:
        return f"{name} {known.type} is new (the prewarmed function had no such input)"
    if ours is None:
        return f"{name} {known.type} is gone (an input of the prewarmed function)"
    parts = []
    if ours.type != theirs.type:
        parts.append(f"{ours.type} vs {theirs.type}")
    if ours.sharding != theirs.sharding:
        parts.append(f"sharded {ours.sharding or 'unspecified'} vs "
                     f"{theirs.sharding or 'unspecified'}")
    if ours.donated != theirs.donated:
        parts.append(f"{_donated(ours)} vs {_donated(theirs)}")
    return f"{name} {', '.join(parts)}" if parts else ""


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


def settings_differences(named: list[ManifestEntry], run: str | None,
                         global_options: dict[str, str], job: str,
                         prewarm: ManifestEntry | None = None,
                         changed: set[str] | None = None) -> list[str]:
    """The global JAX settings that differ from those of the prewarm the lookup was compared
    with, else the newest prewarm of the function (this run's first), as one line (none
    when either side recorded none), said by where the difference comes from: a setting
    whose variable the config gives the job (`jax:` -> JAX_*, `env:`) and that changed
    between the prewarm's fingerprint and this job's (`changed`: the variables that did) is
    a change since the prewarm; one that did not change means the prewarm's process and
    this one set it differently under one config, and only that calls for the step factory
    to apply the trainer's settings. `changed` None: either fingerprint is unknown."""
    recorded = [e for e in named if e.global_options]
    if not recorded or not global_options:
        return []
    newest = prewarm if prewarm is not None and prewarm.global_options else \
        max(recorded, key=lambda e: (e.run == run, e.created))
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
    same = [f"{name} differs: prewarm {shown(before)}, {job} {shown(now)}"
            for name, before, now in found if kind(name) == first]
    more = len(found) - len(same)
    tail = f"; {first}" if changed is not None else f" {first}"
    listed = _listed(same, CAUSE_WIDTH - len(tail))
    return [listed + tail + (f" (+{more} more)" if more else "")]


def prewarm_record(prewarms: dict[str, PrewarmRecord], key: str) -> PrewarmRecord | None:
    """The newest recorded prewarm that left the entry `key` (None: no record names it)."""
    return next((r for r in reversed(prewarms.values()) if key in r.keys), None)


def changed_variables(prewarms: dict[str, PrewarmRecord], key: str,
                      now: Fingerprint | None) -> set[str] | None:
    """The key environment variables (JAX_* from the config's `jax:`, `env:`, XLA_FLAGS
    ...) that differ between the fingerprint of the prewarm that left `key` and `now`;
    None where either is unknown."""
    record = prewarm_record(prewarms, key)
    if record is None or now is None or not record.fingerprint.variables or \
            not now.variables:
        return None
    before, after = record.fingerprint.variables, now.variables
    return {name for name in set(before) | set(after) if before.get(name) != after.get(name)}

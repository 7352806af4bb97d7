"""Why a function missed: the closest prewarm of the *same* target in the manifest, and the key
components that differ from it.

This is store policy (which manifest entry counts as "the same target"), built on the
adapter's JAX knowledge (`jaxwarm.launcher.jaxkey.components`: the components and their causes).
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import zip_longest

from jaxwarm.launcher.jaxkey.components import differing_components, likely_causes
from jaxwarm.launcher.jaxkey.globalopts import differences
from jaxwarm.launcher.records import InputLeaf, InputSignature
from jaxwarm.launcher.store.manifest import ManifestEntry
from jaxwarm.launcher.store.store import CacheStore

# What a miss whose inputs equal the prewarm's says first: the commonest cause by far.
CODE_CHANGED = ("its inputs equal the prewarmed ones, so the program differs: the step's code "
                "(or a shape or dtype inside it, or a static argument) changed")


def explain_miss(function: str, components: dict[str, str],
                 manifest: dict[str, ManifestEntry], *, run: str | None = None,
                 process_count: int | None = None, signature: str | None = None,
                 global_options: dict[str, str] | None = None, job: str = "run",
                 max_size: int = -1, xla_flags: str | None = None,
                 store: CacheStore | None = None, looked_in: str | None = None,
                 not_loaded: str | None = None, input_changes: list[str] | None = None,
                 since_prewarm: list[str] | None = None,
                 prewarm: ManifestEntry | None = None) -> list[str]:
    """Why a function's key is not in the cache, against a manifest entry of the *same* target
    only: same function name and abstract signature (another function of the same name is
    no explanation), on the same process layout (a different layout is said as that, not
    as the component it shows up in); this run's entries first, then the closest others
    (fewest differences, then newest). First of all, the process-global JAX settings that
    differ from those the function was prewarmed under (`global_options`, this `job`'s),
    since they can change its input types too (the PRNG implementation). With a size cap
    (`max_size`), an entry the manifest lists that is gone is most likely JAX's own LRU
    eviction, and is named as that. An entry prewarmed through a mock of the layout on one
    node says so, and with this job's `xla_flags` (XLA_FLAGS) a difference in the XLA flags
    names the flags. A process that looked its entries up in another dir (`looked_in`, a
    trainer's own under cache.enforce off) than the manifest's (`store`) is told where
    the entry is, when it is there. Before all that: an entry that was there and that JAX
    could not load (`not_loaded`: what the job's full read of it found).

    `input_changes` (the job's comparison of its inputs with the prewarm's, see
    `input_differences`) comes next: inputs that differ are the cause, said as them; equal
    inputs with another computation mean the step's code changed, said with what changed
    since the prewarm (`since_prewarm`: the launch's fingerprint against the prewarm's).
    `prewarm` is the one the job compared the lookup with (`compared_prewarms`, perhaps
    another run's): the miss is said against it where it is of the same target."""
    if not_loaded is not None:
        return [f"its entry was in the cache, but JAX could not load it: {not_loaded}; the "
                f"job recorded the miss, so the next launch runs its prewarm, which reads the "
                f"entry in full, quarantines it and compiles it again"]
    named = [e for e in manifest.values() if e.function == function and e.components]
    if not named:
        others = sorted({e.function for e in manifest.values()})
        known = (f"; the manifest has {', '.join(others)} (was the function renamed? its name "
                 f"is part of the program)") if others else ""
        return [f"no prewarm of {function} is recorded in the manifest{known}: "
                f"run `jaxwarm prewarm`"]
    settings = settings_differences(named, run, global_options or {}, job, prewarm)
    if input_changes:
        return [*settings, inputs_line(input_changes, prewarm, run)]
    same = [e for e in named if signature is None or e.signature in (None, signature)]
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
    pool = [e for e in layout if prewarm is not None and e.key == prewarm.key] or \
        [e for e in layout if e.run == run] or layout
    closest = min(pool, key=lambda e: (len(differing_components(e.components, components)),
                                       -e.created))
    lines = [component_line(component, closest, xla_flags) for component
             in differing_components(closest.components, components)]
    if not lines and store is not None and looked_in not in (None, store.dir) and \
            store.local is not None and store.local.has_entry(closest.key):
        return [f"the manifest lists {closest.key} and its entry is in {store.dir}, but this "
                f"process looked it up in {looked_in}"]
    if not lines and max_size > 0:
        return [f"the manifest lists {closest.key} but its cache entry is gone: with "
                f"cache.max_size={max_size} bytes JAX evicts least recently used entries to "
                f"stay within it (or it was pruned or deleted); raise cache.max_size and run "
                f"`jaxwarm prewarm` again"]
    if not lines:
        return [f"the manifest lists {closest.key} but its cache entry is gone "
                f"(pruned or deleted): run `jaxwarm prewarm` again"]
    mocked = f" on one node through JAX's mock GPU topology {closest.mock_topology}" \
        if closest.mock_topology else ""
    code = [code_line(since_prewarm)] if input_changes == [] and \
        "computation" in differing_components(closest.components, components) else []
    return [*settings, *code, f"prewarmed as {closest.key} by run {closest.run!r}{mocked}; "
            + lines[0], *lines[1:]]


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
    prewarm's run when it is another run's."""
    more = f" (+{len(changes) - 1} more)" if len(changes) > 1 else ""
    return f"its inputs differ from the prewarmed ones{whose(prewarm, run)}: {changes[0]}{more}"


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
                         prewarm: ManifestEntry | None = None) -> list[str]:
    """The global JAX settings that differ from those of the prewarm the lookup was compared
    with, else the newest prewarm of the function (this run's first), as one line each;
    none when either side recorded none."""
    recorded = [e for e in named if e.global_options]
    if not recorded or not global_options:
        return []
    newest = prewarm if prewarm is not None and prewarm.global_options else \
        max(recorded, key=lambda e: (e.run == run, e.created))
    lines = differences(newest.global_options, global_options, job)
    return [f"{line} (prewarmed by run {newest.run!r}; the step factory must apply the same "
            f"process-global JAX settings as the trainer)" for line in lines]

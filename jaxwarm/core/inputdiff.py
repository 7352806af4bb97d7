"""How a function's inputs now differ from those its prewarm lowered it with: a training job
that misses a prewarmed function says which inputs differ (`jaxwarm.job.record.recorder`), and
so do verify and `verify --trainer` (`jaxwarm.job.warm.judge`) and the report's explanation of a
miss (`jaxwarm.store.misses`). Pure: two `InputSignature`s in, one line per difference out.
"""

from __future__ import annotations

from itertools import zip_longest

from jaxwarm.core.records import InputLeaf, InputSignature


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

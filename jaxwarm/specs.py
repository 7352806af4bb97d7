"""Helpers that make the right abstract inputs easy to build and the wrong ones loud.

The cache key of a jitted step depends on every input's sharding and on whether a scalar is
weakly typed. An AOT compile from an unsharded dummy batch, or a step called with a Python
`int`, lowers to another program than the run's and misses.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

log = logging.getLogger(__name__)

_PYTHON_SCALARS = (bool, int, float, complex)


def sharded_specs(shapes: Any, mesh: Mesh, spec: PartitionSpec | Any) -> Any:
    """ShapeDtypeStructs carrying NamedSharding(mesh, spec) for a pytree of (shape, dtype)s.

    `shapes` holds arrays, ShapeDtypeStructs or anything with .shape and .dtype; `spec` is one
    PartitionSpec for all leaves or a pytree of them matching `shapes`.
    """
    if isinstance(spec, PartitionSpec):
        return jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                              sharding=NamedSharding(mesh, spec)), shapes)
    return jax.tree.map(
        lambda leaf, leaf_spec: jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, leaf_spec)),
        shapes, spec, is_leaf=lambda x: isinstance(x, PartitionSpec))


def _checked(args: tuple[Any, ...], kwargs: dict[str, Any],
             uncommitted: Collection[int | str]) -> list[tuple[str, Any]]:
    """(path, leaf) of every argument a warning may concern: uncommitted ones are left out,
    since an unsharded abstract input is exactly right for them (the real call passes an
    uncommitted array, e.g. a fresh PRNG key, which jit places the same way)."""
    found = []
    for index, arg in enumerate(args):
        if index not in uncommitted:
            found += [(f"[{index}]{jax.tree_util.keystr(path)}", leaf)
                      for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]]
    for name, arg in kwargs.items():
        if name not in uncommitted:
            found += [(f"{name}{jax.tree_util.keystr(path)}", leaf)
                      for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]]
    return found


def risky_inputs(args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
                 uncommitted: Collection[int | str] = ()) -> list[str]:
    """Python scalars (weakly typed under jit) and abstract inputs without a sharding.

    An unsharded abstract input is a problem only where the real argument is committed or
    sharded; arguments named in `uncommitted` (positions or keyword names) are skipped.
    """
    found = []
    for where, leaf in _checked(tuple(args), kwargs or {}, uncommitted):
        if isinstance(leaf, _PYTHON_SCALARS):
            found.append(f"{where} is a Python {type(leaf).__name__} (weakly typed)")
        elif isinstance(leaf, jax.ShapeDtypeStruct) and getattr(leaf, "weak_type", False):
            found.append(f"{where} is a weakly typed ShapeDtypeStruct")
        elif isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None and leaf.shape:
            found.append(f"{where} is a ShapeDtypeStruct without a sharding (an unsharded "
                         f"dummy input lowers to another program than sharded real arrays; "
                         f"if the real argument is uncommitted, declare it in the target's "
                         f"`uncommitted`)")
    return found


def warn_risky_inputs(args: tuple[Any, ...], function: str, kwargs: dict[str, Any] | None = None,
                      uncommitted: Collection[int | str] = ()) -> list[str]:
    """Log one warning when a step's arguments would likely change its key; returns them."""
    found = risky_inputs(args, kwargs, uncommitted)
    if found:
        log.warning("%s: %s; these change the cache key, so pass typed, sharded values "
                    "(e.g. np.int32(n), ShapeDtypeStruct(..., sharding=...)) in the prewarm "
                    "and in the run alike", function, "; ".join(found))
    return found

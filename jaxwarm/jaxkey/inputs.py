"""A compiled program's inputs, one leaf each, read from the module JAX looks up.

The prewarm records each target's inputs and a training job that misses a prewarmed
function compares its own with them, so the report can say `state['params']['embed']
f32[256,96] vs f32[256,64]` instead of "the computation differs". Both read them the same
way, from the StableHLO module `compiler.compile_or_get_cached` gets (the program whose key
JAX computes): its `main` function's arguments carry the pytree path JAX names each one by
(as its location), its type, its sharding and whether it is donated; the `sdy.mesh`
operations give the meshes those shardings name. Weak types are not in the module: they
come from pxla's lowering line (`logs.LOWERING`), whose abstract values are the same
arguments in the same order.

`watch_inputs` wraps `compile_or_get_cached` for the life of the process (the seam the key
probe and `lookup.watch_lookups` rely on, called through its module on every tested
version); a key probe passes through untouched, and reading the module is left to the
callback, which reads only the functions it wants. No jax import at module import.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from jaxwarm.core.records import InputLeaf, InputSignature
from jaxwarm.jaxkey import logs
from jaxwarm.jaxkey.predict import _check_seam, in_probe

log = logging.getLogger(__name__)

# The MLIR element types JAX's short names abbreviate the same way (`f32`, `bf16`, `i32`).
_TENSOR = re.compile(r"^tensor<(?P<body>[^,>]*(?:<[^>]*>)?[^,>]*)(?:,[^>]*)?>$")
_DIMS = re.compile(r"^(?P<dims>(?:(?:\d+|\?)x)*)(?P<dtype>.*)$", re.DOTALL)
_NAME_LOC = re.compile(r'^loc\("(?P<name>(?:[^"\\]|\\.)*)"')
_SDY = re.compile(r"^#sdy\.sharding<(?P<body>.*)>$", re.DOTALL)
_SDY_MESH = re.compile(r"^#sdy\.mesh<(?P<body>.*)>$", re.DOTALL)
_WEAK = "weak "


def short_type(mlir_type: str) -> str:
    """`tensor<256x64xf32>` as `f32[256,64]`, `tensor<f32>` as `f32[]`; another type as is."""
    match = _TENSOR.match(mlir_type)
    if match is None:
        return mlir_type
    shape = _DIMS.match(match["body"])
    assert shape is not None  # it matches any text
    return f"{shape['dtype']}[{','.join(shape['dims'].split('x')[:-1])}]"


def _main(module: Any) -> Any:
    for op in module.body.operations:
        if op.operation.name == "func.func" and "sym_name" in op.attributes and \
                str(op.attributes["sym_name"]).strip('"') == "main":
            return op
    return None


def _sharding(attrs: Any) -> str | None:
    for name in ("sdy.sharding", "mhlo.sharding"):
        if name in attrs:
            text = str(attrs[name])
            match = _SDY.match(text)
            return match["body"] if match else text.strip('"')
    return None


def module_inputs(module: Any, avals: str | None = None) -> InputSignature:
    """The inputs of a lowered module's `main`, one leaf each, with the weak types of
    `avals` (pxla's lowering line of the same function) when it names as many arguments."""
    main = _main(module)
    if main is None:
        return InputSignature()
    arguments = list(main.regions[0].blocks[0].arguments)
    attrs = main.attributes["arg_attrs"] if "arg_attrs" in main.attributes else None
    weak = logs.weak_types(avals) if avals is not None else []
    if len(weak) != len(arguments):
        weak = [False] * len(arguments)
    leaves = []
    for index, argument in enumerate(arguments):
        location = _NAME_LOC.match(str(argument.location))
        arg_attrs = attrs[index] if attrs is not None else {}
        kind = short_type(str(argument.type))
        leaves.append(InputLeaf(
            path=location["name"].replace('\\"', '"') if location else "",
            type=_WEAK + kind if weak[index] else kind,
            sharding=_sharding(arg_attrs),
            donated="jax.buffer_donor" in arg_attrs or "tf.aliasing_output" in arg_attrs))
    meshes = {}
    for op in module.body.operations:
        if op.operation.name == "sdy.mesh":
            text = str(op.attributes["mesh"])
            match = _SDY_MESH.match(text)
            meshes[str(op.attributes["sym_name"]).strip('"')] = match["body"] if match else text
    return InputSignature(leaves, meshes)


# The callback of the process's recorder; the wrapper is installed with the first one.
_callback: list[Callable[[str, Any], None]] = []


def watch_inputs(on_compile: Callable[[str, Any], None]) -> None:
    """Call `on_compile(module name, module)` before each compile or cache lookup of the
    process (key probes excluded). The callback reads the module with `module_inputs`
    when it wants the function's inputs, before the compile goes on. One callback per
    process: a later call (a second recorder of a test process) replaces it."""
    from jax._src import compilation_cache, compiler

    if _callback:
        _callback[0] = on_compile
        return
    _check_seam(compilation_cache, compiler)
    _callback.append(on_compile)
    original = compiler.compile_or_get_cached

    def compile_or_get_cached(backend: Any, computation: Any, *args: Any,
                              **kwargs: Any) -> Any:
        if not in_probe():
            try:
                name = str(computation.operation.attributes["sym_name"]).strip('"')
                _callback[0](name, computation)
            except Exception as exc:  # bookkeeping: the compile goes on without it
                log.warning("jaxwarm: the inputs of a compile could not be read (%s: %s)",
                            type(exc).__name__, exc)
        return original(backend, computation, *args, **kwargs)

    compiler.compile_or_get_cached = compile_or_get_cached

"""The step-factory protocol: the one code path that gives prewarm and trainer the same program.

A step factory is any `module:function` named in `step.factory` with the signature

    factory(config: launcher.config.Config, mesh: jax.sharding.Mesh | None) -> StepBundle

It builds the jitted functions the run compiles (its compile targets: train, eval, init,
with any signature) and *abstract* arguments for each: `jax.ShapeDtypeStruct`s that carry
the exact `NamedSharding` the real arrays will have. The persistent-cache key depends
on those shardings (an unsharded dummy batch lowers to a different program), so the prewarm
job compiles from the bundle's abstract inputs and the trainer feeds arrays that match them.

`mesh` is the config's (`mesh.axes`). Without `mesh.axes` it is None: the factory builds the
trainer's own mesh (a trainer that derives it from its own parallelism settings, as MaxText
does) and returns it in the bundle, and the run is lowered on that mesh.

This module is what a user's adapter imports, and it imports nothing of the cache store or
the in-job hook: how a job starts (join, hook, build) is `prewarm.bootstrap`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from launcher.config import Config, ConfigError


@dataclass(frozen=True)
class CompileTarget:
    """One jitted function the run will compile, with the abstract arguments it is called with.

    A trainer's step rarely has the `(state, batch)` shape: `step(state, frozen, residual,
    key)`, or keyword and static arguments. The key depends on all of them, so a target
    carries the whole call: `function.lower(*args, **kwargs)` must lower the program the
    trainer's real call compiles (static arguments are passed by value, as the trainer does).

    uncommitted: positions (ints) or keyword names of arguments that the trainer passes as
        uncommitted arrays (e.g. a fresh `jax.random.key`): leaving those unsharded is right,
        so they are not warned about.
    is_step: whether the end of its first execution is the first step, for a trainer that
        never calls mark_first_step() (False for init and other set-up functions).
    context: what the trainer lowers its step inside, entered in order around `lower()`:
        `jax.set_mesh(mesh)` (bare PartitionSpecs, `jax.sharding.reshard`), flax's
        `nn.logical_axis_rules(rules)`, any context manager the traced code reads. The
        lowered program depends on them, so a prewarm without them lowers another program
        or fails. Give each as a zero-argument callable that returns the context manager
        (`lambda: jax.set_mesh(mesh)`): it is called for each lowering, and most context
        managers can be entered once only. A context manager itself is accepted too, for a
        target lowered once per process (as the prewarm and verify jobs do).
    compiler_options: XLA options the trainer passes to `lowered.compile(...)` (e.g.
        MaxText's `compile_xla_flags`); they enter the compile options, so the key.
    """

    name: str
    function: jax.stages.Wrapped  # a jitted function: it has .lower()
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    uncommitted: tuple[int | str, ...] = ()
    is_step: bool = True
    context: tuple[AbstractContextManager[Any] | Callable[[], AbstractContextManager[Any]],
                   ...] = ()
    compiler_options: dict[str, Any] | None = None

    def lower(self) -> Any:
        """`function.lower(*args, **kwargs)` inside the target's context managers."""
        with ExitStack() as stack:
            for item in self.context:
                stack.enter_context(item if isinstance(item, AbstractContextManager)
                                    else item())
            return self.function.lower(*self.args, **self.kwargs)


@dataclass(frozen=True)
class StepBundle:
    """What a step factory returns: the run's compile targets.

    The short form `StepBundle(train_step, state, batch, init_state)` is a `(state, batch)`
    step plus an optional `(uint32 seed) -> state` init; any other call shape (more
    arguments, an eval step, keyword or static arguments) goes in `targets`:
    `StepBundle(targets=[CompileTarget("train_step", step, (state, frozen, residual, key),
    uncommitted=(3,))])`. Both may be given; names must be unique.

    train_step: jitted `(state, batch) -> (state, metrics)`.
    state, batch: pytrees of ShapeDtypeStruct with the run's NamedSharding.
    init_state: optional jitted `(seed: uint32 scalar) -> state`, its out_shardings set,
        so the trainer can materialize the state and the prewarm job can compile it too.
    mesh: the mesh the targets are sharded over, when the factory built it (the trainer's
        own); None: the config's `mesh.axes`, which the factory was given.
    """

    train_step: Callable[..., Any] | None = None
    state: Any = None
    batch: Any = None
    init_state: Callable[..., Any] | None = None
    targets: tuple[CompileTarget, ...] = ()
    mesh: Mesh | None = None

    def compile_targets(self) -> list[CompileTarget]:
        """Every function the run will compile, the short form's first."""
        found = []
        if self.train_step is not None:
            found.append(CompileTarget("train_step", self.train_step, (self.state, self.batch)))
        if self.init_state is not None:
            found.append(CompileTarget("init_state", self.init_state, (seed_spec(),),
                                       is_step=False))
        found.extend(self.targets)
        names = [target.name for target in found]
        if not found or len(set(names)) != len(names):
            raise ValueError(f"a StepBundle needs at least one compile target, each with its "
                             f"own name; got {names}")
        return found


def seed_spec() -> jax.ShapeDtypeStruct:
    """The abstract seed init_state takes: a uint32 scalar, never a weak-typed Python int."""
    return jax.ShapeDtypeStruct((), np.uint32)


def build_mesh(config: Config) -> Mesh | None:
    """The mesh of the config's `mesh.axes`, over all global devices in jax's order; None
    without `mesh.axes` (the step factory builds the mesh)."""
    if config.mesh.axes is None:
        return None
    names = tuple(config.mesh.axes)
    shape = tuple(config.mesh.axes.values())
    if config.mesh.axis_types == "explicit":
        return jax.make_mesh(shape, names)
    devices = np.asarray(jax.devices()).reshape(shape)
    return Mesh(devices, names)


def load_factory(spec: str,
                 source: str = "<config>") -> Callable[[Config, Mesh | None], StepBundle]:
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{source}: step.factory: cannot import module {module_name!r}: "
                          f"{exc}") from None
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise ConfigError(f"{source}: step.factory: module {module_name!r} has no function "
                          f"{function_name!r}")
    return factory


def build_step(config: Config, mesh: Mesh | None = None,
               calling: AbstractContextManager[Any] | None = None) -> tuple[Mesh, StepBundle]:
    """The mesh the run uses and the step bundle, for a config: what both the prewarm job and
    the trainer call. The mesh is the factory's own when it returns one (then `mesh.axes`,
    if given, must describe that very mesh), else the config's. `calling` is entered around
    the factory's call alone (the prewarm notes what files it reads)."""
    given = mesh if mesh is not None else build_mesh(config)
    factory = load_factory(config.step.factory, config.source)
    with calling if calling is not None else ExitStack():
        bundle = factory(config, given)
    if not isinstance(bundle, StepBundle):
        raise ConfigError(f"{config.source}: step.factory: {config.step.factory} returned "
                          f"{type(bundle).__name__}, expected prewarm.step.StepBundle")
    try:
        bundle.compile_targets()
    except ValueError as exc:
        raise ConfigError(f"{config.source}: step.factory: {exc}") from None
    used = bundle.mesh if bundle.mesh is not None else given
    if used is None:
        raise ConfigError(f"{config.source}: mesh.axes: not set, and the step factory "
                          f"{config.step.factory} returned no mesh (StepBundle(mesh=...)): "
                          f"set mesh.axes, or return the mesh the trainer builds")
    if given is not None and list(used.shape.items()) != list(given.shape.items()):
        raise ConfigError(f"{config.source}: mesh.axes: {dict(given.shape)}, but the step "
                          f"factory {config.step.factory} built its own mesh "
                          f"{dict(used.shape)}, which the run uses: drop mesh.axes or make "
                          f"it match")
    return used, bundle


def lower_target(target: CompileTarget, source: str) -> Any:
    """`target.lower()`, with a factory whose arguments do not fit its function named as a
    config error instead of a traceback from deep inside jit."""
    try:
        return target.lower()
    except TypeError as exc:
        raise ConfigError(f"{source}: step.factory: target {target.name!r} cannot be lowered "
                          f"with its abstract arguments: {exc}") from None

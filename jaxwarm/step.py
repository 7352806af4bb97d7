"""The step-factory protocol: the one code path that gives prewarm and trainer the same program.

A step factory is any `module:function` named in `step.factory` with the signature

    factory(config: jaxwarm.core.config.Config, mesh: jax.sharding.Mesh | None) -> StepBundle

It builds the jitted functions the run compiles (its compile targets: train, eval, init,
with any signature) and *abstract* arguments for each: `jax.ShapeDtypeStruct`s that carry
the exact `NamedSharding` the real arrays will have. The persistent-cache key depends
on those shardings (an unsharded dummy batch lowers to a different program), so the prewarm
job compiles from the bundle's abstract inputs and the trainer feeds arrays that match them.

A trainer with a command line keeps its settings there: the factory reads them with the
trainer's own parser from `trainer_argv(config)`, the argv the trainer will get, so the
program it builds is the trainer's for every launch (`jaxwarm launch cfg.yaml
entrypoint.args=[--d-model,96]` included). `config.step.args` is for a trainer without a
command line (a function called with no argument, a notebook's step).

`mesh` is the config's (`mesh.axes`). Without `mesh.axes` it is None: the factory builds the
trainer's own mesh (a trainer that derives it from its own parallelism settings, as MaxText
does) and returns it in the bundle, and the run is lowered on that mesh.

This module is what a user's adapter imports, and it imports nothing of the cache store or
the in-job hook: how a job starts (join, hook, build) is `jaxwarm.job.start.jobstart`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import types
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh

from jaxwarm.core.config import Config
from jaxwarm.core.decode import convert
from jaxwarm.core.entryargv import trainer_argv as _trainer_argv
from jaxwarm.core.errors import ConfigError, UserError
from jaxwarm.core.moved import moved_import, moved_module
from jaxwarm.core.words import plural

T = TypeVar("T")
# Python's words for a call whose arguments do not fit the function (3.11 to 3.13).
_UNEXPECTED = re.compile(r"(?P<callee>\S+)\(\) got an unexpected keyword argument "
                         r"'(?P<name>\w+)'")
_MISSING = re.compile(r"(?P<callee>\S+)\(\) missing \d+ required (?:positional|keyword-only) "
                      r"arguments?: (?P<names>.+)")


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


def trainer_argv(config: Config) -> list[str]:
    """The training entrypoint's argv, exactly as the trainer's `sys.argv` will be: its
    command and `entrypoint.args` after the launch's overrides, `{config}` filled in. Hand
    it to the trainer's own parser (`parser.parse_args(argv[1:])`, or the config code that
    takes the whole argv, as MaxText's `initialize(argv)` does). argv[0] is the script as
    given for `python SCRIPT`, the module's file for `entrypoint.module` and `python -m`,
    the name of a console script, `module:function` for `entrypoint.function` (what absl's
    `main(argv)` gets); for a shell-script command, the command line the script gets."""
    return _trainer_argv(config)


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
        # A module of an earlier layout (the factory's own path, or an import in it): where
        # it is now.
        own = exc.name is not None and f"{module_name}.".startswith(f"{exc.name}.")
        moved = moved_module(module_name) if own else moved_import(exc)
        raise ConfigError(f"{source}: step.factory: cannot import module {module_name!r}: "
                          f"{moved or exc}") from None
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise ConfigError(f"{source}: step.factory: module {module_name!r} has no function "
                          f"{function_name!r}")
    return factory


def step_args(config: Config, cls: type[T]) -> T:
    """`step.args` as the factory's own dataclass (a trainer's `ModelConfig`), read by the
    config's converter (`jaxwarm.core.decode`): types and choices (`Literal`) from its
    annotations, ranges from `Annotated[..., Bound]`; an unknown or missing key or a wrong
    type is one line naming the config file and `step.args.<key>`, exit 2, as every config
    error is. `cls(**config.step.args)` works too (`call_factory` names an unknown or
    missing key), but checks no type."""
    result: T = convert(cls, dict(config.step.args), "step.args", config.source)
    return result


class FactoryError(UserError):
    """The step factory raised (its call, or its module's import): one line naming the
    factory and what it raised, that exception its cause. A job writes the cause's traceback
    to a log of its own and ends with the line (`jaxwarm.job.start.jobstart.start_job`): the
    user's traceback once, not streamed and then shown again as the log's last lines."""


def factory_raised(config: Config, exc: BaseException) -> str:
    words = " ".join(str(exc).split())
    return (f"{config.source}: step.factory: {config.step.factory} raised "
            f"{type(exc).__name__}" + (f": {words}" if words else ""))


def call_factory(config: Config, mesh: Mesh | None,
                 calling: AbstractContextManager[Any] | None = None) -> Any:
    """The step factory's result. A factory that passes `step.args` on to a function or
    class that does not take them (`ModelConfig(**config.step.args)` with a typo in a key)
    ends with one line naming the config file, `step.args.<key>` and where the factory
    made the call; a factory that cannot be imported, one line too (`load_factory`);
    anything else the factory raises is a FactoryError. `calling` is entered around the
    call alone, after the factory's module is imported."""
    try:
        factory = load_factory(config.step.factory, config.source)
        with calling if calling is not None else ExitStack():
            return factory(config, mesh)
    except UserError:
        raise
    except TypeError as exc:
        line = argument_mismatch(exc, config)
        if line is None:
            raise FactoryError(factory_raised(config, exc)) from exc
        raise ConfigError(line) from None
    except Exception as exc:
        raise FactoryError(factory_raised(config, exc)) from exc


def argument_mismatch(exc: TypeError, config: Config) -> str | None:
    """The one line for a TypeError that is Python refusing a call's arguments, where the
    arguments are `step.args`' keys; None for any other TypeError. The call is the last
    frame of the traceback (a call whose arguments do not fit never enters the callee),
    where the callee is looked up by name to say which keys it takes."""
    message = str(exc)
    tb = exc.__traceback__
    if tb is None or not (match := _UNEXPECTED.fullmatch(message) or
                          _MISSING.fullmatch(message)):
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    where = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"
    callee = match["callee"]
    params = _parameters(callee, tb.tb_frame)
    args, source = config.step.args, config.source
    what = callee.removesuffix(".__init__")
    if "name" in match.groupdict():
        name = match["name"]
        if name not in args:
            return None
        close = difflib.get_close_matches(name, params or [], n=1)
        hint = f" (did you mean 'step.args.{close[0]}'?)" if close else ""
        return (f"{source}: unknown key 'step.args.{name}'{hint}: the step factory passes "
                f"it to {what}, which takes no such argument ({where})")
    names = re.findall(r"'(\w+)'", match["names"])
    if any(name in args for name in names) or params is None or \
            not set(args) <= set(params):
        return None  # not a call made with step.args
    keys = ", ".join(f"'step.args.{name}'" for name in names)
    return (f"{source}: missing required {plural(len(names), 'key')} {keys}: the step "
            f"factory passes step.args to {what}, which needs "
            f"{plural(len(names), 'it', 'them')} ({where})")


def _parameters(qualname: str, frame: types.FrameType) -> list[str] | None:
    """The argument names of the function or class `qualname` names, looked up from the
    frame that called it; None when it cannot be found there."""
    parts = qualname.split("<locals>.")[-1].split(".")
    if parts[-1] == "__init__":
        parts.pop()
    scope = {**frame.f_globals, **frame.f_locals}
    if parts[0] not in scope:
        return None
    found = scope[parts[0]]
    for part in parts[1:]:
        found = getattr(found, part, None)
    try:
        return list(inspect.signature(found).parameters) if found is not None else None
    except (TypeError, ValueError):
        return None


def build_step(config: Config, mesh: Mesh | None = None,
               calling: AbstractContextManager[Any] | None = None) -> tuple[Mesh, StepBundle]:
    """The mesh the run uses and the step bundle, for a config: what both the prewarm job and
    the trainer call. The mesh is the factory's own when it returns one (then `mesh.axes`,
    if given, must describe that very mesh), else the config's. `calling` is entered around
    the factory's call alone (the prewarm notes what files it reads)."""
    given = mesh if mesh is not None else build_mesh(config)
    bundle = call_factory(config, given, calling)
    if not isinstance(bundle, StepBundle):
        raise ConfigError(f"{config.source}: step.factory: {config.step.factory} returned "
                          f"{type(bundle).__name__}, expected a jaxwarm.StepBundle")
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

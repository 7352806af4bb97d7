"""jaxwarm step factories for tests/cli_trainer/train.py, built by the trainer's own code.

- `from_argv`: the settings from the argv jaxwarm hands the factory (`trainer_argv`), parsed
  by the trainer's own parser: one source of truth, the trainer's command line.
- `from_args`: the settings from the adapter's own copy in `step.args` (its `Settings`
  fields; the rest the trainer's defaults): tied to the trainer's flags by nothing, which
  is what the training job's drift detection is tested against.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from train import Settings, batch_sharding, make_eval, make_functions, make_mesh, parse

from jaxwarm import CompileTarget, Config, StepBundle, seed_spec, trainer_argv


def bundle(settings: Settings) -> StepBundle:
    """The trainer's two functions on its own mesh, with abstract inputs of its shardings."""
    mesh = make_mesh()
    init, train_step = make_functions(settings, mesh)
    state = jax.eval_shape(init, seed_spec())
    state = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                          sharding=leaf.sharding), state)
    batch = jax.ShapeDtypeStruct((settings.batch, settings.d_model),
                                 jnp.dtype(settings.dtype), sharding=batch_sharding(mesh))
    targets = (CompileTarget("init", init, (seed_spec(),), is_step=False),
               CompileTarget("train_step", train_step, (state, batch)))
    if settings.eval_at:  # called after that step only
        targets += (CompileTarget("eval_step", make_eval(mesh), (state, batch),
                                  is_step=False),)
    return StepBundle(targets=targets, mesh=mesh)


def from_argv(config: Config, mesh: None) -> StepBundle:
    return bundle(parse(trainer_argv(config)))


def from_args(config: Config, mesh: None) -> StepBundle:
    return bundle(dataclasses.replace(Settings(), **config.step.args))

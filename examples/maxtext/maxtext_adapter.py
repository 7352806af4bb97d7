"""MaxText's train step for jaxwarm, built by MaxText's own code: nothing of MaxText changes.

MaxText's trainer (`python -m maxtext.trainers.pre_train.train ARGS`) sets itself up
(`train.initialize`), builds its mesh from its own parallelism settings, and AOT-compiles
`jit_train_step` inside `jax.set_mesh(mesh)` and flax's `logical_axis_rules(...)` with the
compiler options of its `compile_xla_flags`. This factory does the same, in the same order,
with MaxText's functions and the same argv (`trainer_argv`: the module's file, then
`entrypoint.args` after the launch's overrides), so the prewarm job lowers the very program
the training job then looks up:

- `train.initialize(argv)` is MaxText's set-up, process-global JAX settings included
  (`jax_default_prng_impl=unsafe_rbg`, shardy, `jax_remove_size_one_mesh_axis_from_type`,
  `LIBTPU_INIT_ARGS`), which enter the key; calling it is how the factory replays them;
- the mesh is MaxText's own (`maxtext_utils.get_mesh_from_config`, its 12 axes), returned in
  the bundle: the jaxwarm config has no `mesh.axes`;
- the abstract state and batch are `train_compile.get_shaped_inputs`, MaxText's own shaped
  inputs for AOT compiles, with the run's shardings (no parameter is materialized);
- the jitted step is `train_utils.jit_train_and_eval_step`, what `train.train_loop` calls;
- the state init is the one program rebuilt here rather than asked of MaxText: its
  `maxtext_utils.setup_initial_state` jits `lambda: nnx.state(init_state_fn())` inline (out
  shardings the abstract state's, inside `logical_axis_rules` and no mesh) and runs it at
  once, and no function of MaxText returns it. `init_state_target` builds the same lambda
  from MaxText's own model and optimizer constructors; the training job's `jit__lambda`
  is the key this prewarms (tests/test_maxtext.py checks the HIT).
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from flax.core.spmd import logical_axis_rules
from maxtext.common import train_state_nnx
from maxtext.trainers.pre_train import train, train_compile
from maxtext.utils import max_utils, maxtext_utils, model_creation_utils, sharding, train_utils

from jaxwarm import CompileTarget, Config, StepBundle, trainer_argv


def make_train_step(config: Config, mesh: None) -> StepBundle:
    """MaxText's `jit_train_step` with its abstract (state, batch), on MaxText's own mesh."""
    # The argv `python -m maxtext.trainers.pre_train.train ARGS` gives absl's main(argv):
    # the module's file first (MaxText picks its default config file from it), then ARGS.
    maxtext_config, _ = train.initialize(trainer_argv(config))
    maxtext_mesh = maxtext_utils.get_mesh_from_config(maxtext_config)
    (state, batch), _, init_shardings, _, model = train_compile.get_shaped_inputs(
        maxtext_mesh, maxtext_config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
        maxtext_config, init_shardings)
    p_train_step, _ = train_utils.jit_train_and_eval_step(
        maxtext_config, model, maxtext_mesh, state, state_shardings, train.train_step,
        params_shardings=params_shardings)
    rules = maxtext_config.logical_axis_rules
    return StepBundle(
        targets=(CompileTarget(
            "train_step", p_train_step, (state, batch),
            context=(lambda: jax.set_mesh(maxtext_mesh), lambda: logical_axis_rules(rules)),
            compiler_options=max_utils.parse_libtpu_flags_to_dict(
                maxtext_config.compile_xla_flags)),
            init_state_target(maxtext_config, maxtext_mesh, init_shardings)),
        mesh=maxtext_mesh)


def init_state_target(maxtext_config: Any, maxtext_mesh: jax.sharding.Mesh,
                      init_shardings: Any) -> CompileTarget:
    """MaxText's state init, `jit__lambda`, as `setup_initial_state` jits and runs it: the
    train state of `setup_train_loop`'s `create_train_state_fn` (MaxText's abstract model
    and optimizer), its out shardings those of the abstract state (before the step's
    optimizer-sharding update), under the logical axis rules alone."""
    create_model, abstract_model = model_creation_utils.create_nnx_abstract_model(
        maxtext_config, maxtext_mesh)
    _, tx = train_utils.create_training_optimizer(maxtext_config, abstract_model,
                                                  mesh=maxtext_mesh)
    lora = getattr(getattr(maxtext_config, "lora", None), "enable_lora", False)
    wrt = getattr(nnx, "LoRAParam", nnx.Param) if lora else nnx.Param

    def create_train_state() -> Any:
        nnx_model = create_model()
        return train_state_nnx.TrainStateNNX(nnx_model, nnx.Optimizer(nnx_model, tx, wrt=wrt))

    init = jax.jit(lambda: nnx.state(create_train_state()), in_shardings=None,
                   out_shardings=init_shardings)
    rules = maxtext_config.logical_axis_rules
    return CompileTarget("init_state", init, is_step=False,
                         context=(lambda: logical_axis_rules(rules),))

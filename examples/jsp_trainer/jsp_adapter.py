"""The jaxwarm step factory for jsp-train: the only code jaxwarm needs besides a config.

jsp-train reads its model's sizes from its own command line, so this file reads them the
same way: jsp-train's own parser on the argv jaxwarm hands it (`trainer_argv`), whatever
`entrypoint.args` a launch gives. jsp-train builds its step in its own `make_step(optimizer,
mesh)`, so this file calls that same function (same program, same name `jit_step`) and
describes its four arguments
abstractly, with the shardings jsp-train's real arrays have: state and frozen replicated,
the residual batch over `data`, and the PRNG key uncommitted (jsp-train makes a fresh one
each step, so it stays unsharded here too).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jsp_trainer.train import init_state, make_optimizer, make_step, model_config, parse_args

from jaxwarm import CompileTarget, Config, StepBundle, trainer_argv


def make_train_step(config: Config, mesh: Mesh) -> StepBundle:
    model = model_config(parse_args(trainer_argv(config)[1:]))
    optimizer = make_optimizer(model)
    replicated = NamedSharding(mesh, P())
    state, frozen = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated),
        jax.eval_shape(lambda seed: init_state(model, optimizer, seed),
                       jax.ShapeDtypeStruct((), np.uint32)))
    residual = jax.ShapeDtypeStruct((model.global_batch, model.d_model),
                                    np.float32, sharding=NamedSharding(mesh, P("data")))
    key = jax.ShapeDtypeStruct((2,), np.uint32)
    return StepBundle(targets=(CompileTarget(
        "train_step", make_step(optimizer, mesh), (state, frozen, residual, key),
        uncommitted=(3,)),))

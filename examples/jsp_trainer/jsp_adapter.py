"""The jaxwarm step factory for jsp-train: the only code jaxwarm needs besides a config.

jsp-train builds its step in its own `make_step(optimizer, mesh)`, so this file calls that
same function (same program, same name `jit_step`) and describes its four arguments
abstractly, with the shardings jsp-train's real arrays have: state and frozen replicated,
the residual batch over `data`, and the PRNG key uncommitted (jsp-train makes a fresh one
each step, so it stays unsharded here too).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jsp_trainer.train import ModelConfig, init_state, make_optimizer, make_step

from launcher.config import Config
from prewarm.step import CompileTarget, StepBundle


def make_train_step(config: Config, mesh: Mesh) -> StepBundle:
    model_config = ModelConfig(**config.step.args)
    optimizer = make_optimizer(model_config)
    replicated = NamedSharding(mesh, P())
    state, frozen = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated),
        jax.eval_shape(lambda seed: init_state(model_config, optimizer, seed),
                       jax.ShapeDtypeStruct((), np.uint32)))
    residual = jax.ShapeDtypeStruct((model_config.global_batch, model_config.d_model),
                                    np.float32, sharding=NamedSharding(mesh, P("data")))
    key = jax.ShapeDtypeStruct((2,), np.uint32)
    return StepBundle(targets=(CompileTarget(
        "train_step", make_step(optimizer, mesh), (state, frozen, residual, key),
        uncommitted=(3,)),))

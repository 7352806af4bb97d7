"""The reference trainer's smallest step: the reference batch in, one scalar learned.

`step.factory: jaxwarm.workload.small:make_train_step` runs `jaxwarm-train` with the same
config, data and checkpoints as the chunkwise model, but a step that is one collective of
every rank (the mean of the batch, whose rows are spread over the processes) and a scalar
fitted to it: it traces, lowers and compiles in a small fraction of the smallest chunkwise
step's CPU. For trying what happens around the compile (a SLURM launch, many ranks,
signals and requeues, the cache store) where the model is not the point; the test suite
runs it that way (`bench.common.FAST_STEP`).
"""

from __future__ import annotations

import logging
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwarm.core.config import Config
from jaxwarm.step import StepBundle
from jaxwarm.workload.data import batch_spec, mesh_required
from jaxwarm.workload.model import State

log = logging.getLogger(__name__)

LEARNING_RATE = 0.1


def make_train_step(config: Config, mesh: Mesh | None) -> StepBundle:
    """The jitted step and init: state {"w", "step"}, replicated; the reference batch."""
    mesh = mesh_required(config, mesh)
    replicated = NamedSharding(mesh, P())
    state = {"w": jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated),
             "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}

    @partial(jax.jit, out_shardings=replicated)
    def init_state(seed: jax.Array) -> State:
        return {"w": jnp.zeros((), jnp.float32) * seed, "step": jnp.zeros((), jnp.int32)}

    @jax.jit
    def train_step(state: State, batch: jax.Array) -> tuple[State, dict[str, jax.Array]]:
        error = state["w"] - batch.astype(jnp.float32).mean()
        return ({"w": state["w"] - LEARNING_RATE * 2 * error, "step": state["step"] + 1},
                {"loss": error**2})

    batch = batch_spec(config, mesh)
    log.info("small step: 1 param, batches of %d x %d tokens, mesh %s", *batch.shape,
             dict(mesh.shape))
    return StepBundle(train_step, state, batch, init_state)

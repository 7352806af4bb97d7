"""The step factory for tinytrain: its one step, on a 4-float vector and a PRNG key. Like a
real trainer's set-up, it applies the process-global setting the trainer makes
(`step.args.prng`, tinytrain's --prng)."""

import jax
import numpy as np
from tinytrain import tiny_step

from prewarm.step import CompileTarget, StepBundle


def make(config, mesh):
    if config.step.args.get("prng"):
        jax.config.update("jax_default_prng_impl", config.step.args["prng"])
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    return StepBundle(targets=(CompileTarget(
        "tiny_step", jax.jit(tiny_step), (jax.ShapeDtypeStruct((4,), np.float32), key),
        uncommitted=(0, 1)),))

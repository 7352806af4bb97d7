"""The step factory for tinytrain: its one step, on a 4-float vector and a PRNG key. Like a
real trainer's set-up, it applies the process-global setting the trainer makes
(`step.args.prng`, tinytrain's --prng), and can replay the trainer's own cache threshold
(`step.args.threshold`), as an adapter that calls a trainer's set-up function does."""

import jax
import numpy as np
from tinytrain import tiny_step

from jaxwarm import CompileTarget, StepBundle


def make(config, mesh):
    if config.step.args.get("prng"):
        jax.config.update("jax_default_prng_impl", config.step.args["prng"])
    if config.step.args.get("threshold"):  # a trainer's own cache set-up, replayed
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(config.step.args["threshold"]))
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    return StepBundle(targets=(CompileTarget(
        "tiny_step", jax.jit(tiny_step), (jax.ShapeDtypeStruct((4,), np.float32), key),
        uncommitted=(0, 1)),))

"""A tiny trainer that knows nothing of jaxwarm, written the absl way (`main(argv)`, flags,
`app.run`): it sets up its own persistent cache (its own dir and a 60 s threshold) and runs
one jitted step. The launch-form tests run it as every form jaxwarm supports."""

import os
import time

import jax
import jax.numpy as jnp
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "tiny-out", "where the trainer keeps its own files")
flags.DEFINE_string("prng", None, "a PRNG implementation to set up, as MaxText does")


def tiny_step(x: jax.Array, key: jax.Array) -> jax.Array:
    return x * 2.0 + jax.random.normal(key, x.shape)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.prng:
        jax.config.update("jax_default_prng_impl", FLAGS.prng)
    jax.config.update("jax_compilation_cache_dir", os.path.join(FLAGS.out, "own-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 60.0)
    key = jax.random.PRNGKey(0)
    jax.jit(tiny_step)(jnp.arange(4.0), key).block_until_ready()
    print(f"tinytrain: first step done at {time.time()!r} (out {FLAGS.out})", flush=True)


def cli() -> None:
    """The console script."""
    app.run(main)


if __name__ == "__main__":
    app.run(main)

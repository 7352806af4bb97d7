"""Deterministic synthetic token batches, sharded the way the step expects.

The batch of step N is a pure function of (seed, N): a requeued job regenerates exactly
the batches it would have seen, without any data files. The tokens walk a fixed random
Markov chain, each token having a few possible successors, so there is something to
learn and the loss visibly falls from log(vocab_size) towards log(branching).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, Sharding
from jax.sharding import PartitionSpec as P

from jaxwarm.core.config import Config
from jaxwarm.core.errors import ConfigError
from jaxwarm.specs import sharded_specs
from jaxwarm.workload.model import ModelArgs

BRANCHING = 4


def global_batch_numpy(seed: int, step: int, global_batch: int, seq_len: int,
                       vocab_size: int) -> np.ndarray:
    """int32 (global_batch, seq_len + 1) tokens of step `step`; the chain depends on seed only."""
    successors = np.random.default_rng((seed, 0)).integers(
        0, vocab_size, size=(vocab_size, BRANCHING), dtype=np.int32)
    rng = np.random.default_rng((seed, 1, step))
    choices = rng.integers(0, BRANCHING, size=(global_batch, seq_len))
    tokens = np.empty((global_batch, seq_len + 1), np.int32)
    tokens[:, 0] = rng.integers(0, vocab_size, size=global_batch)
    for t in range(seq_len):
        tokens[:, t + 1] = successors[tokens[:, t], choices[:, t]]
    return tokens


def process_rows(global_data: np.ndarray, sharding: Sharding) -> np.ndarray:
    """The rows of `global_data` this process's devices hold, in global order.

    That concatenation is the layout `jax.make_array_from_process_local_data` expects,
    however the mesh interleaves processes over the batch dimension.
    """
    rows = len(global_data)
    indices = sharding.addressable_devices_indices_map(global_data.shape).values()
    blocks = sorted({index[0].indices(rows)[:2] for index in indices})
    return np.concatenate([global_data[start:stop] for start, stop in blocks])


def mesh_required(config: Config, mesh: Mesh | None) -> Mesh:
    """The mesh of the config's `mesh.axes`, which the reference steps are sharded over."""
    if mesh is None:
        raise ConfigError(f"{config.source}: mesh.axes: expected the mesh axes the reference "
                          f"step is sharded over (it builds no mesh of its own)")
    return mesh


def batch_spec(config: Config, mesh: Mesh) -> jax.ShapeDtypeStruct:
    """The abstract global batch: int32 (global_batch, seq_len + 1), rows over data_axes."""
    args = ModelArgs.from_config(config, dict(mesh.shape))
    return sharded_specs(jax.ShapeDtypeStruct((args.global_batch, args.seq_len + 1), jnp.int32),
                         mesh, P(args.data_axes, None))


def make_global_batch(config: Config, mesh: Mesh, step: int) -> jax.Array:
    """The global batch of `step` as a jax.Array with exactly the bundle's batch sharding."""
    args = ModelArgs.from_config(config, dict(mesh.shape))
    spec = batch_spec(config, mesh)
    tokens = global_batch_numpy(config.train.seed, step, args.global_batch, args.seq_len,
                                args.vocab_size)
    return jax.make_array_from_process_local_data(
        spec.sharding, process_rows(tokens, spec.sharding), spec.shape)

"""`jsp-train [--out DIR] [--steps N] [--seed S] [--d-model N] [--layers N]`: a trainer as
real ones are written.

It joins `jax.distributed` itself when a cluster manager started several processes, sets up
its own persistent compilation cache (its own dir, a 60 s threshold), builds its jitted
four-argument step `step(state, frozen, residual, key)` with equinox/optax state, passes a
fresh, uncommitted PRNG key each step, and evaluates with another jitted function that is
also called `step`. It knows nothing of jaxwarm.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

log = logging.getLogger("jsp_trainer")

CACHE_MIN_COMPILE_TIME_S = 60.0


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 64
    d_hidden: int = 256
    n_layers: int = 4
    global_batch: int = 16
    learning_rate: float = 1e-3


class Decomposition(eqx.Module):
    """The trained part: per-layer factors applied on top of a frozen base matrix."""

    w_in: jax.Array
    w_out: jax.Array

    def __call__(self, x: jax.Array, frozen: jax.Array) -> jax.Array:
        for layer in range(self.w_in.shape[0]):
            h = jax.nn.gelu((x @ frozen) @ self.w_in[layer])
            x = x + h @ self.w_out[layer]
        return x


State = tuple[Decomposition, Any]


def make_mesh() -> Mesh:
    return Mesh(np.asarray(jax.devices()), ("data",))


def make_optimizer(config: ModelConfig) -> optax.GradientTransformation:
    return optax.adamw(config.learning_rate)


def init_state(config: ModelConfig, optimizer: optax.GradientTransformation,
               seed: jax.Array) -> tuple[State, jax.Array]:
    k_in, k_out, k_frozen = jax.random.split(jax.random.PRNGKey(seed), 3)
    shape = (config.n_layers, config.d_model, config.d_hidden)
    model = Decomposition(
        w_in=jax.random.normal(k_in, shape) / config.d_model ** 0.5,
        w_out=jnp.swapaxes(jax.random.normal(k_out, shape), 1, 2) / config.d_hidden ** 0.5)
    frozen = jnp.eye(config.d_model) + 0.01 * jax.random.normal(
        k_frozen, (config.d_model, config.d_model))
    return (model, optimizer.init(model)), frozen


def make_step(optimizer: optax.GradientTransformation, mesh: Mesh) -> Any:
    """The train step, jitted: (state, frozen, residual, key) -> (state, loss)."""
    replicated = NamedSharding(mesh, P())

    def step(state: State, frozen: jax.Array, residual: jax.Array,
             key: jax.Array) -> tuple[State, jax.Array]:
        model, opt_state = state
        noisy = residual + 0.01 * jax.random.normal(key, residual.shape, residual.dtype)

        def loss_fn(m: Decomposition) -> jax.Array:
            return jnp.mean((m(noisy, frozen) - residual) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(model)
        updates, opt_state = optimizer.update(grads, opt_state, model)
        return (eqx.apply_updates(model, updates), opt_state), loss

    return jax.jit(step, out_shardings=(replicated, replicated))


def make_eval_step(mesh: Mesh) -> Any:
    """Evaluation, jitted; its inner function is also named `step` (as in many trainers)."""

    def step(model: Decomposition, frozen: jax.Array, residual: jax.Array) -> jax.Array:
        return jnp.mean((model(residual, frozen) - residual) ** 2)

    return jax.jit(step, out_shardings=NamedSharding(mesh, P()))


def residual_batch(config: ModelConfig, mesh: Mesh, step: int) -> jax.Array:
    """This process's rows of a deterministic global batch, sharded over `data`."""
    sharding = NamedSharding(mesh, P("data"))
    rows = config.global_batch // jax.process_count()
    rng = np.random.default_rng([step, jax.process_index()])
    local = rng.standard_normal((rows, config.d_model), dtype=np.float32)
    return jax.make_array_from_process_local_data(sharding, local)


def world_size() -> int:
    """Processes started by the cluster manager (SLURM or mpirun-style), 1 when run by hand."""
    return int(os.environ.get("SLURM_NTASKS") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)


def enable_own_cache(cache_dir: Path) -> None:
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_TIME_S)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="jsp-train")
    parser.add_argument("--out", default="jsp-runs", help="where runs and the cache go")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--d-model", type=int, default=ModelConfig.d_model)
    parser.add_argument("--layers", type=int, default=ModelConfig.n_layers)
    return parser.parse_args(argv)


def model_config(args: argparse.Namespace) -> ModelConfig:
    """The model its command line asks for."""
    return ModelConfig(d_model=args.d_model, n_layers=args.layers)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if world_size() > 1:
        jax.distributed.initialize()
    enable_own_cache(Path(args.out).absolute() / "jax-cache")

    config = model_config(args)
    mesh = make_mesh()
    optimizer = make_optimizer(config)
    replicated = NamedSharding(mesh, P())
    state, frozen = jax.jit(lambda seed: init_state(config, optimizer, seed),
                            out_shardings=replicated)(np.uint32(args.seed))
    train_step, eval_step = make_step(optimizer, mesh), make_eval_step(mesh)
    base_key = jax.random.PRNGKey(args.seed)
    for step in range(args.steps):
        residual = residual_batch(config, mesh, step)
        state, loss = train_step(state, frozen, residual, jax.random.fold_in(base_key, step))
        if step == 0 or step == args.steps - 1:
            eval_loss = eval_step(state[0], frozen, residual)
            if jax.process_index() == 0:
                log.info("step %d loss %.5f eval %.5f", step + 1, float(loss), float(eval_loss))
    return 0

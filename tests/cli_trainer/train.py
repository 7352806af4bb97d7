"""`python train.py [--d-model N] [--batch N] [--dtype D] [--no-donate] [--steps N]
[--eval-at N] [--checkpoint-dir DIR]`: a trainer with its own command line, as real ones
are written, and the cheapest there is.

A linear layer trained on random rows: `jit_init` makes the state, `jit_train_step` (the state
donated unless --no-donate) trains it on a batch sharded over every device of its own mesh,
on one process or several (it joins jax.distributed itself). With --eval-at N it evaluates
the state once, after step N (`jit_eval_step`: a function first called long after the first
step, as real trainers' eval and decode are), and with --checkpoint-dir it saves the state
there after every step.
It knows nothing of jaxwarm; its settings live in its flags only, so an adapter reads them
with `parse` from the argv jaxwarm hands it (tests/cli_trainer/adapter.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class Settings:
    d_model: int = 16
    batch: int = 4
    dtype: str = "float32"
    donate: bool = True
    steps: int = 1
    eval_at: int = 0
    checkpoint_dir: str = ""


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train.py")
    parser.add_argument("--d-model", type=int, default=Settings.d_model)
    parser.add_argument("--batch", type=int, default=Settings.batch)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=Settings.dtype)
    parser.add_argument("--no-donate", dest="donate", action="store_false")
    parser.add_argument("--steps", type=int, default=Settings.steps)
    parser.add_argument("--eval-at", type=int, default=Settings.eval_at)
    parser.add_argument("--checkpoint-dir", default=Settings.checkpoint_dir)
    return parser


def parse(argv: list[str]) -> Settings:
    """The settings of a command line (argv[0] the script, as in sys.argv)."""
    return Settings(**vars(parser().parse_args(argv[1:])))


def make_mesh() -> Mesh:
    return Mesh(np.asarray(jax.devices()), ("data",))


def make_functions(settings: Settings, mesh: Mesh) -> tuple[Any, Any]:
    """The jitted (init, train_step): `init(seed) -> state`, `train_step(state, batch) ->
    (state, loss)`, the state replicated, the batch's rows over `data`."""
    replicated = NamedSharding(mesh, P())
    dtype = jnp.dtype(settings.dtype)

    def init(seed: jax.Array) -> dict[str, jax.Array]:
        key = jax.random.PRNGKey(seed)
        return {"w": (0.1 * jax.random.normal(key, (settings.d_model,) * 2)).astype(dtype),
                "b": jnp.zeros((settings.d_model,), dtype)}

    def train_step(state: dict[str, jax.Array],
                   batch: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        def loss_fn(params: dict[str, jax.Array]) -> jax.Array:
            return jnp.mean((batch @ params["w"] + params["b"] - batch) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state)
        return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), loss

    return (jax.jit(init, out_shardings=replicated),
            jax.jit(train_step, donate_argnums=(0,) if settings.donate else (),
                    out_shardings=(replicated, replicated)))


def make_eval(mesh: Mesh) -> Any:
    """The jitted `eval_step(state, batch) -> loss`."""
    def eval_step(state: dict[str, jax.Array], batch: jax.Array) -> jax.Array:
        return jnp.mean(jnp.abs(batch @ state["w"] + state["b"] - batch))

    return jax.jit(eval_step, out_shardings=NamedSharding(mesh, P()))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data"))


def main() -> int:
    settings = parse(sys.argv)
    # Several processes started by a cluster manager (SLURM, or jaxwarm's local runner,
    # which sets Open MPI's variables): join them, as real trainers do.
    if int(os.environ.get("SLURM_NTASKS") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1) > 1:
        jax.distributed.initialize()
    mesh = make_mesh()
    init, train_step = make_functions(settings, mesh)
    state = init(np.uint32(0))
    rng = np.random.default_rng(0)
    for step in range(settings.steps):
        rows = rng.standard_normal((settings.batch // jax.process_count(),
                                    settings.d_model)).astype(jnp.dtype(settings.dtype))
        batch = jax.make_array_from_process_local_data(batch_sharding(mesh), rows)
        state, loss = train_step(state, batch)
        print(f"step {step + 1} loss {float(loss):.5f}", flush=True)
        if settings.checkpoint_dir:
            os.makedirs(settings.checkpoint_dir, exist_ok=True)
            np.savez(os.path.join(settings.checkpoint_dir, f"step-{step + 1}.npz"),
                     **{name: np.asarray(leaf) for name, leaf in state.items()})
        if step + 1 == settings.eval_at:
            print(f"eval {float(make_eval(mesh)(state, batch)):.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

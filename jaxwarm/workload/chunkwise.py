"""The chunkwise (gradient-accumulation) train step: the step factory both jobs call.

`make_train_step(config, mesh)` is named by `step.factory`. The prewarm job lowers and
compiles the bundle from its abstract state and batch; the trainer feeds real arrays with
the same shardings. Any difference between the two (a sharding, a dtype, a weak type, a
module name) is a different cache key, so everything here is derived from the config
and the mesh alone, and the step's output state has exactly its input's types and
shardings: step 2 reuses step 1's executable.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwarm.core.config import Config
from jaxwarm.step import StepBundle, seed_spec
from jaxwarm.workload.data import batch_spec, mesh_required
from jaxwarm.workload.model import (
    ModelArgs,
    Params,
    State,
    init_params,
    loss_fn,
    param_specs,
)

log = logging.getLogger(__name__)


def make_train_step(config: Config, mesh: Mesh | None) -> StepBundle:
    """The jitted train step and init, with abstract sharded state and batch."""
    mesh = mesh_required(config, mesh)
    args = ModelArgs.from_config(config, dict(mesh.shape))
    optimizer = make_optimizer(args)

    def init_state(seed: jax.Array) -> State:
        params = init_params(jax.random.key(seed), args)
        return {"params": params, "opt_state": optimizer.init(params),
                "step": jnp.zeros((), jnp.int32)}

    shapes = jax.eval_shape(init_state, seed_spec())
    shardings = state_shardings(shapes, args, mesh)
    replicated = NamedSharding(mesh, P())
    # The step pins layouts with with_sharding_constraint, which only speaks Auto axes.
    # On an Explicit mesh it runs under auto_axes, against the same devices seen as Auto.
    auto_mesh = Mesh(mesh.devices, mesh.axis_names)

    def train_step(state: State, batch: jax.Array) -> tuple[State, dict[str, jax.Array]]:
        params = state["params"]
        loss, grads = accumulate_gradients(params, batch, args, auto_mesh)
        updates, opt_state = optimizer.update(grads, state["opt_state"], params)
        # Adam's moments would silently become float32 from float32 grads on a bfloat16
        # model; a changed dtype is a changed input type, so a recompile on step 2.
        opt_state = jax.tree.map(lambda new, old: new.astype(old.dtype),
                                 opt_state, state["opt_state"])
        new_state = {"params": optax.apply_updates(params, updates), "opt_state": opt_state,
                     "step": state["step"] + 1}
        return new_state, {"loss": loss, "grad_norm": optax.global_norm(grads)}

    step_fn = train_step
    if AxisType.Explicit in mesh.axis_types:
        step_fn = jax.sharding.auto_axes(train_step, out_sharding=(shardings, replicated))
    state = jax.tree.map(
        lambda shape, sharding: jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding),
        shapes, shardings)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))
    log.info("chunkwise step: %s params, %d chunks of %d x %d tokens, mesh %s",
             param_count(n_params), args.chunks, args.chunk_batch, args.seq_len,
             dict(mesh.shape))
    return StepBundle(
        train_step=jax.jit(step_fn, donate_argnums=(0,),
                           out_shardings=(shardings, replicated)),
        state=state,
        batch=batch_spec(config, mesh),
        init_state=jax.jit(init_state, out_shardings=shardings),
    )


def param_count(n: int) -> str:
    """A parameter count as a reader takes it in: `8.03B`, `1.24M`, or `106,816` for the
    demo's small model (a fixed unit would say `0.000B`)."""
    if n >= 10**9:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.2f}M" if n >= 10**6 else f"{n:,}"


def make_optimizer(args: ModelArgs) -> optax.GradientTransformation:
    """AdamW without weight decay on the norm scales, which decay would pull towards 0."""
    return optax.adamw(args.learning_rate, b1=0.9, b2=0.95, weight_decay=args.weight_decay,
                       mask=_decayed)


def _decayed(params: Params) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not str(path[-1].key).endswith("norm"), params)


def state_shardings(shapes: State, args: ModelArgs, mesh: Mesh) -> State:
    """NamedShardings for a state pytree: params by `param_specs`, their copies likewise.

    Adam's moments are copies of the param tree inside optax's state; a leaf whose path
    ends with a param's path and has its shape gets that param's sharding. Everything
    else (counts, the step) is a scalar and replicated.
    """
    replicated = NamedSharding(mesh, P())
    params = param_shardings(args, mesh)
    by_path = {path: (leaf.shape, sharding) for (path, leaf), sharding in zip(
        jax.tree_util.tree_flatten_with_path(shapes["params"])[0], jax.tree.leaves(params),
        strict=True)}

    def like_param(path: tuple[Any, ...], leaf: jax.ShapeDtypeStruct) -> NamedSharding:
        for start in range(len(path)):
            shape, sharding = by_path.get(path[start:], (None, None))
            if shape == leaf.shape:
                return sharding
        return replicated

    return {"params": params,
            "opt_state": jax.tree_util.tree_map_with_path(like_param, shapes["opt_state"]),
            "step": replicated}


def param_shardings(args: ModelArgs, mesh: Mesh) -> Any:
    """`param_specs` as NamedShardings on this mesh."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(args),
                        is_leaf=lambda x: isinstance(x, P))


def accumulate_gradients(params: Params, batch: jax.Array, args: ModelArgs,
                         mesh: Mesh) -> tuple[jax.Array, Params]:
    """Mean loss and float32 grads over the batch, one chunk at a time under `lax.scan`.

    Only one chunk's activations are alive at once; the accumulator is pinned to the
    params' shardings so each chunk's grads are reduce-scattered, never held replicated.
    """
    shardings = param_shardings(args, mesh)
    chunks = lax.with_sharding_constraint(
        split_chunks(batch, args.chunks), NamedSharding(mesh, P(None, args.data_axes, None)))
    grad_fn = jax.value_and_grad(lambda p, tokens: loss_fn(p, tokens, args, mesh=mesh))

    def chunk(carry: tuple[Params, jax.Array], tokens: jax.Array
              ) -> tuple[tuple[Params, jax.Array], None]:
        grad_sum, loss_sum = carry
        loss, grads = grad_fn(params, tokens)
        grad_sum = jax.tree.map(lambda acc, g: acc + g.astype(jnp.float32), grad_sum, grads)
        return (lax.with_sharding_constraint(grad_sum, shardings), loss_sum + loss), None

    zeros = lax.with_sharding_constraint(
        jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), shardings)
    (grad_sum, loss_sum), _ = lax.scan(chunk, (zeros, jnp.zeros((), jnp.float32)), chunks)
    scale = 1.0 / args.chunks
    return loss_sum * scale, jax.tree.map(lambda g: g * scale, grad_sum)


def split_chunks(batch: jax.Array, chunks: int) -> jax.Array:
    """(rows, seq) -> (chunks, rows // chunks, seq), row r going to chunk r % chunks.

    Interleaving, rather than cutting the batch into contiguous blocks, keeps every
    device's rows on that device: with rows split over n devices, each device's block
    holds whole groups of `chunks` consecutive rows, so every chunk gets an equal share
    of it and no all-to-all is needed.
    """
    rows, seq = batch.shape
    return batch.reshape(rows // chunks, chunks, seq).swapaxes(0, 1)

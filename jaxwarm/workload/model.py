"""A Llama-style decoder in plain JAX, shaped for sharded training and cheap compilation.

Layers are stacked on a leading axis and run under `lax.scan`, so the compiled program
holds one layer body however deep the model is: compile time (and the persistent-cache
entry) stays flat from 2 layers to 32. `scan_layers: false` unrolls them instead, as many
trainers do (one copy of the body per layer, which XLA can schedule across layers): compile
time and entry then grow with depth, the size of compile users pay for. `jax.checkpoint`
around the body trades a recomputation for not keeping every layer's activations alive.

`ModelArgs.from_config` is the only place `step.args` is read. It fails with one line
naming the key, because a typo found after a 64-node allocation is an expensive typo.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwarm.core.config import Config, NonNegativeFloat, PositiveFloat, PositiveInt
from jaxwarm.core.errors import ConfigError
from jaxwarm.step import step_args

Params = dict[str, Any]
# The train state: params, optimizer state and step, as the reference steps build it.
State = dict[str, Any]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_NORM_EPS = 1e-5


@dataclass(frozen=True)
class ModelArgs:
    """`step.args`, validated against the mesh.

    fsdp_axis is None when the mesh has no such axis (and the config did not name one);
    tensor_axis is None without tensor parallelism.
    """

    vocab_size: PositiveInt
    d_model: PositiveInt
    n_layers: PositiveInt
    n_heads: PositiveInt
    n_kv_heads: PositiveInt
    d_ff: PositiveInt
    seq_len: PositiveInt
    global_batch: PositiveInt
    chunks: PositiveInt = 1
    dtype: Literal["float32", "bfloat16"] = "float32"
    learning_rate: PositiveFloat = 3e-4
    weight_decay: NonNegativeFloat = 0.1
    rope_theta: PositiveFloat = 10000.0
    remat: bool = True
    scan_layers: bool = True
    data_axes: tuple[str, ...] = ("data",)
    fsdp_axis: str | None = "fsdp"
    tensor_axis: str | None = None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(_DTYPES[self.dtype])

    @property
    def chunk_batch(self) -> int:
        return self.global_batch // self.chunks

    @classmethod
    def from_config(cls, config: Config, axis_sizes: Mapping[str, int]) -> ModelArgs:
        """Parse `config.step.args` for a mesh with these axis sizes, or raise ConfigError."""
        args = step_args(config, cls)
        if "fsdp_axis" not in config.step.args and cls.fsdp_axis not in axis_sizes:
            args = dataclasses.replace(args, fsdp_axis=None)
        args._validate(config.source, axis_sizes)
        return args

    def _validate(self, src: str, axis_sizes: Mapping[str, int]) -> None:
        """The checks that span arguments or need the mesh; types and ranges are the
        converter's."""
        def fail(key: str, problem: str) -> typing.NoReturn:
            raise ConfigError(f"{src}: step.args.{key}: {problem}")

        if self.d_model % self.n_heads:
            fail("n_heads", f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            fail("n_kv_heads", f"n_heads {self.n_heads} is not divisible by n_kv_heads "
                               f"{self.n_kv_heads}")
        if self.head_dim % 2:
            fail("d_model", f"head_dim = d_model / n_heads = {self.head_dim} must be even "
                            f"for RoPE")
        if self.global_batch % self.chunks:
            fail("global_batch", f"{self.global_batch} is not divisible by chunks {self.chunks}")

        mesh_axes = ", ".join(axis_sizes)
        if not self.data_axes:
            fail("data_axes", "expected at least one mesh axis")
        for axis in self.data_axes:
            if axis not in axis_sizes:
                fail("data_axes", f"{axis!r} is not a mesh axis (mesh.axes: {mesh_axes})")
        if len(set(self.data_axes)) != len(self.data_axes):
            fail("data_axes", f"names an axis twice: {list(self.data_axes)}")
        for key in ("fsdp_axis", "tensor_axis"):
            axis = getattr(self, key)
            if axis is not None and axis not in axis_sizes:
                fail(key, f"{axis!r} is not a mesh axis (mesh.axes: {mesh_axes})")
        if self.tensor_axis is not None and self.tensor_axis in self.data_axes:
            fail("tensor_axis", f"{self.tensor_axis!r} is also in data_axes; the batch and "
                                f"the heads cannot be split over the same axis")
        if self.tensor_axis is not None and self.tensor_axis == self.fsdp_axis:
            fail("tensor_axis", f"{self.tensor_axis!r} is also the fsdp_axis")

        data_size = math.prod(axis_sizes[axis] for axis in self.data_axes)
        if self.chunk_batch % data_size:
            fail("global_batch", f"global_batch / chunks = {self.chunk_batch} is not divisible "
                                 f"by the {data_size} devices of data_axes "
                                 f"{list(self.data_axes)}")
        fsdp = axis_sizes[self.fsdp_axis] if self.fsdp_axis is not None else 1
        if self.d_model % fsdp:
            fail("d_model", f"{self.d_model} is not divisible by the {fsdp} devices of "
                            f"fsdp_axis {self.fsdp_axis!r}")
        tensor = axis_sizes[self.tensor_axis] if self.tensor_axis is not None else 1
        for key in ("n_kv_heads", "d_ff", "vocab_size"):
            if getattr(self, key) % tensor:
                fail(key, f"{getattr(self, key)} is not divisible by the {tensor} devices of "
                          f"tensor_axis {self.tensor_axis!r}")


def param_specs(cfg: ModelArgs) -> Params:
    """PartitionSpecs mirroring `init_params`: FSDP on d_model, Megatron tensor parallelism.

    q/k/v and gate/up split their output (heads, d_ff) over the tensor axis and o/down
    their input, so each attention or MLP block needs one reduction over that axis.
    """
    fsdp, tensor = cfg.fsdp_axis, cfg.tensor_axis
    return {
        "embed": P(tensor, fsdp),
        "final_norm": P(None),
        "unembed": P(fsdp, tensor),
        "layers": {
            "attn_norm": P(None, None),
            "wq": P(None, fsdp, tensor, None),
            "wk": P(None, fsdp, tensor, None),
            "wv": P(None, fsdp, tensor, None),
            "wo": P(None, tensor, None, fsdp),
            "mlp_norm": P(None, None),
            "w_gate": P(None, fsdp, tensor),
            "w_up": P(None, fsdp, tensor),
            "w_down": P(None, tensor, fsdp),
        },
    }


def init_params(key: jax.Array, cfg: ModelArgs) -> Params:
    """Fan-in scaled normal weights and unit norms, in the config's dtype.

    The two projections back into the residual stream are scaled down by depth as well
    (GPT-2 style), so the residual's variance at init does not grow with n_layers.
    """
    d, h, kv, hd, f, n = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                          cfg.n_layers)
    dtype = cfg.compute_dtype
    keys = iter(jax.random.split(key, 9))

    def normal(shape: tuple[int, ...], std: float) -> jax.Array:
        return jax.random.normal(next(keys), shape, dtype) * jnp.asarray(std, dtype)

    return {
        "embed": normal((cfg.vocab_size, d), 1.0),
        "final_norm": jnp.ones((d,), dtype),
        "unembed": normal((d, cfg.vocab_size), d ** -0.5),
        "layers": {
            "attn_norm": jnp.ones((n, d), dtype),
            "wq": normal((n, d, h, hd), d ** -0.5),
            "wk": normal((n, d, kv, hd), d ** -0.5),
            "wv": normal((n, d, kv, hd), d ** -0.5),
            "wo": normal((n, h, hd, d), (2 * n * h * hd) ** -0.5),
            "mlp_norm": jnp.ones((n, d), dtype),
            "w_gate": normal((n, d, f), d ** -0.5),
            "w_up": normal((n, d, f), d ** -0.5),
            "w_down": normal((n, f, d), (2 * n * f) ** -0.5),
        },
    }


def forward(params: Params, tokens: jax.Array, cfg: ModelArgs, *,
            mesh: Mesh | None = None) -> jax.Array:
    """Logits (batch, seq, vocab) in the compute dtype for int tokens (batch, seq).

    With a mesh, activations are pinned to batch-over-data_axes (and heads, d_ff and vocab
    over tensor_axis) so the SPMD partitioner never guesses a layout that moves the batch.
    """
    batch = tuple(cfg.data_axes)
    tensor = cfg.tensor_axis

    def constrain(x: jax.Array, *spec: Any) -> jax.Array:
        if mesh is None:
            return x
        return lax.with_sharding_constraint(x, NamedSharding(mesh, P(batch, *spec)))

    embed = params["embed"]
    if mesh is not None:
        # Gather the table over fsdp before the lookup (FSDP moves weights, not
        # activations); the lookup then needs no resharding of the batch-split tokens.
        embed = lax.with_sharding_constraint(embed, NamedSharding(mesh, P(tensor, None)))
    x = constrain(embed[tokens], None, None)
    cos, sin = _rope_tables(tokens.shape[1], cfg.head_dim, cfg.rope_theta)

    def layer(x: jax.Array, w: Params) -> tuple[jax.Array, None]:
        y = _rms_norm(x, w["attn_norm"])
        q = constrain(jnp.einsum("btd,dhk->bthk", y, w["wq"]), None, tensor, None)
        k = constrain(jnp.einsum("btd,dhk->bthk", y, w["wk"]), None, tensor, None)
        v = constrain(jnp.einsum("btd,dhk->bthk", y, w["wv"]), None, tensor, None)
        attn = _attention(_rope(q, cos, sin), _rope(k, cos, sin), v)
        x = constrain(x + jnp.einsum("bthk,hkd->btd", attn, w["wo"]), None, None)
        y = _rms_norm(x, w["mlp_norm"])
        gate = constrain(jnp.einsum("btd,df->btf", y, w["w_gate"]), None, tensor)
        up = constrain(jnp.einsum("btd,df->btf", y, w["w_up"]), None, tensor)
        x = constrain(x + jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, w["w_down"]),
                      None, None)
        return x, None

    body = jax.checkpoint(layer) if cfg.remat else layer
    if cfg.scan_layers:
        x, _ = lax.scan(body, x, params["layers"])
    else:
        for index in range(cfg.n_layers):
            x, _ = body(x, jax.tree.map(lambda w, i=index: w[i], params["layers"]))
    x = _rms_norm(x, params["final_norm"])
    return constrain(jnp.einsum("btd,dv->btv", x, params["unembed"]), None, tensor)


def loss_fn(params: Params, tokens: jax.Array, cfg: ModelArgs, *,
            mesh: Mesh | None = None) -> jax.Array:
    """Mean next-token cross-entropy of int tokens (batch, seq + 1), in float32.

    The log-softmax runs in float32 even for bfloat16 models: over a 128k vocabulary a
    bfloat16 logsumexp loses the differences the loss is made of.
    """
    logits = forward(params, tokens[:, :-1], cfg, mesh=mesh).astype(jnp.float32)
    targets = tokens[:, 1:]
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(logz - picked)


def _rms_norm(x: jax.Array, weight: jax.Array) -> jax.Array:
    """RMSNorm with the statistics in float32, since bfloat16 squares overflow precision."""
    x32 = x.astype(jnp.float32)
    scale = lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + _NORM_EPS)
    return (x32 * scale).astype(x.dtype) * weight


def _rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate (batch, seq, heads, head_dim) by position, half-split (Llama) layout."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal grouped-query attention; q has n_heads, k and v n_kv_heads, in groups.

    Query heads are grouped under their kv head instead of repeating k and v, so a
    tensor-parallel split over kv heads keeps each group on one device.
    """
    b, t, h, hd = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, h // kv, hd)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (hd ** -0.5)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, hd)

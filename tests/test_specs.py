"""The helpers that make correctly sharded abstract inputs easy and wrong ones loud."""

from __future__ import annotations

import pytest

from testing.jaxproc import result, run_jax

pytestmark = pytest.mark.e2e

CODE = r'''
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from jaxwarm.specs import risky_inputs
from jaxwarm.specs import sharded_specs

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "fsdp"))
one = sharded_specs({"tokens": jnp.zeros((8, 16), jnp.int32)}, mesh, P("data"))
tree = sharded_specs({"w": jax.ShapeDtypeStruct((16, 4), jnp.float32), "b": np.zeros(4)},
                     mesh, {"w": P("fsdp", None), "b": P()})
found = risky_inputs((tree, jax.ShapeDtypeStruct((8, 16), jnp.int32), 3, np.int32(3)))
key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # a fresh PRNG key: passed uncommitted
uncommitted = risky_inputs((tree, key), {"rng": key}, uncommitted=(1, "rng"))
committed = risky_inputs((tree, key), {"rng": key})
print("RESULT " + json.dumps({
    "tokens": [str(one["tokens"].sharding.spec), str(one["tokens"].dtype)],
    "w": str(tree["w"].sharding.spec), "b": str(tree["b"].sharding.spec),
    "found": found, "uncommitted": uncommitted, "committed": committed}))
'''


def test_sharded_specs_and_risky_inputs() -> None:
    out = result(run_jax(CODE, devices=8))
    assert out["tokens"] == ["P('data',)", "int32"]
    assert out["w"] == "P('fsdp', None)" and out["b"] == "P()"
    # The sharded tree and the typed np.int32 are fine; the unsharded spec and the int are not.
    assert len(out["found"]) == 2
    assert "[1] is a ShapeDtypeStruct without a sharding" in out["found"][0]
    assert "[2] is a Python int (weakly typed)" in out["found"][1]
    # An argument the real call passes uncommitted is right to be unsharded: no warning.
    assert out["uncommitted"] == []
    assert [line.split()[0] for line in out["committed"]] == ["[1]", "rng"]

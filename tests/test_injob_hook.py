"""The in-job hook in a user's own trainer: settings applied, double compiles flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxwarm.core.records import RECOMPILED
from jaxwarm.core.rundir import report_path
from testing.jaxproc import run_jax
from tests.conftest import DEMO

pytestmark = pytest.mark.e2e

DOUBLE_COMPILE = r'''
import sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxwarm import enable_cache
from jaxwarm.core.config import load_config

config = load_config(sys.argv[1], sys.argv[2:])
recorder = enable_cache(config, recompile_warn_s=0.0)
assert jax.config.jax_compilation_cache_dir == config.cache.dir

mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "fsdp"))
sharding = NamedSharding(mesh, P("data"))

@jax.jit
def train_step(w, batch):
    h = batch
    for _ in range(20):
        h = jnp.tanh(h @ w)
    return h.sum()

w = jnp.ones((256, 256))
# The MaxText bug: an AOT compile from an UNSHARDED dummy batch ...
train_step.lower(w, jax.ShapeDtypeStruct((64, 256), jnp.float32)).compile()
# ... then the real call with a sharded batch compiles again under another key.
batch = jax.device_put(np.ones((64, 256), np.float32), sharding)
train_step(w, batch).block_until_ready()
recorder.mark_first_step()
'''


def test_double_compile_is_flagged_with_the_differing_component(tmp_path: Path) -> None:
    run_jax(DOUBLE_COMPILE, devices=8, args=(
        str(DEMO), f"run.out_dir={tmp_path}", f"cache.dir={tmp_path / 'cache'}",
        "cache.min_compile_time_secs=0"))
    report = json.loads(report_path(tmp_path / "demo", "train", 0, 0).read_text())
    steps = [fn for fn in report["functions"] if fn["name"] == "jit_train_step"]
    assert len(steps) == 2 and steps[0]["key"] != steps[1]["key"]
    assert [w["kind"] for w in report["warnings"]] == [RECOMPILED]
    assert "'jit_train_step' was compiled twice" in report["warnings"][0]["text"]
    assert "computation differs" in report["warnings"][0]["text"]
    assert (tmp_path / "cache").is_dir()
    assert report["time_to_first_step_s"] > 0 and report["cache_dir"] == str(tmp_path / "cache")

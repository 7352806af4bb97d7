"""A compile target that needs what the trainer lowers inside (jax.set_mesh and flax-style
logical axis rules) and compiles with XLA compiler options: the prewarm job lowers it inside
its context and compiles it with its options, and verify predicts the same key (WARM); the
same target without the options is COLD, for its compile options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import DEMO, ONE_PROCESS, run_cli

FACTORY = '''
import contextlib
import contextvars

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxwarm.step import CompileTarget

from jaxwarm.step import StepBundle

_RULES = contextvars.ContextVar("rules", default=None)


@contextlib.contextmanager
def logical_axis_rules(rules):
    """flax.linen.logical_axis_rules in miniature: logical axis name -> mesh axis."""
    token = _RULES.set(dict(rules))
    try:
        yield
    finally:
        _RULES.reset(token)


def constrain(x, *logical):
    rules = _RULES.get()
    if rules is None:
        raise RuntimeError("no logical axis rules in context")
    # A bare PartitionSpec: only valid under jax.set_mesh.
    return jax.lax.with_sharding_constraint(x, P(*(rules.get(n) for n in logical)))


def step(x):
    return constrain(x * 2.0, "batch", None).sum(axis=1)


def make(config, mesh):
    options = {"xla_backend_optimization_level": 1} if config.step.args["options"] else None
    batch = jax.ShapeDtypeStruct((8, 4), np.float32, sharding=NamedSharding(mesh, P("data")))
    return StepBundle(targets=(CompileTarget(
        "train_step", jax.jit(step), (batch,),
        context=(lambda: jax.set_mesh(mesh), lambda: logical_axis_rules([("batch", "data")])),
        compiler_options=options),))
'''


@pytest.mark.e2e
def test_a_target_lowered_in_its_context_with_compiler_options(tmp_path: Path) -> None:
    (tmp_path / "ctx_factory.py").write_text(FACTORY)
    args = [str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}", *ONE_PROCESS,
            f"cache.dir={tmp_path / 'cache'}", "cache.min_compile_time_secs=0",
            "step.factory=ctx_factory:make", "step.args={options: true}",
            f"env={{PYTHONPATH: {json.dumps(str(tmp_path))}}}"]
    prewarmed = run_cli("prewarm", *args)
    assert prewarmed.returncode == 0, prewarmed.stderr[-3000:]
    assert "cannot be trusted" not in prewarmed.stderr  # predicted key == JAX's own

    warm = run_cli("verify", *args)
    assert warm.returncode == 0, warm.stdout + warm.stderr[-3000:]
    assert warm.stdout.startswith("WARM  jit_step")

    cold = run_cli("verify", *args, "step.args={options: false}")
    assert cold.returncode == 1, cold.stdout + cold.stderr[-3000:]
    assert "COLD  jit_step" in cold.stdout and "compile_options differs" in cold.stdout

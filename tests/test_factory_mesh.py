"""A trainer that builds its own mesh (MaxText: from its own parallelism settings): the step
factory returns it, `mesh.axes` is left out, and the prewarm job lowers on that mesh and
says so; `mesh.axes` that do not describe the factory's mesh, or no mesh at all, are one
line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxwarm.core.records import PREWARM
from jaxwarm.core.rundir import log_path
from tests.conftest import DEMO, run_cli

pytestmark = pytest.mark.e2e

FACTORY = '''
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxwarm.step import CompileTarget

from jaxwarm.step import StepBundle


def step(x):
    return (x * 2.0).sum(axis=1)


def make(config, mesh):
    if config.step.args["own_mesh"]:
        mesh = Mesh(np.asarray(jax.devices()).reshape(2, 2), ("stage", "fsdp"))
    batch = jax.ShapeDtypeStruct((8, 4), np.float32,
                                 sharding=NamedSharding(mesh, P("fsdp")) if mesh else None)
    return StepBundle(targets=(CompileTarget("train_step", jax.jit(step), (batch,)),),
                      mesh=mesh if config.step.args["own_mesh"] else None)
'''


def args(tmp_path: Path, *overrides: str) -> list[str]:
    (tmp_path / "own_mesh_factory.py").write_text(FACTORY)
    return [str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", "cache.min_compile_time_secs=0",
            "topology.processes_per_node=1", "topology.devices_per_process=4",
            "step.factory=own_mesh_factory:make",
            f"env={{PYTHONPATH: {json.dumps(str(tmp_path))}}}",
            *overrides]


def test_the_factory_s_own_mesh_is_the_one_used_and_printed(tmp_path: Path) -> None:
    own = args(tmp_path, "mesh.axes=null", "step.args={own_mesh: true}")
    prewarmed = run_cli("prewarm", *own)
    assert prewarmed.returncode == 0, prewarmed.stderr[-3000:]
    log = log_path(tmp_path / "runs" / "demo", PREWARM, 0).read_text()
    assert "mesh {'stage': 2, 'fsdp': 2}" in log, log[-3000:]
    warm = run_cli("verify", *own)
    assert warm.returncode == 0 and warm.stdout.startswith("WARM  jit_step"), \
        warm.stdout + warm.stderr[-3000:]


def test_mesh_axes_that_are_not_the_factory_s_mesh_are_refused(tmp_path: Path) -> None:
    result = run_cli("prewarm", *args(tmp_path, "mesh.axes={data: 4}",
                                      "step.args={own_mesh: true}"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert ("mesh.axes: {'data': 4}, but the step factory own_mesh_factory:make built its own "
            "mesh {'stage': 2, 'fsdp': 2}, which the run uses") in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("overrides", [
    ("step.args={own_mesh: false}",),                                  # returns mesh=None
    ("step.factory=jaxwarm.workload.chunkwise:make_train_step",),      # the demo's step
], ids=["no-mesh-returned", "demo-step"])
def test_no_mesh_axes_and_no_mesh_from_the_factory_is_one_line(
        tmp_path: Path, overrides: tuple[str, ...]) -> None:
    result = run_cli("prewarm", *args(tmp_path, "mesh.axes=null", *overrides))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "mesh.axes: " in result.stderr and "Traceback" not in result.stderr

"""jaxwarm.workload.small: the reference trainer's smallest step (the test suite's FAST_STEP)
takes the reference trainer's batches as they are, learns, and compiles once; its one step
reads every device's rows, so across processes it is a collective of every rank."""

from __future__ import annotations

import pytest

from bench.common import SMALL_STEP
from testing.jaxproc import REPO, result, run_jax

DEMO = REPO / "configs" / "demo.yaml"

TRAIN = r'''
import json, sys
import jax, numpy as np
from jaxwarm.core.config import load_config
from jaxwarm.step import build_step
from jaxwarm.workload.data import batch_spec
from jaxwarm.workload.data import make_global_batch

config = load_config(sys.argv[1], ["topology.processes_per_node=1", "mesh.axes={data: 2, fsdp: 2}",
                                   "topology.devices_per_process=4", sys.argv[2]])
mesh, bundle = build_step(config)
state = bundle.init_state(np.uint32(0))
compiles, losses = 0, []
for step in range(4):
    batch = make_global_batch(config, mesh, step)
    state, metrics = bundle.train_step(state, batch)
    losses.append(float(metrics["loss"]))
print("RESULT " + json.dumps({
    "batch_is_the_reference": bundle.batch == batch_spec(config, mesh),
    "state_matches": jax.tree.map(lambda a, s: a.sharding == s.sharding and a.shape == s.shape,
                                  state, bundle.state),
    "compiles": bundle.train_step._cache_size(), "losses": losses, "step": int(state["step"])}))
'''


@pytest.mark.e2e
def test_it_trains_on_the_reference_batches_with_one_executable() -> None:
    out = result(run_jax(TRAIN, devices=4, args=(str(DEMO), SMALL_STEP)))
    assert out["batch_is_the_reference"]
    assert out["state_matches"] == {"step": True, "w": True}
    assert out["compiles"] == 1 and out["step"] == 4
    losses = out["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses

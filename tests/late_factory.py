"""Step factories whose processes other than 0 build the step late: the skew of a real
launch (process 0 loads the step from the cache while the others compile it, for 30-70 s on
2 cores with 16 ranks), made certain instead of depending on the machine's load. LATE_S is
beyond Gloo's fixed 30 s wait for a collective's peers on CPU.

The late steps are the reference trainer's small one (`jaxwarm.workload.small`: its one step
is a collective of every rank, and nothing more): where the ranks' meeting is the point, not
the model, a rank traces, lowers and compiles it for a fraction of the chunkwise step's CPU
(8 ranks: 20 CPU-s against 44). `make_small_step_late`: built LATE_S late on every process
but 0.
`make_small_step_last_late`, for many ranks: the other ranks start once process 0 waits at
its first meeting, and only the last one LATE_S after that, so that the others' compiles run
during its lateness instead of after it. `train_one_step`: a trainer that stops at its first
step. `make_train_step_a_little_late`: the reference step, A_LITTLE_LATE_S late."""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from jaxwarm.core.records import TRAIN
from jaxwarm.jaxkey.kvstore import KVStore
from jaxwarm.job.ranks import PREFIX
from jaxwarm.job.start.jobstart import job_main, start_job
from jaxwarm.job.start.pinned import config_from_env
from jaxwarm.step import StepBundle
from jaxwarm.workload.small import make_train_step as make_small_step

LATE_S = 40.0
# Late enough that a meeting bound of milliseconds surely runs out before the others come:
# the coordination service enforces a barrier's deadline at a periodic check, so ranks that
# reach a meeting close together (a tiny step's compile on a quiet machine) meet even under
# a 1 ms bound.
A_LITTLE_LATE_S = 5.0
# What process 0 posts when it reaches the ranks' first meeting (`jaxwarm.job.ranks`), after
# the first program the trainer compiles, its state's initializer.
FIRST_MEETING_OF_0 = f"{PREFIX}/meet/all/jit_init_state/0/0"
WAIT_FOR_0_S = 1800.0


def make_small_step_late(config: Any, mesh: Any) -> StepBundle:
    if jax.process_index() != 0:
        time.sleep(LATE_S)
    return make_small_step(config, mesh)


def make_small_step_last_late(config: Any, mesh: Any) -> StepBundle:
    """Process 0 builds (and compiles) at once, alone, as a rank that loads from the cache
    is first; every other waits until process 0 waits at its first meeting, and the last
    process LATE_S more: process 0 waits at least LATE_S for it, whatever the machine's
    load, while the others compile."""
    if jax.process_index() != 0:
        store = KVStore.of_job()
        assert store is not None, "make_small_step_last_late: no jax.distributed job"
        store.get(FIRST_MEETING_OF_0, WAIT_FOR_0_S)
        if jax.process_index() == jax.process_count() - 1:
            time.sleep(LATE_S)
    return make_small_step(config, mesh)


def make_train_step_a_little_late(config: Any, mesh: Any) -> StepBundle:
    # Imported here: the reference model's modules (optax among them) cost every rank of
    # the small step's tests some 0.5 s of CPU they do not use.
    from jaxwarm.workload.chunkwise import make_train_step

    if jax.process_index() != 0:
        time.sleep(A_LITTLE_LATE_S)
    return make_train_step(config, mesh)


def train_one_step() -> int:
    """A trainer that stops at its first step: started as every job starts (`start_job`),
    the state initialized, one step run on a batch of ones and marked. What the reference
    trainer does after (its ranks' stop agreement, a collective, and its checkpoint, an
    orbax save by every rank) is no part of how the ranks reach their first step."""
    return job_main(_one_step)


def _one_step() -> int:
    config = config_from_env()
    recorder, _, bundle = start_job(config, TRAIN)
    assert bundle.train_step is not None and bundle.init_state is not None
    state = bundle.init_state(np.uint32(config.train.seed))
    spec = bundle.batch
    batch = jax.make_array_from_callback(
        spec.shape, spec.sharding, lambda index: np.ones(spec.shape, spec.dtype)[index])
    state, _ = bundle.train_step(state, batch)
    jax.block_until_ready(state)
    recorder.mark_first_step()
    return 0

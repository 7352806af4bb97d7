"""A step factory whose processes other than 0 build the step LATE_S seconds late: the skew
of a real launch (process 0 loads the step from the cache while the others compile it, for
30-70 s on 2 cores with 16 ranks), made certain instead of depending on the machine's load.
LATE_S is beyond Gloo's fixed 30 s wait for a collective's peers on CPU.

For many ranks, `make_train_step_last_late`: the other ranks start once process 0 waits at
its first meeting, and only the last one LATE_S after that, so that the others' compiles
run during its lateness instead of after it; and `train_one_step`, a trainer that stops at
its first step."""

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
from jaxwarm.workload.chunkwise import make_train_step
from jaxwarm.workload.data import make_global_batch

LATE_S = 40.0
# Late enough that a meeting bound of milliseconds surely runs out before the others come:
# the coordination service enforces a barrier's deadline at a periodic check, so ranks that
# reach a meeting close together (a tiny step's compile on a quiet machine) meet even under
# a 1 ms bound.
A_LITTLE_LATE_S = 5.0
# What process 0 posts when it reaches the ranks' first meeting (`jaxwarm.job.ranks`), after
# the first program the reference trainer compiles, its state's initializer.
FIRST_MEETING_OF_0 = f"{PREFIX}/meet/all/jit_init_state/0/0"
WAIT_FOR_0_S = 1800.0


def make_train_step_late(config: Any, mesh: Any) -> Any:
    return _late(config, mesh, LATE_S)


def make_train_step_a_little_late(config: Any, mesh: Any) -> Any:
    return _late(config, mesh, A_LITTLE_LATE_S)


def _late(config: Any, mesh: Any, seconds: float) -> Any:
    if jax.process_index() != 0:
        time.sleep(seconds)
    return make_train_step(config, mesh)


def make_train_step_last_late(config: Any, mesh: Any) -> Any:
    """Process 0 builds (and compiles) at once, alone, as a rank that loads from the cache
    is first; every other waits until process 0 waits at its first meeting, and the last
    process LATE_S more: process 0 waits at least LATE_S for it, whatever the machine's
    load, while the others compile."""
    if jax.process_index() != 0:
        store = KVStore.of_job()
        assert store is not None, "make_train_step_last_late: no jax.distributed job"
        store.get(FIRST_MEETING_OF_0, WAIT_FOR_0_S)
        if jax.process_index() == jax.process_count() - 1:
            time.sleep(LATE_S)
    return make_train_step(config, mesh)


def train_one_step() -> int:
    """A trainer that stops at its first step: started as every job starts (`start_job`),
    the state initialized, one step run and marked. What the reference trainer does after
    (its ranks' stop agreement, a collective, and its checkpoint, an orbax save by every
    rank) is no part of how the ranks reach their first step."""
    return job_main(_one_step)


def _one_step() -> int:
    config = config_from_env()
    recorder, mesh, bundle = start_job(config, TRAIN)
    assert bundle.train_step is not None and bundle.init_state is not None
    state = bundle.init_state(np.uint32(config.train.seed))
    state, _ = bundle.train_step(state, make_global_batch(config, mesh, 0))
    jax.block_until_ready(state)
    recorder.mark_first_step()
    return 0

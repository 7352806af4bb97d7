"""A step factory whose processes other than 0 build the step LATE_S seconds late: the skew
of a real launch (process 0 loads the step from the cache while the others compile it, for
30-70 s on 2 cores with 16 ranks), made certain instead of depending on the machine's load.
LATE_S is beyond Gloo's fixed 30 s wait for a collective's peers on CPU."""

from __future__ import annotations

import time
from typing import Any

import jax

from jaxwarm.workload.chunkwise import make_train_step

LATE_S = 40.0
# Late enough that a meeting bound of milliseconds surely runs out before the others come:
# the coordination service enforces a barrier's deadline at a periodic check, so ranks that
# reach a meeting close together (a tiny step's compile on a quiet machine) meet even under
# a 1 ms bound.
A_LITTLE_LATE_S = 5.0


def make_train_step_late(config: Any, mesh: Any) -> Any:
    return _late(config, mesh, LATE_S)


def make_train_step_a_little_late(config: Any, mesh: Any) -> Any:
    return _late(config, mesh, A_LITTLE_LATE_S)


def _late(config: Any, mesh: Any, seconds: float) -> Any:
    if jax.process_index() != 0:
        time.sleep(seconds)
    return make_train_step(config, mesh)

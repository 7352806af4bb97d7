"""A step factory that, in the training job, replaces the step's entry in the cache with what
`PLANT_IN_CACHE` names (`link`: a link to /dev/zero; `fifo`: a FIFO): what another
writer of the cache could do after the launch's and the job's checks, right before JAX's own
lookup of the step."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PLANT = "PLANT_IN_CACHE"


def make_train_step_and_plant(config: Any, mesh: Any) -> Any:
    from jaxwarm.workload.chunkwise import make_train_step  # jax, in the job alone

    bundle = make_train_step(config, mesh)
    plant = os.environ.get(PLANT)
    if plant:
        for entry in Path(config.cache.dir).glob("jit_train_step-*-cache"):
            entry.unlink()
            if plant == "link":
                entry.symlink_to("/dev/zero")
            else:
                os.mkfifo(entry)
    return bundle

"""A step factory that, in the training job, replaces entries in the cache with what
`PLANTED` names (`link`: a link to /dev/zero; `fifo`: a FIFO), when `PLANT_IN_CACHE` is set:
what another writer of the cache could do after the launch's and the job's checks, right
before JAX's own lookups of the step and of the state's initializer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PLANT = "PLANT_IN_CACHE"
# function -> what its entry becomes: one kind each, so that one launch meets both.
PLANTED = {"jit_train_step": "link", "jit_init_state": "fifo"}


def make_train_step_and_plant(config: Any, mesh: Any) -> Any:
    from jaxwarm.workload.chunkwise import make_train_step  # jax, in the job alone

    bundle = make_train_step(config, mesh)
    if os.environ.get(PLANT):
        for function, plant in PLANTED.items():
            for entry in Path(config.cache.dir).glob(f"{function}-*-cache"):
                entry.unlink()
                if plant == "link":
                    entry.symlink_to("/dev/zero")
                else:
                    os.mkfifo(entry)
    return bundle

"""Joining the job's processes with `jax.distributed`, the same way under every runner.

Where the process stands (coordinator, count, index) is read in `launcher.injob.place`:
the local runner names the coordinator; under SLURM, JAX detects everything from SLURM's
own environment. A single-process job needs no coordinator.
"""

from __future__ import annotations

import logging

from launcher.injob.phases import timed_join
from launcher.injob.place import Place

log = logging.getLogger("jaxwarm.distributed")


def initialize() -> None:
    """Call before anything touches devices; a no-op for a single-process job."""
    import jax

    place = Place.here()
    if place.num_processes <= 1 and place.coordinator is None:
        return
    with timed_join():  # an init phase of its own in the report
        if place.coordinator is not None:
            jax.distributed.initialize(coordinator_address=place.coordinator,
                                       num_processes=place.num_processes,
                                       process_id=place.process_id)
        else:
            jax.distributed.initialize()
    log.info("joined jax.distributed as process %d of %d", jax.process_index(),
             jax.process_count())

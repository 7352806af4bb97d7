"""Joining the job's processes with `jax.distributed`, the same way under every runner.

Where the process stands (coordinator, count, index) is read in `launcher.injob.place`:
the local runner names the coordinator; under SLURM, JAX detects everything from SLURM's
own environment. A single-process job needs no coordinator.
"""

from __future__ import annotations

import logging
import os

from launcher.config import LOCAL_DEVICE_IDS, TopologyConfig
from launcher.injob.phases import timed_join
from launcher.injob.place import Place

log = logging.getLogger("jaxwarm.distributed")

def local_device_ids(topology: TopologyConfig, place: Place) -> list[int] | None:
    """The GPUs of this process on its node, by the layout: the `devices_per_process` after
    those of the node's earlier processes. Left alone, JAX gives a detected cluster's process
    one GPU, its local rank (SLURM_LOCALID, or the local runner's Open MPI variables), which
    is wrong for 2 or more per process. `JAX_LOCAL_DEVICE_IDS` in the config's `env` wins
    (e.g. "0": processes sharing one GPU, as `bench.gpu_check` runs them; the config checks
    its form; JAX >= 0.10 reads it too, jaxwarm passes it on every jax). None on CPU."""
    given = os.environ.get(LOCAL_DEVICE_IDS)
    if given:
        return [int(part) for part in given.split(",")]
    if topology.platform != "gpu":
        return None
    first = place.local_rank * topology.devices_per_process
    return list(range(first, first + topology.devices_per_process))


def initialize(topology: TopologyConfig) -> None:
    """Call before anything touches devices; a no-op for a single-process job."""
    import jax

    place = Place.here()
    if place.num_processes <= 1 and place.coordinator is None:
        return
    devices = local_device_ids(topology, place)
    with timed_join():  # an init phase of its own in the report
        if place.coordinator is not None:
            jax.distributed.initialize(coordinator_address=place.coordinator,
                                       num_processes=place.num_processes,
                                       process_id=place.process_id,
                                       local_device_ids=devices)
        else:
            jax.distributed.initialize(local_device_ids=devices)
    log.info("joined jax.distributed as process %d of %d", jax.process_index(),
             jax.process_count())

"""Joining the job's processes with `jax.distributed`, the same way under every runner.

Where the process stands (coordinator, count, index) is read in `jaxwarm.job.start.place`:
the local runner names the coordinator; under SLURM, JAX detects everything from SLURM's
own environment. A single-process job needs no coordinator.
"""

from __future__ import annotations

import logging
import os

from jaxwarm.core.config import LOCAL_DEVICE_IDS, TopologyConfig
from jaxwarm.job.record.phases import timed_join
from jaxwarm.job.start.place import Place

log = logging.getLogger(__name__)


def local_device_ids(topology: TopologyConfig, place: Place) -> list[int] | None:
    """The GPUs of this process, counted within what CUDA_VISIBLE_DEVICES shows it. Left
    alone, JAX gives a detected cluster's process one GPU, its local rank (SLURM_LOCALID, or
    the local runner's Open MPI variables): wrong for 2 or more per process, and wrong where
    SLURM binds each task its own GPUs (local rank 3 of a task that sees one GPU). So:
    `JAX_LOCAL_DEVICE_IDS` from the config's `env` when given (e.g. "0": processes sharing
    one GPU, as `bench.gpu_check` runs them; the config checks its form; JAX >= 0.10 reads
    it too, jaxwarm passes it on every jax); all it sees when it sees exactly its
    `devices_per_process` (bound by SLURM); else the `devices_per_process` after those of
    the node's earlier processes. None on CPU."""
    given = os.environ.get(LOCAL_DEVICE_IDS)
    if given:
        return [int(part) for part in given.split(",")]
    if topology.platform != "gpu":
        return None
    count = topology.devices_per_process
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and len(visible.split(",")) == count:
        return list(range(count))
    first = place.local_rank * count
    return list(range(first, first + count))


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

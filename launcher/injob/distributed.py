"""Joining the job's processes with `jax.distributed`, the same way under every runner.

The local runner names the coordinator in JAXWARM_* variables; under SLURM, JAX detects
everything from SLURM's own environment. A single-process job needs no coordinator.

A trainer that calls `jax.distributed.initialize()` with no arguments must join the other
processes under the local runner too. JAX (0.10.2) takes the coordinator from
JAX_COORDINATOR_ADDRESS, but the process count and id only from a cluster it detects, so the
local runner also sets the variables of the simplest one, Open MPI's (`OmpiCluster` reads
OMPI_COMM_WORLD_SIZE/RANK/LOCAL_RANK once OMPI_MCA_orte_hnp_uri is present); its URI names
the same coordinator. A trainer that inits only under a cluster manager can test for them
as it does for SLURM_NTASKS.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("jaxwarm.distributed")

COORDINATOR = "JAXWARM_COORDINATOR_ADDRESS"
NUM_PROCESSES = "JAXWARM_NUM_PROCESSES"
PROCESS_ID = "JAXWARM_PROCESS_ID"


def process_variables(coordinator: str, num_processes: int, process_id: int) -> dict[str, str]:
    """The per-process variables a local runner sets (SLURM sets its own equivalents):
    jaxwarm's own, and those JAX's no-argument `jax.distributed.initialize()` detects."""
    return {COORDINATOR: coordinator, NUM_PROCESSES: str(num_processes),
            PROCESS_ID: str(process_id),
            "JAX_COORDINATOR_ADDRESS": coordinator,
            "OMPI_MCA_orte_hnp_uri": f"0.0;tcp://{coordinator}",
            "OMPI_COMM_WORLD_SIZE": str(num_processes),
            "OMPI_COMM_WORLD_RANK": str(process_id),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(process_id)}


def initialize() -> None:
    """Call before anything touches devices; a no-op for a single-process job."""
    import jax

    if COORDINATOR in os.environ:
        jax.distributed.initialize(
            coordinator_address=os.environ[COORDINATOR],
            num_processes=int(os.environ[NUM_PROCESSES]),
            process_id=int(os.environ[PROCESS_ID]))
    elif int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        jax.distributed.initialize()
    else:
        return
    log.info("joined jax.distributed as process %d of %d", jax.process_index(),
             jax.process_count())

"""Joining the job's processes with `jax.distributed`, the same way under every runner.

The local runner names the coordinator in JAXWARM_* variables; under SLURM, JAX detects
everything from SLURM's own environment. A single-process job needs no coordinator.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("jaxwarm.distributed")

COORDINATOR = "JAXWARM_COORDINATOR_ADDRESS"
NUM_PROCESSES = "JAXWARM_NUM_PROCESSES"
PROCESS_ID = "JAXWARM_PROCESS_ID"


def process_variables(coordinator: str, num_processes: int, process_id: int) -> dict[str, str]:
    """The per-process variables a local runner sets (SLURM sets its own equivalents)."""
    return {COORDINATOR: coordinator, NUM_PROCESSES: str(num_processes),
            PROCESS_ID: str(process_id)}


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

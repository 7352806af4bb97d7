"""Who this process is in its job: the one module that reads (and writes) the runners' variables.

Under SLURM each task finds its place in SLURM's own variables (SLURM_PROCID, SLURM_NTASKS,
SLURM_NODEID, SLURM_LOCALID, SLURM_RESTART_COUNT, SLURM_JOB_ID); JAX's
`jax.distributed.initialize()` detects the coordinator from them. The local runner has no
cluster manager, so it names the coordinator and each process's index in JAXWARM_* variables
(`process_variables`), and also sets those of the simplest cluster JAX detects, Open MPI's
(`OmpiCluster` reads OMPI_COMM_WORLD_SIZE/RANK/LOCAL_RANK once OMPI_MCA_orte_hnp_uri is
present; its URI names the same coordinator), so that a trainer calling
`jax.distributed.initialize()` with no arguments joins the others too. JAX (0.10.2) takes the
coordinator from JAX_COORDINATOR_ADDRESS, but the process count and id only from a cluster it
detects. A local job never restarts: its restart count is 0, and it runs on one node (this
machine), where process 0 comes first; its job id is one the runner makes up per start
(JAXWARM_JOB_ID), so that two starts of a job are never taken for one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

COORDINATOR = "JAXWARM_COORDINATOR_ADDRESS"
NUM_PROCESSES = "JAXWARM_NUM_PROCESSES"
PROCESS_ID = "JAXWARM_PROCESS_ID"
JOB_ID = "JAXWARM_JOB_ID"


@dataclass(frozen=True)
class Place:
    """This process's place in its job, the same question under every runner."""

    process_id: int
    num_processes: int
    # Which attempt of the job this is: 0, then 1, 2, ... after each SLURM requeue.
    restart: int
    # The local runner's coordinator; None under SLURM (JAX finds it) or in a lone process.
    coordinator: str | None
    # The SLURM job id; None outside SLURM.
    slurm_job_id: str | None
    # Which node of the job this process runs on, and its index among that node's processes
    # (0 on each node: the one that stages the cache to the node's own disk).
    node: int
    local_rank: int
    # This start of the job: SLURM's job id, or the local runner's; None for a lone process.
    job_id: str | None

    @classmethod
    def here(cls, env: Mapping[str, str] | None = None) -> Place:
        env = os.environ if env is None else env
        local = COORDINATOR in env
        process_id = _int(env, PROCESS_ID if local else "SLURM_PROCID")
        slurm_job_id = env.get("SLURM_JOB_ID") or None
        return cls(
            process_id=process_id,
            num_processes=_int(env, NUM_PROCESSES if local else "SLURM_NTASKS", default=1),
            restart=_int(env, "SLURM_RESTART_COUNT"),
            coordinator=env[COORDINATOR] if local else None,
            slurm_job_id=slurm_job_id,
            node=0 if local else _int(env, "SLURM_NODEID"),
            local_rank=process_id if local else _int(env, "SLURM_LOCALID"),
            job_id=env.get(JOB_ID) if local else slurm_job_id)

    @property
    def attempt(self) -> str:
        """This attempt of the job, as a name part: job id and restart (the process id for a
        lone process, which shares its attempt with nobody)."""
        return f"{self.job_id or f'pid{os.getpid()}'}-r{self.restart}"


def _int(env: Mapping[str, str], name: str, default: int = 0) -> int:
    return int(env.get(name) or default)


def process_variables(coordinator: str, num_processes: int, process_id: int,
                      job_id: str) -> dict[str, str]:
    """The per-process variables the local runner sets (SLURM sets its own equivalents):
    jaxwarm's own, read back by `Place.here`, and those JAX's no-argument
    `jax.distributed.initialize()` detects."""
    return {COORDINATOR: coordinator, NUM_PROCESSES: str(num_processes),
            PROCESS_ID: str(process_id), JOB_ID: job_id,
            "JAX_COORDINATOR_ADDRESS": coordinator,
            "OMPI_MCA_orte_hnp_uri": f"0.0;tcp://{coordinator}",
            "OMPI_COMM_WORLD_SIZE": str(num_processes),
            "OMPI_COMM_WORLD_RANK": str(process_id),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(process_id)}

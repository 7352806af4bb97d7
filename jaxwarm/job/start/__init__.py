"""How a job process starts: jaxwarm's hook at jax's import (every launch form), the process's
place in the job, joining jax.distributed, the entrypoint runner and the SLURM task wrapper."""

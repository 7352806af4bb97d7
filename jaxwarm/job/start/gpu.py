"""Inside a job, before its first device: the mock topology a one-node prewarm compiles for,
and the one-line refusal of a GPU target on a host without a GPU.

JAX reads `jax_mock_gpu_topology` (and `jax_cuda_visible_devices`) from `jax.config`, not from
the environment, when it creates the GPU client: so the prewarm job of a `prewarm.layout:
mock` run gets the topology as one variable (`jaxwarm.core.gputarget.MOCK_VARIABLE`) and sets
the options here, before anything creates the client. Where the launcher could not tell
whether the job's host has a GPU (a SLURM node), the job asks JAX and refuses in one line
(exit 2) instead of failing deep inside jax: there is no working GPU compile without a GPU.
"""

from __future__ import annotations

import logging
import os
import socket

from jaxwarm.core.config import Config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.gputarget import MOCK_VARIABLE, gpus_here, mock_options, no_gpu

log = logging.getLogger(__name__)


def mocked_topology() -> str | None:
    """The layout this job compiles for through JAX's mock, or None (the real layout): in a
    mocked job JAX counts the mocked processes in `jax.process_count()`, but only this one
    process runs, so nothing may wait on the others."""
    return os.environ.get(MOCK_VARIABLE) or None


def apply_mock(config: Config) -> str | None:
    """Set JAX's mock GPU topology when this is a mocked prewarm job; returns it (or None).
    Call before anything touches a device: JAX reads it when it creates the GPU client."""
    value = mocked_topology()
    if value is None:
        return None
    import jax

    try:
        options = mock_options(value)
    except ValueError as exc:
        raise ConfigError(f"{config.source}: prewarm.layout: {exc}") from None
    for name, setting in options.items():
        jax.config.update(name, setting)
    log.info("compiling for the run's layout %s (nodes x processes per node x devices per "
             "process) on this one process, through JAX's mock GPU topology", value)
    return value


def require_devices(config: Config) -> None:
    """A GPU-target job must get GPUs from JAX: where it cannot, one line naming why (no GPU
    on this host, or a mock the node cannot give), instead of an error from inside jax."""
    if config.topology.platform != "gpu":
        return
    import jax

    try:
        devices = jax.devices()
    except Exception as exc:  # RuntimeError from the CUDA plugin; without a plugin, jax
        # 0.10 fails an assertion with no message
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else \
            f"{type(exc).__name__}; is the jax CUDA plugin installed?"
        raise ConfigError(gpu_problem(config, f"JAX could not start its GPU backend: "
                                              f"{reason}")) from None
    if devices[0].platform != "gpu":
        raise ConfigError(gpu_problem(config, f"JAX sees {devices[0].platform} devices only"))


def gpu_problem(config: Config, detail: str) -> str:
    """Why a GPU-target job got no GPU: no GPU on this host, or (there is one) JAX's own
    reason, with what a mocked prewarm needs of its node."""
    host = f"host {socket.gethostname()}"
    if not gpus_here():
        return no_gpu(config, host, detail)
    needs = (f"; a mocked prewarm needs topology.devices_per_process="
             f"{config.topology.devices_per_process} GPU(s) of the run's model on its node"
             if mocked_topology() else "")
    return f"{config.source}: topology.platform: gpu: on {host}, {detail}{needs}"

"""What a GPU target needs that a CPU one does not: the one-node mock of the run's layout, and
a host with a GPU. Pure (no jax import): the launcher, the tests and the job share it.

**The mock.** JAX compiles a multi-node GPU program on one node when its mock GPU topology
is set (`jax_mock_gpu_topology = "<partitions>x<hosts per partition>x<devices per host>"`,
jax >= 0.4.36, the same option on 0.8 to 0.12): the CUDA plugin's client then mocks NCCL and
the devices of the other processes, and the mocked process is process 0, the one that writes
the cache. XLA groups a real run's processes into partitions by host (boot id), or by NVLink
fabric on multi-node NVLink systems (GB200 NVL72), so on ordinary GPU nodes the run's layout
`topology.nodes` x `processes_per_node` x `devices_per_process` is that string. The mocked
process must see exactly `devices_per_process` GPUs (XLA refuses another count) of the run's
GPU model (the model is part of the topology fingerprint in the key). JAX reads the option
from `jax.config`, not from the environment, so the prewarm job gets it as one variable
(`MOCK_VARIABLE`) that `jaxwarm.job.start.gpu` applies before the first device is touched.
The topology enters the key only through the accelerator-config fingerprint; the XLA flag
the mock needs (`config.MOCK_XLA_FLAGS`) does enter it, so every job of the run carries it
(`environment.xla_flags`), not only the prewarm.

**No GPU, no compile.** There is no working compile for a GPU target on a host without a
GPU (jax #23971, #28376: `get_topology_desc(platform="cuda")` is broken upstream; JAX's own
deviceless test runs on a GPU host), mock or not. A GPU-target job on such a host is refused
with one line (`no_gpu`): by the launcher when the jobs would run on this machine, by the job
itself where the launcher cannot tell (a SLURM node).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from jaxwarm.core.config import MOCK_LAYOUT, Config, TopologyConfig
from jaxwarm.core.records import PREWARM

# The prewarm job's environment names the topology to mock (jaxwarm.job.start.gpu applies it).
MOCK_VARIABLE = "JAXWARM_MOCK_GPU_TOPOLOGY"
_MOCK_VALUE = re.compile(r"([1-9]\d*)x([1-9]\d*)x([1-9]\d*)")
# The NVIDIA driver's device nodes, one per GPU (nvidiactl, nvidia-uvm are not GPUs).
_GPU_NODE = re.compile(r"nvidia\d+")


def is_mocked(config: Config, job: str) -> bool:
    """Whether this job of the run compiles for a mocked layout: only the prewarm of a
    `prewarm.layout: mock` config; verify and training run on the real layout."""
    return job == PREWARM and config.prewarm.layout == MOCK_LAYOUT


def mock_topology(topology: TopologyConfig) -> str:
    """The run's layout as JAX's mock GPU topology string: partitions (nodes) x hosts per
    partition (processes per node) x devices per host (per process)."""
    return f"{topology.nodes}x{topology.processes_per_node}x{topology.devices_per_process}"


def job_topology(config: Config, job: str) -> TopologyConfig:
    """The process layout a job runs on: the run's own, except a mocked prewarm, which is
    one process on one node with the run's devices per process. Both runners (local,
    SLURM) ask here, so the prewarm job of a mocked run asks SLURM for one node."""
    if not is_mocked(config, job):
        return config.topology
    return dataclasses.replace(config.topology, nodes=1, processes_per_node=1)


def mock_environment(config: Config, job: str) -> dict[str, str]:
    """The variable a mocked prewarm job gets on top of the run's job environment; nothing
    for any other job (what the mock sets must not reach the training job: none of it is in
    the key except through the topology fingerprint)."""
    return {MOCK_VARIABLE: mock_topology(config.topology)} if is_mocked(config, job) else {}


def mock_options(value: str) -> dict[str, str]:
    """The JAX options a mocked process sets before its first device, from MOCK_VARIABLE:
    the topology, and the first `devices per host` GPUs only (a node has more GPUs than one
    process of a 8-processes-per-node run uses; `jax_cuda_visible_devices` counts within
    what CUDA_VISIBLE_DEVICES, e.g. SLURM's allocation, shows). ValueError when malformed."""
    match = _MOCK_VALUE.fullmatch(value)
    if match is None:
        raise ValueError(f"{MOCK_VARIABLE}={value!r}: expected <nodes>x<processes per node>x"
                         f"<devices per process>, e.g. 8x8x1")
    devices = int(match.group(3))
    return {"jax_mock_gpu_topology": value,
            "jax_cuda_visible_devices": ",".join(str(i) for i in range(devices))}


def gpus_here(dev: Path = Path("/dev")) -> list[str]:
    """The NVIDIA GPUs this machine shows, by their device nodes (`/dev/nvidia0`, ...): what
    the launcher can tell without importing jax. Empty on a host without the driver's GPUs."""
    try:
        return sorted(path.name for path in dev.iterdir() if _GPU_NODE.fullmatch(path.name))
    except OSError:
        return []


def no_gpu(config: Config, where: str, detail: str) -> str:
    """The one line that refuses a GPU-target job on a host without a GPU."""
    mocked = " (prewarm.layout: mock too: JAX mocks the other nodes, not the GPU)" \
        if config.prewarm.layout == MOCK_LAYOUT else ""
    return (f"{config.source}: topology.platform: gpu, but {where} has no GPU ({detail}); "
            f"JAX has no working compile for a GPU target without one (jax #23971, "
            f"#28376){mocked}: run the job on a node with a GPU of the run's model")

"""Which of a node's GPUs each process of a GPU job uses (`jaxwarm.job.start.distributed`).

Left to JAX, a process of a detected cluster (SLURM, or the local runner's Open MPI variables)
gets one GPU, its local rank: wrong with 2 or more GPUs per process, and on one GPU shared by
several processes (`bench.gpu_check` on the device machine, where process 1 found no GPU at
all). jaxwarm passes the layout's GPUs instead, unless the config names them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxwarm.core.config import LOCAL_DEVICE_IDS, TopologyConfig, load_config
from jaxwarm.core.errors import ConfigError
from jaxwarm.job.start.distributed import local_device_ids
from jaxwarm.job.start.place import Place
from tests.conftest import DEMO, Cli


def topology(platform: str, devices_per_process: int) -> TopologyConfig:
    return load_config(DEMO, [f"topology.platform={platform}", "topology.nodes=2",
                              "topology.processes_per_node=4",
                              f"topology.devices_per_process={devices_per_process}",
                              "mesh.axes={data: 2, fsdp: 4}" if devices_per_process == 1
                              else "mesh.axes={data: 2, fsdp: 8}"]).topology


def slurm_task(rank: int, per_node: int) -> Place:
    return Place.here({"SLURM_PROCID": str(rank), "SLURM_NTASKS": "8", "SLURM_JOB_ID": "7",
                       "SLURM_NODEID": str(rank // per_node),
                       "SLURM_LOCALID": str(rank % per_node)})


@pytest.fixture(autouse=True)
def no_ids_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOCAL_DEVICE_IDS, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_each_process_gets_the_gpus_after_those_of_its_node_s_earlier_processes() -> None:
    two = topology("gpu", 2)
    assert [local_device_ids(two, slurm_task(rank, 4)) for rank in range(8)] == \
        [[0, 1], [2, 3], [4, 5], [6, 7]] * 2
    one = topology("gpu", 1)
    assert [local_device_ids(one, slurm_task(rank, 4)) for rank in (0, 3, 4, 7)] == \
        [[0], [3], [0], [3]]


def test_a_task_slurm_bound_to_its_own_gpus_uses_all_it_sees(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """`--gpus-per-task` (or `--gpu-bind`): task 3 sees one GPU, as its index 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert local_device_ids(topology("gpu", 1), slurm_task(3, 4)) == [0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert local_device_ids(topology("gpu", 2), slurm_task(3, 4)) == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")  # the whole node: by rank
    assert local_device_ids(topology("gpu", 2), slurm_task(3, 4)) == [6, 7]


def test_a_cpu_job_leaves_the_devices_to_jax() -> None:
    assert local_device_ids(topology("cpu", 1), slurm_task(5, 4)) is None


def test_the_config_can_name_the_gpus_every_process_uses(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    config = load_config(DEMO, ["topology.platform=gpu", 'env={JAX_LOCAL_DEVICE_IDS: "0"}'])
    assert config.env == {LOCAL_DEVICE_IDS: "0"}  # allowed, unlike the other JAX_ variables
    monkeypatch.setenv(LOCAL_DEVICE_IDS, "0")
    assert local_device_ids(config.topology, slurm_task(3, 4)) == [0]


def test_gpus_named_in_another_form_are_refused_at_load(tmp_path: Path, cli: Cli) -> None:
    """One line naming the file and key, exit 2, before anything is submitted."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEMO.read_text() + 'env: {JAX_LOCAL_DEVICE_IDS: "0,x"}\n')
    done = cli("verify", str(bad), "--local")
    assert done.returncode == 2
    assert done.stderr == (f"jaxwarm: error: {bad}: env.JAX_LOCAL_DEVICE_IDS: expected GPU "
                           f"indices separated by commas, e.g. 0,1, got '0,x'\n")


def test_other_jax_variables_stay_jaxwarm_s() -> None:
    with pytest.raises(ConfigError, match=r"env.JAX_LOCAL_DEVICE_IDS_X: jaxwarm sets this "
                                          r"variable itself"):
        load_config(DEMO, ['env={JAX_LOCAL_DEVICE_IDS_X: "0"}'])

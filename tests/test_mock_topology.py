"""`prewarm.layout: mock` on CPU: everything of the one-node GPU prewarm that runs without a GPU.

The config's checks, the layout -> JAX mock settings, what environment and SLURM resources the
prewarm job gets against the training job (a golden prewarm script), what the manifest records
of a mocked compile, verify's explanation when a real layout's key differs from the mocked
one, and the one-line refusal of a GPU target on a machine without a GPU (this one). What
needs a GPU (does the mocked key equal the real layout's?) is `python -m bench.gpu_check`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench.common import LEGACY_CPU_FUSION
from jaxwarm.core.config import Config, load_config
from jaxwarm.core.environment import merge_environment
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.gputarget import (
    MOCK_VARIABLE,
    gpus_here,
    job_topology,
    mock_options,
    mock_topology,
)
from jaxwarm.core.records import FunctionRecord
from jaxwarm.jaxkey.components import likely_causes
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.misses import MissContext
from jaxwarm.store.store import LocalStore
from jaxwarm.submit import flow
from jaxwarm.submit.jobs import prewarm_job, train_job
from jaxwarm.submit.local import LocalBackend
from jaxwarm.submit.prepare import pin_config
from jaxwarm.submit.sbatch import directives, render
from jaxwarm.submit.slurm import executor_parameters, read_jobs
from tests.conftest import DEMO, REPO, TINY_CACHED, run_cli, with_xla_flag
from tests.slurm_cluster import ensure_cluster, job_field

LLAMA = REPO / "configs" / "llama3-8b-64gpu.yaml"
GOLDEN = Path(__file__).parent / "golden"
PINNED = "/runs/llama3-8b/config.yaml"
SHARD_OFF = "--xla_gpu_shard_autotuning=false"


def mocked(*overrides: str) -> Config:
    return load_config(LLAMA, ["prewarm.layout=mock", "run.out_dir=/runs",
                               "cache.dir=/shared/jax-cache", *overrides])


def test_the_run_layout_becomes_jax_mock_topology_and_one_process() -> None:
    config = mocked()
    assert mock_topology(config.topology) == "8x8x1"
    prewarm = job_topology(config, "prewarm")
    assert (prewarm.nodes, prewarm.processes_per_node, prewarm.devices_per_process) == (1, 1, 1)
    assert job_topology(config, "train") == config.topology
    assert job_topology(config, "verify") == config.topology  # verify asks for the real key
    # One process of 8 GPUs per process: the mocked process sees the node's first 8.
    wide = mocked("topology.processes_per_node=1", "topology.devices_per_process=8")
    assert mock_options(mock_topology(wide.topology)) == {
        "jax_mock_gpu_topology": "8x1x8", "jax_cuda_visible_devices": "0,1,2,3,4,5,6,7"}
    assert mock_options("8x8x1")["jax_cuda_visible_devices"] == "0"
    with pytest.raises(ValueError, match="expected <nodes>x<processes per node>x"):
        mock_options("8x8")
    # The run's own layout: nothing changes.
    run = load_config(LLAMA)
    assert job_topology(run, "prewarm") == run.topology


def test_a_mock_layout_is_refused_where_jax_cannot_mock_it() -> None:
    for overrides, expected in [
        (["topology.platform=cpu"], "prewarm.layout: mock needs topology.platform: gpu"),
        (["topology.nodes=1", "topology.processes_per_node=1", "topology.devices_per_process=8",
          "mesh.axes={data: 1, fsdp: 1, tensor: 8}"], "this run has 1 process"),
        (["xla_flags=[--xla_gpu_shard_autotuning=true]"],
         "xla_flags[0]: prewarm.layout: mock gives every job --xla_gpu_shard_autotuning=false"),
        (["prewarm.layout=mocked"], "prewarm.layout: expected one of run, mock, got 'mocked'"),
    ]:
        with pytest.raises(ConfigError, match=expected.replace("[", r"\[")) as caught:
            mocked(*overrides)
        assert str(caught.value).startswith(f"{LLAMA}: ") and "\n" not in str(caught.value)
    # The flag given by hand is the same flag: accepted, and carried once.
    config = mocked(f"xla_flags=[{SHARD_OFF}]")
    assert prewarm_job(config, PINNED).env["XLA_FLAGS"].split().count(SHARD_OFF) == 1


def test_the_prewarm_gets_the_mock_and_every_job_the_flags_it_needs() -> None:
    """The mock is the prewarm's alone; the flag the mocked compile needs is in every job's
    XLA_FLAGS (it is part of the key), so the run carries it by construction."""
    config = mocked()
    prewarm = prewarm_job(config, PINNED).env
    train = train_job(config, PINNED).env
    assert prewarm == {**train, MOCK_VARIABLE: "8x8x1"}
    assert train["XLA_FLAGS"].split() == ["--xla_gpu_enable_latency_hiding_scheduler=true",
                                          SHARD_OFF]
    assert train["JAX_PLATFORMS"] == "cuda"
    plain = load_config(LLAMA, ["run.out_dir=/runs"])
    assert MOCK_VARIABLE not in prewarm_job(plain, PINNED).env
    assert SHARD_OFF not in prewarm_job(plain, PINNED).env["XLA_FLAGS"]


def test_the_slurm_prewarm_asks_for_one_node_and_the_training_job_for_all() -> None:
    """The rendered prewarm script against a golden file (JAXWARM_UPDATE_GOLDEN=1 rewrites
    it), and the same directives on the submitit path."""
    config = mocked()
    job = prewarm_job(config, PINNED)
    script = render(config, "prewarm", ["python", "-m", "jaxwarm.job.prewarm"], job.env,
                    Path("/runs/llama3-8b/slurm/prewarm"))
    golden = GOLDEN / "prewarm-mock.sbatch"
    if os.environ.get("JAXWARM_UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n" in script
    train = directives(config, "train")
    assert (train["nodes"], train["ntasks-per-node"]) == ("8", "8")
    assert executor_parameters(config, "prewarm", None)["nodes"] == "1"
    assert executor_parameters(config, "train", "41")["nodes"] == "8"


def test_the_manifest_records_a_mocked_compile(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from jaxwarm.jaxkey.predict import KeyPrediction
    from jaxwarm.job.prewarm import LoweredTarget, manifest_entry

    monkeypatch.setenv(MOCK_VARIABLE, "2x1x1")
    monkeypatch.setenv("XLA_FLAGS", SHARD_OFF)
    config = mocked()
    key = "jit_train_step-" + "a" * 64
    target = LoweredTarget("train_step", None, 0.5, KeyPrediction(key, "jit_train_step", {}))
    entry = manifest_entry(config, target, "jit_train_step", target.key, 40.0)
    assert (entry.mock_topology, entry.xla_flags) == ("2x1x1", SHARD_OFF)
    store = LocalStore(tmp_path)
    store.record_entries([entry])
    assert store.manifest()[target.key] == entry
    monkeypatch.delenv(MOCK_VARIABLE)
    assert manifest_entry(config, target, "f", target.key, 1.0).mock_topology is None


def mocked_entry(**fields: object) -> ManifestEntry:
    base = dict(function="jit_train_step", key="jit_train_step-" + "b" * 64, run="llama3-8b",
                config="c.yaml", compile_s=1500.0, lower_s=9.0, written=True,
                jax_version="0.11.2", process_count=64, mock_topology="8x8x1",
                xla_flags=f"--xla_gpu_enable_latency_hiding_scheduler=true {SHARD_OFF}",
                components={"computation": "c", "XLA flags": "f", "accelerator_config": "a"})
    return ManifestEntry(**{**base, **fields})  # type: ignore[arg-type]


def test_verify_names_the_component_a_mocked_key_differs_in(tmp_path: Path) -> None:
    """verify on the real layout against a mocked prewarm: the same components are WARM (no
    explanation asked); otherwise each differing component is named, the flags by name."""
    entry = mocked_entry()
    manifest = {entry.key: entry}
    store = LocalStore(tmp_path)
    def missed(**components: str) -> FunctionRecord:
        return FunctionRecord("jit_train_step", None, False,
                              components={**entry.components, **components})

    flags = store.explain_miss(missed(**{"XLA flags": "g"}), manifest, MissContext(
        run="llama3-8b", process_count=64, job="verify",
        xla_flags="--xla_gpu_enable_latency_hiding_scheduler=true"))
    assert flags == [f"XLA_FLAGS changed since the prewarm of run 'llama3-8b': only the "
                     f"prewarm's have {SHARD_OFF}"]
    topology = store.explain_miss(missed(accelerator_config="b"), manifest, MissContext(
        run="llama3-8b", process_count=64, xla_flags=""))
    assert len(topology) == 1 and "accelerator_config differs" in topology[0]
    assert "compiled through the mock topology 8x8x1: the GPU model or layout differs" \
        in topology[0]
    # Flags recorded the same (another argv flag, say): the general causes.
    same = store.explain_miss(missed(**{"XLA flags": "g"}), manifest,
                              MissContext(process_count=64, xla_flags=entry.xla_flags))
    assert same == [f"XLA flags differs from the prewarm of run 'llama3-8b': "
                    f"{likely_causes('XLA flags')}"]
    # A run on another layout than the one mocked: the layout is named.
    other = store.explain_miss(missed(), manifest, MissContext(process_count=16))
    assert "prewarmed it on 64 process(es), this job has 16" in other[0]


@pytest.mark.skipif(bool(gpus_here()), reason="this machine has a GPU")
def test_a_gpu_target_is_refused_here_before_anything_is_written(tmp_path: Path) -> None:
    """This machine has no GPU: `--local` jobs of a GPU target, mocked or not, are refused in
    one line before the run dir, the cache dir or any job exists."""
    cpu_run = [f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}"]
    for layout in ("mock", "run"):
        request = flow.Request("prewarm", [str(LLAMA)], [*cpu_run, f"prewarm.layout={layout}"])
        with pytest.raises(ConfigError) as caught:
            flow.launch(request, LocalBackend())
        line = str(caught.value)
        assert line.startswith(f"{LLAMA}: topology.platform: gpu, but this machine (the local "
                               f"runner starts the jobs here) has no GPU (no /dev/nvidia<N>); "
                               f"JAX has no working compile for a GPU target without one "
                               f"(jax #23971, #28376)"), line
        assert ("JAX mocks the other nodes, not the GPU" in line) == (layout == "mock")
        assert "\n" not in line and not (tmp_path / "runs").exists()
        assert not (tmp_path / "cache").exists()


def test_gpus_are_told_by_their_device_nodes(tmp_path: Path) -> None:
    for name in ("nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm", "null"):
        (tmp_path / name).touch()
    assert gpus_here(tmp_path) == ["nvidia0", "nvidia1"]
    assert gpus_here(tmp_path / "missing") == []


def gpu_demo(tmp_path: Path, *extra: str) -> list[str]:
    """The demo as a 2-node GPU run prewarmed through the mock: what a user without a GPU
    might try."""
    return [str(DEMO), f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}",
            "topology.platform=gpu", "prewarm.layout=mock", "topology.nodes=2",
            "topology.processes_per_node=1", "topology.devices_per_process=1",
            "mesh.axes={data: 2, fsdp: 1}", *extra]


@pytest.mark.e2e
@pytest.mark.skipif(bool(gpus_here()), reason="this machine has a GPU")
def test_a_gpu_job_started_without_a_gpu_refuses_itself_in_one_line(tmp_path: Path) -> None:
    """A prewarm job started where the launcher could not look (by hand here, as SLURM starts
    it on a node): it sets the mock, asks JAX for GPUs, and ends with one line, exit 2,
    before it compiles or writes anything."""
    config, pinned = pin_config(load_config(DEMO, gpu_demo(tmp_path)[1:]))
    job = prewarm_job(config, pinned)
    done = subprocess.run(job.argv, env=merge_environment(dict(os.environ), job.env),
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "compiling for the run's layout 2x1x1" in done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"jaxwarm: error: {DEMO} [{pinned}]: topology.platform: gpu, but "
                           f"host "), last
    assert "has no GPU (JAX could not start its GPU backend: " in last
    assert "JAX mocks the other nodes, not the GPU" in last
    assert "Traceback" not in done.stderr
    assert not list(Path(config.cache.dir).iterdir())  # no manifest, no entry


@pytest.mark.e2e
@pytest.mark.slurm(lane=2)
def test_on_slurm_the_mocked_prewarm_is_one_node_and_refuses_a_node_without_a_gpu(
        tmp_path: Path) -> None:
    """The dev cluster's nodes have no GPU: the one-node prewarm job refuses itself in one
    line in its log, and the launch names it and cancels the 2-node training job."""
    ensure_cluster()
    result = run_cli("launch", *gpu_demo(tmp_path, "--slurm", "--wait"))
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    prewarm, train = read_jobs(tmp_path / "runs" / "demo")
    assert f"prewarm job {prewarm.job_id} ended FAILED" in result.stderr
    assert f"so train job {train.job_id} was cancelled" in result.stderr
    assert (job_field(prewarm.job_id, "NumNodes"), job_field(train.job_id, "NumNodes")) == \
        ("1", "2")
    lines = prewarm.log_path().read_text().splitlines()
    mocked = next(i for i, line in enumerate(lines) if "the run's layout 2x1x1" in line)
    refusal = lines[mocked + 1]  # the job's own last line (submitit's report of it follows)
    assert refusal.startswith("jaxwarm: error: ") and "has no GPU (JAX could not" in refusal


@pytest.mark.e2e
def test_verify_names_the_xla_flag_only_the_prewarm_had(tmp_path: Path) -> None:
    """The manifest keeps the XLA flags a prewarm compiled under (a mocked prewarm's
    --xla_gpu_shard_autotuning=false among them on a GPU); a run without one of them is COLD,
    and verify names the flag. On CPU, with a CPU flag, the tiny step compiled the cheapest
    way in both (every compile recorded, however short)."""
    common = [str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
              f"cache.dir={tmp_path / 'cache'}", "topology.processes_per_node=1",
              "topology.devices_per_process=8", *TINY_CACHED]
    flag = "--xla_cpu_enable_fast_math=false"
    prewarmed = run_cli("prewarm", *common, with_xla_flag(flag, LEGACY_CPU_FUSION))
    assert prewarmed.returncode == 0, prewarmed.stderr[-3000:]
    entries = LocalStore(tmp_path / "cache").manifest().values()
    assert entries and all(flag in entry.xla_flags.split() for entry in entries)
    verified = run_cli("verify", *common, with_xla_flag(LEGACY_CPU_FUSION), "run.name=without")
    assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
    assert f"XLA_FLAGS changed since the prewarm of run 'demo': only the prewarm's have " \
           f"{flag}" in verified.stdout, verified.stdout

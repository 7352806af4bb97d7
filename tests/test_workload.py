"""Tests for jaxwarm.workload: the Llama-style chunkwise step both jobs build from a config.

Anything needing more than one device runs in a fresh subprocess (JAX fixes the device
count at import) that prints one `RESULT <json>` line; argument parsing and the synthetic
data are pure and run here. The subprocesses that train or take gradients compile with
XLA's older CPU fusion code generator (`LEGACY_CPU_FUSION`): they check what the step
computes and how it is laid out, and compile in half the CPU.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.common import LEGACY_CPU_FUSION
from jaxwarm.core.config import Config, parse_config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.yamlio import parse_yaml
from jaxwarm.workload.chunkwise import param_count
from jaxwarm.workload.data import BRANCHING, global_batch_numpy
from jaxwarm.workload.model import ModelArgs
from testing.jaxproc import REPO, result, run_jax, run_jax_processes

DEMO = REPO / "configs" / "demo.yaml"
LLAMA_64 = REPO / "configs" / "llama3-8b-64gpu.yaml"

# The demo on one process with all 8 devices.
DEMO_1x8 = ["topology.processes_per_node=1", "topology.devices_per_process=8"]

LOWER_8B = r'''
import json, re, sys
import jax
from jaxwarm.core.config import load_config
from jaxwarm.step import build_step
from jaxwarm.step import seed_spec

config = load_config(sys.argv[1], ["topology.nodes=1", "topology.processes_per_node=1",
                                   "topology.devices_per_process=64", "topology.platform=cpu"])
mesh, bundle = build_step(config)
abstract = jax.tree.leaves((bundle.state, bundle.batch))
lowered = bundle.train_step.lower(bundle.state, bundle.batch)
init_text = bundle.init_state.lower(seed_spec()).as_text()
text = lowered.as_text()


def sdy(spec, ndim):
    """A PartitionSpec as Shardy prints it: one {axes} per dimension."""
    dims = list(spec) + [None] * (ndim - len(spec))
    names = [() if d is None else (d,) if isinstance(d, str) else d for d in dims]
    return "[" + ", ".join("{" + ", ".join(f'"{n}"' for n in ns) + "}" for ns in names) + "]"


signature = text[text.index("func.func public @main("):].split("\n", 1)[0]
params = jax.tree.leaves(bundle.state["params"])
print("RESULT " + json.dumps({
    "all_abstract": all(type(x) is jax.ShapeDtypeStruct for x in abstract),
    "live_arrays": len(jax.live_arrays()),
    "n_params": sum(x.size for x in params),
    "lowered": re.findall(r"%arg\d+: tensor<[^>]*> \{sdy.sharding = #sdy.sharding<@mesh, "
                          r"(\[[^\]]*\])>", signature),
    "expected": [sdy(x.sharding.spec, len(x.shape)) for x in abstract],
    "step_module": text.startswith("module @jit_train_step "),
    "init_module": init_text.startswith("module @jit_init_state "),
}))
'''


@pytest.mark.e2e
def test_llama3_8b_lowers_on_64_devices_without_materializing() -> None:
    out = result(run_jax(LOWER_8B, devices=64, timeout=600, args=(str(LLAMA_64),)))
    assert out["all_abstract"] and out["live_arrays"] == 0
    assert 8.0e9 < out["n_params"] < 8.1e9
    assert out["step_module"] and out["init_module"]
    assert out["lowered"] == out["expected"]
    # Spot checks of the layout itself, not only its self-consistency.
    assert '[{"tensor"}, {"fsdp"}]' in out["expected"]  # embedding
    assert out["expected"][-1] == '[{"data", "fsdp"}, {}]'  # the batch


TRAIN = r'''
import json, sys
import jax, numpy as np
from jaxwarm.core.config import load_config
from jaxwarm.step import build_step
from jaxwarm.workload.data import global_batch_numpy
from jaxwarm.workload.data import make_global_batch
from jaxwarm.workload.model import ModelArgs


def train(path, overrides):
    config = load_config(path, overrides)
    mesh, bundle = build_step(config)
    args = ModelArgs.from_config(config, dict(mesh.shape))
    state = bundle.init_state(np.uint32(config.train.seed))
    init_matches = jax.tree.all(jax.tree.map(
        lambda x, s: x.sharding == s.sharding and x.dtype == s.dtype, state, bundle.state))
    losses, norms, batches_match = [], [], True
    for step in range(5):
        batch = make_global_batch(config, mesh, step)
        tokens = global_batch_numpy(config.train.seed, step, args.global_batch, args.seq_len,
                                    args.vocab_size)
        batches_match &= batch.sharding == bundle.batch.sharding and \
            batch.shape == bundle.batch.shape and batch.dtype == bundle.batch.dtype and \
            all(np.array_equal(np.asarray(s.data), tokens[s.index])
                for s in batch.addressable_shards)
        state, metrics = bundle.train_step(state, batch)
        losses.append(float(metrics["loss"]))
        norms.append(float(metrics["grad_norm"]))
    out_matches = jax.tree.all(jax.tree.map(
        lambda x, s: x.sharding == s.sharding and x.dtype == s.dtype and x.shape == s.shape,
        state, bundle.state))
    return {"init_matches": bool(init_matches), "out_matches": bool(out_matches),
            "batches_match": bool(batches_match), "losses": losses, "grad_norms": norms,
            "compiles": bundle.train_step._cache_size(), "step": int(state["step"])}


print("RESULT " + json.dumps([train(*case) for case in json.loads(sys.argv[1])]))
'''


# The 8B config's mesh and layout (fsdp 8 x tensor 8, bfloat16), with a model small enough
# to compile and run on CPU.
TINY_ON_LLAMA_64 = ["topology.nodes=1", "topology.processes_per_node=1",
                    "topology.devices_per_process=64", "topology.platform=cpu",
                    "step.args.vocab_size=256", "step.args.d_model=128", "step.args.n_layers=2",
                    "step.args.n_heads=16", "step.args.d_ff=256", "step.args.seq_len=16",
                    "step.args.global_batch=16", "step.args.chunks=2",
                    "step.args.learning_rate=0.003"]


# name: (config, devices, overrides)
TRAIN_CASES: dict[str, tuple[Path, int, list[str]]] = {
    "demo": (DEMO, 8, DEMO_1x8),
    "demo-explicit-mesh": (DEMO, 8, [*DEMO_1x8, "mesh.axis_types=explicit"]),
    "tiny-on-llama3-8b-mesh": (LLAMA_64, 64, TINY_ON_LLAMA_64),
}


@pytest.fixture(scope="module")
def trained() -> dict[str, tuple[dict[str, Any], str]]:
    """Each case of TRAIN_CASES trained, with its process's stderr: the cases of one device
    count share a process (one JAX start for both demo meshes); each builds its own step,
    so each counts its own compiles."""
    done = {}
    for devices in sorted({devices for _, devices, _ in TRAIN_CASES.values()}):
        names = [name for name, case in TRAIN_CASES.items() if case[1] == devices]
        cases = [[str(TRAIN_CASES[name][0]), TRAIN_CASES[name][2]] for name in names]
        proc = run_jax(TRAIN, devices=devices, timeout=600, args=(json.dumps(cases),),
                       xla_flags=(LEGACY_CPU_FUSION,))
        done.update({name: (out, proc.stderr)
                     for name, out in zip(names, result(proc), strict=True)})
    return done


@pytest.mark.parametrize("case", list(TRAIN_CASES))
@pytest.mark.e2e
def test_trains_without_recompiling(case: str,
                                    trained: dict[str, tuple[dict[str, Any], str]]) -> None:
    out, stderr = trained[case]
    assert out["init_matches"] and out["batches_match"]
    losses = out["losses"]
    assert all(np.isfinite(losses)) and all(np.isfinite(out["grad_norms"]))
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < losses[0] - 0.25, losses
    # The output state is typed and sharded exactly like the input: one executable.
    assert out["out_matches"] and out["compiles"] == 1 and out["step"] == 5
    # The layout never makes XLA's partitioner give up and replicate a tensor.
    assert "Involuntary full rematerialization" not in stderr


GRADS = r'''
import dataclasses, json, sys
import jax, numpy as np
from jaxwarm.core.config import load_config
from jaxwarm.step import build_mesh
from jaxwarm.workload.chunkwise import accumulate_gradients
from jaxwarm.workload.chunkwise import param_shardings
from jaxwarm.workload.data import global_batch_numpy
from jaxwarm.workload.model import ModelArgs
from jaxwarm.workload.model import init_params


def loss_and_grads(overrides, chunks):
    config = load_config(sys.argv[1], overrides)
    mesh = build_mesh(config)
    args = dataclasses.replace(ModelArgs.from_config(config, dict(mesh.shape)), chunks=chunks)
    params = jax.device_put(init_params(jax.random.key(0), args), param_shardings(args, mesh))
    tokens = global_batch_numpy(0, 0, args.global_batch, args.seq_len, args.vocab_size)
    batch = jax.device_put(tokens, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(args.data_axes, None)))
    loss, grads = jax.jit(lambda p, b: accumulate_gradients(p, b, args, mesh))(params, batch)
    return float(loss), jax.tree.map(np.asarray, grads)


done = {}  # a run shared by several comparisons is computed once


def run(overrides, chunks):
    key = json.dumps([overrides, chunks])
    if key not in done:
        done[key] = loss_and_grads(overrides, chunks)
    return done[key]


compared = {}
for name, (a, b) in json.loads(sys.argv[2]).items():
    (loss_a, grads_a), (loss_b, grads_b) = run(*a), run(*b)
    worst = max(float(np.max(np.abs(ga - gb)) / np.max(np.abs(ga)))
                for ga, gb in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)))
    compared[name] = {"loss_a": loss_a, "loss_b": loss_b, "grad_rel_err": worst}
print("RESULT " + json.dumps(compared))
'''

# name: the two runs compared, each [overrides, chunks]
GRAD_CASES: dict[str, list[Any]] = {
    "chunks-1-vs-2": [[DEMO_1x8, 1], [DEMO_1x8, 2]],
    "fsdp-vs-tensor-parallel": [[DEMO_1x8, 2],
                                [[*DEMO_1x8, "mesh.axes={data: 1, fsdp: 4, tensor: 2}",
                                  "step.args.tensor_axis=tensor"], 2]],
    "scanned-vs-unrolled-layers": [[DEMO_1x8, 2],
                                   [[*DEMO_1x8, "step.args.scan_layers=false"], 2]],
}


@pytest.fixture(scope="module")
def gradients() -> dict[str, dict[str, float]]:
    """Every comparison of GRAD_CASES in one 8-device process: 4 distinct runs, not 6."""
    return result(run_jax(GRADS, devices=8, timeout=600,
                          args=(str(DEMO), json.dumps(GRAD_CASES)),
                          xla_flags=(LEGACY_CPU_FUSION,)))


@pytest.mark.parametrize("case", list(GRAD_CASES))
@pytest.mark.e2e
def test_gradients_do_not_depend_on_chunking_or_layout(
        case: str, gradients: dict[str, dict[str, float]]) -> None:
    out = gradients[case]
    assert out["loss_b"] == pytest.approx(out["loss_a"], rel=1e-5)
    # Relative to each tensor's largest gradient: tiny entries carry only rounding.
    assert out["grad_rel_err"] < 1e-5


BATCH_2_PROCESSES = r'''
import json, sys
import jax, numpy as np
address, processes, process = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(address, num_processes=processes, process_id=process)
from jaxwarm.core.config import load_config
from jaxwarm.step import build_mesh
from jaxwarm.workload.data import batch_spec
from jaxwarm.workload.data import global_batch_numpy
from jaxwarm.workload.data import make_global_batch
from jaxwarm.workload.model import ModelArgs

checks = {}
for data_axes in ("[data, fsdp]", "[fsdp, data]"):
    config = load_config("configs/demo.yaml", [f"step.args.data_axes={data_axes}"])
    mesh = build_mesh(config)
    args = ModelArgs.from_config(config, dict(mesh.shape))
    batch = make_global_batch(config, mesh, 3)
    tokens = global_batch_numpy(config.train.seed, 3, args.global_batch, args.seq_len,
                                args.vocab_size)
    checks[data_axes] = {
        "sharding": batch.sharding == batch_spec(config, mesh).sharding,
        "shards": all(np.array_equal(np.asarray(s.data), tokens[s.index])
                      for s in batch.addressable_shards),
        "rows": sorted({s.index[0].start for s in batch.addressable_shards}),
    }
print("RESULT " + json.dumps(checks))
'''


@pytest.mark.e2e
def test_make_global_batch_places_each_process_rows() -> None:
    """The demo's real layout (2 processes x 4 devices), contiguous and interleaved rows."""
    outs = [result(proc) for proc in run_jax_processes(BATCH_2_PROCESSES, processes=2,
                                                       devices=4, timeout=600)]
    for out in outs:
        for checks in out.values():
            assert checks["sharding"] and checks["shards"], out
    # [fsdp, data] interleaves the two processes' rows: process 0 holds rows 0, 4, 8, 12.
    assert outs[0]["[data, fsdp]"]["rows"] == [0, 2, 4, 6]
    assert outs[0]["[fsdp, data]"]["rows"] == [0, 4, 8, 12]


def demo_config(mesh_axes: dict[str, int] | None = None, drop: tuple[str, ...] = (),
                **args: Any) -> Config:
    """The demo config with step.args changed; errors name the demo file."""
    raw = copy.deepcopy(parse_yaml(DEMO.read_text(), str(DEMO)))
    raw["step"]["args"].update(args)
    for name in drop:
        del raw["step"]["args"][name]
    if mesh_axes is not None:
        raw["mesh"]["axes"] = mesh_axes
    return parse_config(raw, str(DEMO), DEMO_1x8)


def parse_args(config: Config) -> ModelArgs:
    return ModelArgs.from_config(config, config.mesh.axes)


@pytest.mark.parametrize("change, key, phrase", [
    (dict(d_model="64"), "d_model", "expected an integer, got string '64'"),
    (dict(remat="yes"), "remat", "expected true or false"),
    (dict(learning_rate=True), "learning_rate", "expected a number"),
    (dict(data_axes="data"), "data_axes", "expected a list, got string"),
    (dict(global_batch=15), "global_batch", "not divisible by chunks 2"),
    (dict(global_batch=8), "global_batch", "not divisible by the 8 devices"),
    (dict(n_heads=5), "n_heads", "not divisible by n_heads 5"),
    (dict(n_kv_heads=3), "n_kv_heads", "not divisible by n_kv_heads 3"),
    (dict(d_model=48, n_heads=16, n_kv_heads=16), "d_model", "must be even for RoPE"),
    (dict(dtype="float16"), "dtype", "expected one of float32, bfloat16"),
    (dict(tensor_axis="model"), "tensor_axis", "'model' is not a mesh axis"),
    (dict(fsdp_axis="shard"), "fsdp_axis", "'shard' is not a mesh axis"),
    (dict(data_axes=["data", "batch"]), "data_axes", "'batch' is not a mesh axis"),
    (dict(tensor_axis="fsdp"), "tensor_axis", "also in data_axes"),
    (dict(d_model=66, n_heads=3, n_kv_heads=3), "d_model", "not divisible by the 4 devices"),
    (dict(d_ff=-4), "d_ff", "expected a positive integer, got -4"),
    (dict(learning_rate=float("nan")), "learning_rate", "expected a finite number, got nan"),
    (dict(weight_decay=-0.5), "weight_decay", "expected a number >= 0, got -0.5"),
    (dict(dtype="float32\n"), "dtype", "without control characters"),
])
def test_bad_args_name_the_file_and_key(change: dict[str, Any], key: str, phrase: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_args(demo_config(**change))
    message = str(err.value)
    assert message.startswith(f"{DEMO}: step.args.{key}: "), message
    assert phrase in message and "\n" not in message


def test_missing_and_unknown_args_read_like_config_keys() -> None:
    with pytest.raises(ConfigError, match=r"missing required key 'step\.args\.d_ff'"):
        parse_args(demo_config(drop=("d_ff",)))
    with pytest.raises(ConfigError, match=r"unknown key 'step\.args\.n_head' "
                                          r"\(did you mean 'step\.args\.n_heads'\?\)"):
        parse_args(demo_config(n_head=4))


def test_defaults_follow_the_mesh() -> None:
    args = parse_args(demo_config(mesh_axes={"data": 8}, drop=("data_axes", "fsdp_axis")))
    assert args.data_axes == ("data",) and args.fsdp_axis is None
    assert args.tensor_axis is None and args.remat and args.weight_decay == 0.1
    assert args.rope_theta == 10000.0 and args.head_dim == 16


def test_synthetic_data_is_a_pure_learnable_function_of_seed_and_step() -> None:
    batch = global_batch_numpy(seed=3, step=7, global_batch=4, seq_len=64, vocab_size=50)
    assert batch.dtype == np.int32 and batch.shape == (4, 65)
    assert batch.min() >= 0 and batch.max() < 50
    assert np.array_equal(batch, global_batch_numpy(3, 7, 4, 64, 50))
    assert not np.array_equal(batch, global_batch_numpy(3, 8, 4, 64, 50))
    # Every token has at most BRANCHING successors, the same at every step.
    pairs = np.concatenate([np.stack([b[:, :-1].ravel(), b[:, 1:].ravel()], axis=1) for b in (
        batch, global_batch_numpy(3, 8, 4, 64, 50))])
    successors: dict[int, set[int]] = {}
    for token, nxt in pairs:
        successors.setdefault(int(token), set()).add(int(nxt))
    assert max(len(s) for s in successors.values()) <= BRANCHING


def test_the_parameter_count_reads_at_every_size() -> None:
    """The step's log line: the demo's model is 106,816 parameters, not `0.000B`."""
    assert [param_count(n) for n in (106_816, 1_240_000, 8_030_000_000)] == \
        ["106,816", "1.24M", "8.03B"]

"""A prewarmed function that misses with other inputs says which inputs differ, and an
attempt is called warm only when every prewarmed function hit.

Pure: the comparison of two recorded input signatures, the miss's explanation built on it,
the labels, the records read back. With JAX (a subprocess): the inputs read from the module
JAX looks up, for real programs whose width, dtype, weak type or donation differ.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from jaxwarm.core.inputdiff import input_differences
from jaxwarm.core.jsonio import dumps, from_json
from jaxwarm.core.records import (
    FirstStep,
    FunctionRecord,
    InitPhase,
    InitReport,
    InputLeaf,
    InputSignature,
)
from jaxwarm.core.warmth import warmth
from jaxwarm.jaxkey.components import likely_causes
from jaxwarm.jaxkey.inputs import short_type
from jaxwarm.jaxkey.logs import weak_types
from jaxwarm.report.read import PrewarmedFunctions, fold_phases
from jaxwarm.report.render import attempt_summaries
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.misses import CAUSE_WIDTH, MissContext
from jaxwarm.store.store import LocalStore
from testing.jaxproc import RESULT_PREFIX, run_jax

MESH = {"mesh": '["data"=2, "fsdp"=4]'}


def leaf(path: str, type_: str = "f32[256,64]", sharding: str | None = '@mesh, [{}, {"fsdp"}]',
         donated: bool = True) -> InputLeaf:
    return InputLeaf(path, type_, sharding, donated)


PREWARMED = InputSignature([leaf("state['params']['embed']"), leaf("state['step']", "i32[]"),
                            leaf("batch", "i32[16,33]", '@mesh, [{"data"}, {}]', False)], MESH)


def changed(*leaves: InputLeaf) -> InputSignature:
    """The prewarmed signature with the leaves of the same paths replaced."""
    by_path = {item.path: item for item in leaves}
    return InputSignature([by_path.get(item.path, item) for item in PREWARMED.leaves], MESH)


def test_equal_inputs_have_no_difference() -> None:
    assert input_differences(PREWARMED, dataclasses.replace(PREWARMED)) == []


def test_a_width_batch_dtype_weak_type_sharding_or_donation_change_is_named_per_input() -> None:
    width = changed(leaf("state['params']['embed']", "f32[256,96]"))
    assert input_differences(PREWARMED, width) == [
        "state['params']['embed'] f32[256,96] vs f32[256,64]"]
    batch = changed(leaf("batch", "i32[8,33]", '@mesh, [{"data"}, {}]', False))
    assert input_differences(PREWARMED, batch) == ["batch i32[8,33] vs i32[16,33]"]
    dtype = changed(leaf("state['params']['embed']", "bf16[256,64]"))
    assert input_differences(PREWARMED, dtype) == [
        "state['params']['embed'] bf16[256,64] vs f32[256,64]"]
    weak = changed(leaf("state['step']", "weak i32[]"))
    assert input_differences(PREWARMED, weak) == ["state['step'] weak i32[] vs i32[]"]
    donation = InputSignature([dataclasses.replace(item, donated=False)
                               for item in PREWARMED.leaves], MESH)
    assert input_differences(PREWARMED, donation) == [
        "state['params']['embed'] not donated vs donated",
        "state['step'] not donated vs donated"]
    sharded = changed(leaf("batch", "i32[16,33]", None, False))
    assert input_differences(PREWARMED, sharded) == [
        "batch sharded unspecified vs @mesh, [{\"data\"}, {}]"]


def test_inputs_only_one_side_has_and_another_mesh_are_named() -> None:
    now = InputSignature([*PREWARMED.leaves[1:], leaf("state['params']['head']")],
                         {"mesh": '["data"=1, "fsdp"=8]'})
    assert input_differences(PREWARMED, now) == [
        'mesh @mesh ["data"=1, "fsdp"=8] vs ["data"=2, "fsdp"=4]',
        "state['params']['head'] f32[256,64] is new (the prewarmed function had no such input)",
        "state['params']['embed'] f32[256,64] is gone (an input of the prewarmed function)"]


def test_inputs_without_unique_paths_are_paired_by_position() -> None:
    before = InputSignature([leaf(""), leaf("", "f32[]")])
    after = InputSignature([leaf(""), leaf("", "f32[2]"), leaf("", "u32[]")])
    assert input_differences(before, after) == [
        "input 1 f32[2] vs f32[]",
        "input 2 u32[] is new (the prewarmed function had no such input)"]


def entry(**changes: object) -> ManifestEntry:
    base = ManifestEntry(function="jit_train_step", key="jit_train_step-" + "a" * 64,
                         run="demo", config="c.yaml", compile_s=52.0, lower_s=1.0, written=True,
                         jax_version="0.10.2", process_count=1, signature="s1",
                         components={"computation": "1", "XLA flags": "2"},
                         inputs=PREWARMED)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# Where the misses below happen: run demo's job, on one process.
DEMO_RUN = MissContext(run="demo", process_count=1)


def missed(components: dict[str, str], signature: str,
           input_changes: list[str]) -> FunctionRecord:
    """A lookup of the prewarmed step that missed, as the training job records it."""
    return FunctionRecord("jit_train_step", None, False, components=components,
                          signature=signature, input_changes=input_changes)


def test_a_miss_with_other_inputs_is_said_as_the_inputs_not_as_another_function(
        tmp_path: Path) -> None:
    manifest = {entry().key: entry()}
    changes = input_differences(PREWARMED, changed(
        leaf("state['params']['embed']", "f32[256,96]"),
        leaf("batch", "i32[16,97]", '@mesh, [{"data"}, {}]', False)))
    why = LocalStore(tmp_path).explain_miss(
        missed({"computation": "9", "XLA flags": "2"}, "s2", changes), manifest, DEMO_RUN)
    assert why == ["its inputs differ from the prewarmed ones: state['params']['embed'] "
                   "f32[256,96] vs f32[256,64] (+1 more)"]
    assert not any("another function" in line for line in why)


def test_equal_inputs_and_another_program_say_the_code_changed_first(tmp_path: Path) -> None:
    manifest = {entry().key: entry()}
    computation = {"computation": "9", "XLA flags": "2"}
    store = LocalStore(tmp_path)

    def why(since: list[str] | None) -> list[str]:
        return store.explain_miss(missed(computation, "s1", []), manifest,
                                  dataclasses.replace(DEMO_RUN, since_prewarm=since))

    head = "same inputs as the prewarm: the step's code changed"
    assert why(None) == [f"{head} (or a static argument)"]
    assert why(["source: model/layers.py changed"]) == \
        [f"{head}; since the prewarm: source: model/layers.py changed"]
    assert why([]) == [f"{head}, in code the launch's fingerprint cannot see (imported by a "
                       f"computed name, or run by the trainer only)"]
    # One cause, short, whatever changed: the fingerprint's differences as fit.
    many = why([f"source: model/layer{i}.py changed" for i in range(9)])
    assert len(many) == 1 and len(many[0]) <= CAUSE_WIDTH and many[0].endswith(" more)"), many
    # Another component alone (an XLA flag) is not a code change.
    flags = store.explain_miss(missed({"computation": "1", "XLA flags": "3"}, "s1", []),
                               manifest, DEMO_RUN)
    assert flags == ["XLA flags differs from the prewarm of run 'demo': "
                     f"{likely_causes('XLA flags')}"]


def test_the_attempt_label_is_warm_only_when_every_prewarmed_function_hit() -> None:
    assert warmth(["jit_init", "jit_train_step"], {}, 2, 9) == "warm"
    assert warmth(["jit_init"], {"jit_train_step": 52.04}, 1, 4) == (
        "partly warm (1 of 2 prewarmed functions hit: jit_train_step compiled 52.0 s)")
    assert warmth([], {"jit_init": 1.0, "jit_train_step": 52.0}, 0, 4) == "cold"
    assert warmth([], {}, 3, 9) == "no prewarm on record (3 of 9 lookups hit)"
    assert warmth([], {}, 0, 9) == "cold"
    assert warmth([], {}, 0, 0) == ""


def test_a_report_labels_its_attempt_by_each_prewarmed_function_s_first_lookup() -> None:
    def fn(name: str, hit: bool, seconds: float, prewarmed: bool = True) -> FunctionRecord:
        return FunctionRecord(name=name, key=f"{name}-k{int(hit)}", hit=hit, seconds=seconds,
                              prewarmed=prewarmed)

    report = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                        cache_dir="/c", init_budget_s=60.0, lookups=5, hits=2, functions=[
                            fn("jit_init", True, 0.1), fn("jit_helper", True, 0.01, False),
                            fn("jit_train_step", False, 52.04), fn("jit_init", False, 3.0)])
    assert report.label == ("partly warm (1 of 2 prewarmed functions hit: jit_train_step "
                            "compiled 52.0 s)")
    # The label goes into --json, and is recomputed (not trusted) when read back.
    data = json.loads(dumps(report))
    assert data["label"] == report.label
    assert from_json(InitReport, {**data, "label": "warm"}, "r.json") == report
    # A prewarm's lookups are not a start.
    assert dataclasses.replace(report, job="prewarm").label == ""
    # `jaxwarm status` and the init phases (and --plot's bars) say the same label.
    assert attempt_summaries([report])[0].startswith(f"attempt r0: {report.label}; 2 hit(s)")
    timed = dataclasses.replace(report, phases=[InitPhase("compile", 52.04)])
    assert fold_phases([timed], PrewarmedFunctions(frozenset(), frozenset())) == [
        (f"train r0 p0  {report.label}", {"compile": 52.04})]


def test_first_step_lines_read_back_with_their_prewarmed_outcomes(tmp_path: Path) -> None:
    step = FirstStep(0, 1.0, 79.49, "trainer", 1, 4, prewarmed_hit=["jit_init"],
                     prewarmed_missed={"jit_train_step": 52.0})
    again = from_json(FirstStep, json.loads(dumps(step)), "first-steps.jsonl:1")
    assert again == step and again.label.startswith("partly warm (1 of 2")


def test_the_manifest_keeps_each_entry_s_inputs(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.record_entries([entry()])
    assert store.manifest()[entry().key].inputs == PREWARMED
    older = json.loads(store.manifest_file.read_text())
    del older["entries"][entry().key]["inputs"]  # an entry recorded before inputs were
    store.manifest_file.write_text(json.dumps(older))
    assert store.manifest()[entry().key].inputs is None


def test_types_and_weak_types_read_from_jax_s_text() -> None:
    assert short_type("tensor<256x64xf32>") == "f32[256,64]"
    assert short_type("tensor<f32>") == "f32[]"
    assert short_type("tensor<4xcomplex<f32>>") == "complex<f32>[4]"
    assert short_type("tensor<?x8xbf16>") == "bf16[?,8]"
    assert short_type("!stablehlo.token") == "!stablehlo.token"
    assert weak_types("(ShapedArray(bfloat16[8]), ShapedArray(float32[], weak_type=True), "
                      "ShapedArray(key<fry>[]))") == [False, True, False]
    assert weak_types("()") == []


PROGRAMS = r'''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxwarm.jaxkey.inputs import module_inputs
from jaxwarm.jaxkey.logs import LOWERING
from jaxwarm.jaxkey.logs import LOWERING_LOGGER
from jaxwarm.core.jsonio import dumps
from jaxwarm.core.inputdiff import input_differences
import logging

avals = {}
class Lowering(logging.Handler):
    def emit(self, record):
        match = LOWERING.match(record.getMessage())
        if match:
            avals["last"] = match["avals"]
logging.getLogger(LOWERING_LOGGER).setLevel(logging.DEBUG)
logging.getLogger(LOWERING_LOGGER).addHandler(Lowering())

mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))

def step(state, batch, lr):
    return {"w": state["w"] - lr * batch.sum(), "step": state["step"] + 1}, batch.mean()

def inputs(width=64, dtype=jnp.float32, donate=True, lr=0.1):
    state = {"w": jax.ShapeDtypeStruct((8, width), dtype,
                                       sharding=NamedSharding(mesh, P(None, "fsdp"))),
             "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))}
    batch = jax.ShapeDtypeStruct((4, 3), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    lowered = jax.jit(step, donate_argnums=(0,) if donate else ()).lower(state, batch, lr)
    return module_inputs(lowered.compiler_ir("stablehlo"), avals["last"])

prewarmed = inputs()
cases = {"same": inputs(), "width": inputs(width=96), "dtype": inputs(dtype=jnp.bfloat16),
         "donation": inputs(donate=False), "weak": inputs(lr=np.float32(0.1))}
print("RESULT " + json.dumps({"prewarmed": json.loads(dumps(prewarmed)),
                              **{name: input_differences(prewarmed, now)
                                 for name, now in cases.items()}}))
'''


@pytest.mark.e2e
def test_inputs_read_from_real_programs_name_what_changed() -> None:
    """What a training job reads of a real lowering: each input's path, type, sharding and
    donation from the module, weak types from JAX's lowering line; and the differences a
    width, dtype, donation or weak-type change makes."""
    out = run_jax(PROGRAMS, devices=4).stdout
    result = json.loads(next(line for line in out.splitlines()
                             if line.startswith(RESULT_PREFIX))[len(RESULT_PREFIX):])
    leaves = result["prewarmed"]["leaves"]
    assert [(item["path"], item["type"], item["donated"]) for item in leaves] == [
        ("state['step']", "i32[]", True), ("state['w']", "f32[8,64]", True),
        ("batch", "f32[4,3]", False), ("lr", "weak f32[]", False)]
    assert "fsdp" in leaves[1]["sharding"] and '"fsdp"=2' in result["prewarmed"]["meshes"]["mesh"]
    assert result["same"] == []
    assert result["width"] == ["state['w'] f32[8,96] vs f32[8,64]"]
    assert result["dtype"] == ["state['w'] bf16[8,64] vs f32[8,64]"]
    assert result["donation"] == ["state['step'] not donated vs donated",
                                  "state['w'] not donated vs donated"]
    assert result["weak"] == ["lr f32[] vs weak f32[]"]

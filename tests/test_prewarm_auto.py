"""`--prewarm auto` (the default): a launch goes without its prewarm job when a completed
prewarm ran under the same fingerprint and its entries are intact, and chains it again when
the config, the step's source or the jax version changed. Real launches of the demo; the
run dir's prewarm-decision.json and the report say which happened and why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import PREWARM, PrewarmDecision
from jaxwarm.core.rundir import log_path, prewarm_decision_path, report_path
from jaxwarm.store.store import LocalStore
from testing.legs import LEGS, leg_python, ready
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, REPO, Cli, run_cli, with_xla_flag

pytestmark = pytest.mark.e2e


def decision(run_dir: Path) -> PrewarmDecision:
    found = read_record(PrewarmDecision, prewarm_decision_path(run_dir))
    assert found is not None
    return found


def step_hit(run_dir: Path) -> bool:
    report = json.loads(report_path(run_dir, "train", 0, 0).read_text())
    return [fn["hit"] for fn in report["functions"] if fn["name"] == "jit_train_step"][-1]


def launch_args(tmp_path: Path, name: str, *extra: str, trains: bool = True,
                command: str = "launch") -> list[str]:
    """The demo on one process of 4 devices, its step the tiny one: what decides the prewarm
    depends neither on the number of processes nor on how long the step compiles, and each
    launch costs a fraction of the CPU. Every compile is cached, however fast. Where only
    the prewarm (its decision, its record) is checked, `trains=False` makes the training
    job `true`: the trainer is no part of the fingerprint, and a real one starts JAX.
    `command="prewarm"`: `jaxwarm prewarm`, which records its fingerprint as well."""
    return [command, str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", f"run.name={name}", "train.steps=1",
            *ONE_PROCESS, *FAST_STEP, *extra,
            *(() if trains else ("entrypoint.command=['true']",))]


def launch(tmp_path: Path, name: str, *extra: str, python: str | None = None,
           trains: bool = True, command: str = "launch",
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`jaxwarm` run with `launch_args`, by `python` (this interpreter unless given); `env`:
    variables exported in the launching shell."""
    args = launch_args(tmp_path, name, *extra, trains=trains, command=command)
    if python is None:
        return run_cli(*args, env=env)
    return subprocess.run([python, "-m", "jaxwarm", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


def restored(saved: tuple[Path, Path]) -> Path:
    """The dir a module fixture prewarmed in (WORK, PRISTINE: the dir and its copy as the
    prewarm left it), for a test to launch in and change: restored from the copy before each
    test, at the same path (the cache dir's path is part of the fingerprint)."""
    work, pristine = saved
    shutil.rmtree(work)
    shutil.copytree(pristine, work, symlinks=True)
    return work


def prewarmed_once(root: Path, *extra: str, trains: bool = True,
                   command: str = "launch") -> tuple[Path, Path]:
    """Run `first` launched under ROOT/work (`launch_args`), and a copy of that dir as the
    launch left it, ROOT/pristine: one prewarm for the module's tests that start from it."""
    work, pristine = root / "work", root / "pristine"
    first = launch(work, "first", *extra, trains=trains, command=command)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.copytree(work, pristine, symlinks=True)
    return work, pristine


@pytest.fixture(scope="module")
def first_prewarm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo's run `first` prewarmed (`trains=False`) in a dir of its own."""
    return prewarmed_once(tmp_path_factory.mktemp("first-prewarm"), trains=False)


@pytest.fixture
def prewarmed(first_prewarm: tuple[Path, Path]) -> Path:
    """The dir of the run `first` (its `runs/` and `cache/`) as its prewarm left it."""
    return restored(first_prewarm)


def write_mystep(source: Path) -> None:
    """The demo's step copied under SOURCE as the package `mystep` (its modules import each
    other as `mystep.*`), written the ways users' own steps are: the factory reads its
    model's sizes from sizes.json beside it while it builds the step (the login node cannot
    know that; the prewarm job records it), and the model takes its norm's epsilon from the
    module `mystep.norm`, imported by a computed name (the fingerprint does not reach it)."""
    package = source / "mystep"
    shutil.copytree(REPO / "jaxwarm" / "workload", package)
    for module in package.glob("*.py"):  # the copy imports its own model
        module.write_text(module.read_text().replace("jaxwarm.workload.", "mystep."))
    factory = package / "chunkwise.py"
    factory.write_text(factory.read_text().replace(
        "    args = ModelArgs.from_config(config, dict(mesh.shape))\n",
        "    import dataclasses, json, pathlib\n"
        "    sizes = json.loads((pathlib.Path(__file__).parent / 'sizes.json').read_text())\n"
        "    args = dataclasses.replace(ModelArgs.from_config(config, dict(mesh.shape)), "
        "**sizes)\n"))
    (package / "sizes.json").write_text('{"d_ff": 32}')
    model = package / "model.py"
    model.write_text(model.read_text().replace(
        "_NORM_EPS = 1e-5",
        "import importlib\n_NORM_EPS = importlib.import_module('mystep.' + 'norm').EPS"))
    (package / "norm.py").write_text("EPS = 1e-5\n")


def mystep_args(root: Path) -> tuple[str, str]:
    """The overrides that make `mystep` under ROOT/src the step."""
    return "step.factory=mystep.chunkwise:make_train_step", f"env.PYTHONPATH={root / 'src'}"


@pytest.fixture(scope="module")
def mystep_prewarm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """`write_mystep` under a dir of its own, and its run `first` prewarmed there by
    `jaxwarm prewarm` (which records its fingerprint as a launch's prewarm does)."""
    root = tmp_path_factory.mktemp("mystep-prewarm")
    write_mystep(root / "work" / "src")
    return prewarmed_once(root, *mystep_args(root / "work"), command="prewarm")


@pytest.fixture
def mystep(mystep_prewarm: tuple[Path, Path]) -> Path:
    """The dir of `mystep`'s run `first` (its `src/`, `runs/` and `cache/`) as its prewarm
    left it."""
    return restored(mystep_prewarm)


def test_a_relaunch_with_the_same_fingerprint_goes_without_its_prewarm(prewarmed: Path) -> None:
    made = decision(prewarmed / "runs" / "first")
    assert made.prewarm and made.mode == "auto"
    assert made.why.startswith("no completed prewarm has this fingerprint")
    [record] = LocalStore(prewarmed / "cache").prewarms().values()
    assert record.fingerprint == made.fingerprint and record.run == "first"
    assert {key.rpartition("-")[0] for key in record.keys} == {"jit_train_step",
                                                               "jit_init_state"}

    # Same fingerprint (another run name, the same step): the training job alone, and it hits.
    second = launch(prewarmed, "second")
    assert second.returncode == 0, second.stderr[-3000:]
    run_dir = prewarmed / "runs" / "second"
    skipped = decision(run_dir)
    assert not skipped.prewarm and "matches the prewarm of run 'first'" in skipped.why
    assert "2 entries are intact" in skipped.why
    assert not log_path(run_dir, PREWARM, 0).exists()
    assert not report_path(run_dir, "prewarm", 0, 0).exists()
    assert step_hit(run_dir)
    assert "prewarm job: skipped (--prewarm auto): the fingerprint" in second.stdout

    # always runs it anyway (it finds everything WARM); never does not.
    always = launch(prewarmed, "always", "--prewarm", "always", trains=False)
    assert always.returncode == 0 and decision(prewarmed / "runs" / "always").prewarm
    assert "every function is WARM: nothing to compile" in always.stderr
    never = launch(prewarmed, "never", "--no-prewarm", trains=False)
    assert never.returncode == 0 and decision(prewarmed / "runs" / "never").mode == "never"

    # A changed config changes the fingerprint: the prewarm job runs, and says why.
    changed = launch(prewarmed, "changed", with_xla_flag("--xla_cpu_enable_fast_math=true"))
    assert changed.returncode == 0, changed.stderr[-3000:]
    chained = decision(prewarmed / "runs" / "changed")
    assert chained.prewarm and "environment: XLA_FLAGS differs" in chained.why
    assert step_hit(prewarmed / "runs" / "changed")

    # An entry the record promised is gone: the prewarm job runs again.
    for key in record.keys:
        LocalStore(prewarmed / "cache").entry_path(key).unlink()
    gone = launch(prewarmed, "gone")
    assert gone.returncode == 0, gone.stderr[-3000:]
    again = decision(prewarmed / "runs" / "gone")
    assert again.prewarm and "missing" in again.why
    assert step_hit(prewarmed / "runs" / "gone")


def test_a_changed_step_source_chains_the_prewarm(mystep: Path) -> None:
    """A module the factory's module imports (the model) changed: the prewarm job runs."""
    model = mystep / "src" / "mystep" / "model.py"
    model.write_text(model.read_text() + "\n# a comment changes the source\n")
    second = launch(mystep, "second", *mystep_args(mystep), trains=False)
    assert second.returncode == 0, second.stderr[-3000:]
    chained = decision(mystep / "runs" / "second")
    assert chained.prewarm and f"source: {model.resolve()} changed" in chained.why


def test_a_changed_file_the_step_factory_read_chains_the_prewarm(mystep: Path) -> None:
    """sizes.json, which the factory reads while it builds the step, is recorded by the
    prewarm job: the same file keeps the prewarm, a changed one runs it again."""
    sizes = mystep / "src" / "mystep" / "sizes.json"
    args = mystep_args(mystep)
    [record] = LocalStore(mystep / "cache").prewarms().values()
    assert str(sizes.resolve()) in record.fingerprint.reads
    same = launch(mystep, "same", *args, trains=False)
    assert same.returncode == 0 and not decision(mystep / "runs" / "same").prewarm
    sizes.write_text('{"d_ff": 64}')
    second = launch(mystep, "second", *args)
    assert second.returncode == 0, second.stderr[-3000:]
    chained = decision(mystep / "runs" / "second")
    assert chained.prewarm and f"its step factory read {sizes.resolve()}, changed since" in \
        chained.why
    assert step_hit(mystep / "runs" / "second")


def test_a_file_step_inputs_names_is_signed_at_each_launch(tmp_path: Path, cli: Cli) -> None:
    """A file the factory reads natively, or looks for and may not find (a tokenizer's
    model, an optional override), is named in step.inputs: absent at the first launch, its
    appearance runs the prewarm; an 8 GiB one (sparse) is signed by one stat, not read, and
    the same file again keeps the prewarm."""
    refused = cli(*launch_args(tmp_path, "refused", f"step.inputs=[{tmp_path}]", trains=False))
    assert refused.returncode == 2 and f"jaxwarm: error: {DEMO}: step.inputs: {tmp_path}: " \
        f"not a regular file (a directory); expected a regular file the launch can read" \
        in refused.stderr, refused.stderr[-3000:]
    assert not (tmp_path / "runs" / "refused").exists()
    data = tmp_path / "data" / "tokens.bin"
    inputs = f"step.inputs=[{data}]"
    assert launch(tmp_path, "first", inputs, trains=False).returncode == 0
    [record] = LocalStore(tmp_path / "cache").prewarms().values()
    assert record.fingerprint.files[str(data)] == "absent"
    data.parent.mkdir()
    subprocess.run(["truncate", "-s", "8G", str(data)], check=True)
    appeared = launch(tmp_path, "appeared", inputs, trains=False)
    assert appeared.returncode == 0, appeared.stderr[-3000:]
    chained = decision(tmp_path / "runs" / "appeared")
    assert chained.prewarm and f"source: {data} changed" in chained.why, chained.why
    assert chained.fingerprint is not None and \
        chained.fingerprint.files[str(data)].startswith("stat:8589934592:")
    same = launch(tmp_path, "same", inputs, trains=False)
    assert same.returncode == 0 and not decision(tmp_path / "runs" / "same").prewarm


def test_another_jax_version_chains_the_prewarm(prewarmed: Path) -> None:
    leg = LEGS[0]
    if leg_python(leg)[0] is None or not ready(leg):
        pytest.skip(f"jax {leg.jax} leg not built (make legs)")
    other = launch(prewarmed, "second", python=str(leg.python), trains=False)
    assert other.returncode == 0, other.stderr[-3000:]
    chained = decision(prewarmed / "runs" / "second")
    assert chained.prewarm and f"jax 0.10.2 -> {leg.jax}" in chained.why


def test_a_miss_the_fingerprint_could_not_see_forgets_its_record(mystep: Path,
                                                                 cli: Cli) -> None:
    # The model imports its norm's epsilon by a computed name: the fingerprint does not
    # reach it.
    args = mystep_args(mystep)
    norm = mystep / "src" / "mystep" / "norm.py"
    norm.write_text("EPS = 1e-6\n")
    # Same fingerprint as the prewarm's: the training job runs alone, misses, and forgets
    # the record...
    blind = launch(mystep, "blind", *args)
    assert blind.returncode == 0, blind.stderr[-3000:]
    assert not decision(mystep / "runs" / "blind").prewarm
    assert not step_hit(mystep / "runs" / "blind")
    assert "the next launch with its fingerprint runs its prewarm again" in blind.stderr
    assert LocalStore(mystep / "cache").prewarms() == {}
    # Said once in the launch's own output and in `jaxwarm status`, not only in a job log.
    forgot = ("prewarm record of run 'first' forgotten: jit_train_step missed its prewarmed "
              "key, which this fingerprint promised; the next launch with it prewarms again")
    assert blind.stdout.count(forgot) == 1, blind.stdout
    status = cli("status", str(mystep / "runs" / "blind"))
    assert f"attempt r0: {forgot}" in status.stdout, status.stdout
    # ...so the next launch with it runs the prewarm job again.
    again = launch(mystep, "again", *args, trains=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert decision(mystep / "runs" / "again").prewarm


def test_a_variable_the_jobs_inherit_enters_the_fingerprint(prewarmed: Path) -> None:
    # JAX hashes LIBTPU_INIT_ARGS into every key, on CPU too; jaxwarm passes it on to the
    # jobs from the launching shell. Exported after the prewarm, it must chain a prewarm.
    exported = launch(prewarmed, "second", env={"LIBTPU_INIT_ARGS": "--xla_jaxwarm_test=1"})
    assert exported.returncode == 0, exported.stderr[-3000:]
    chained = decision(prewarmed / "runs" / "second")
    assert chained.prewarm and "environment: LIBTPU_INIT_ARGS differs" in chained.why
    assert step_hit(prewarmed / "runs" / "second")


def corrupt_in_place(entry: Path) -> None:
    """Flip 64 bytes in the middle of an entry: its size and first bytes stay as recorded."""
    data = bytearray(entry.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(byte ^ 0xFF for byte in data[middle:middle + 64])
    entry.write_bytes(bytes(data))


def test_an_entry_corrupted_without_changing_its_size_chains_the_prewarm(
        prewarmed: Path) -> None:
    [step] = [e for e in LocalStore(prewarmed / "cache").scan(histories={})
              if e.function == "jit_train_step"]
    corrupt_in_place(step.path)
    second = launch(prewarmed, "second")
    assert second.returncode == 0, second.stderr[-3000:]
    chained = decision(prewarmed / "runs" / "second")
    assert chained.prewarm and f"entry {step.key}: " in chained.why
    assert "read in full; quarantined, so the prewarm compiles it again" in chained.why
    assert step_hit(prewarmed / "runs" / "second")


def test_without_the_full_check_a_same_size_corruption_is_a_miss_the_report_explains(
        prewarmed: Path, cli: Cli) -> None:
    [step] = [e.path for e in LocalStore(prewarmed / "cache").scan(histories={})
              if e.function == "jit_train_step"]
    corrupt_in_place(step)
    # --no-check-cache: the launch trusts the quick check, and says so.
    blind = launch(prewarmed, "blind", "--no-check-cache")
    assert blind.returncode == 0, blind.stderr[-3000:]
    skipped = decision(prewarmed / "runs" / "blind")
    assert not skipped.prewarm and "pass the quick check (size and first bytes only" in \
        skipped.why and "--no-check-cache" in skipped.why
    assert not step_hit(prewarmed / "runs" / "blind")
    report = cli("report", str(prewarmed / "runs" / "blind"))
    assert "why: its entry was in the cache, but JAX could not load it: " in report.stdout
    # The job recorded the miss: the next launch prewarms, replaces the entry, and hits.
    again = launch(prewarmed, "again")
    assert again.returncode == 0, again.stderr[-3000:]
    assert decision(prewarmed / "runs" / "again").prewarm
    assert step_hit(prewarmed / "runs" / "again")

"""A trainer jaxwarm does not control (examples/jsp_trainer, unchanged): its console script
runs with the init recorder installed first, its own cache settings are caught and (under
cache.enforce) overridden, its four-argument step HITs on process 0 with 1 and 2 processes,
locally and on the dev SLURM cluster, and the report leads with that HIT. Its jobs compile
the cheapest way (LLVM at -O0, XLA's older CPU fusion emitter, as the CLI test trainer's
config does): what is checked is the wrapping, the HITs and the reports, not the code
XLA makes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from jaxwarm.core.records import SETTING_CHANGED
from jaxwarm.core.rundir import report_path
from testing import jsp
from tests.conftest import REPO, Cli, run_cli
from tests.slurm_cluster import ensure_cluster

CONFIG = REPO / "configs" / "jsp-example.yaml"
RUN = "jsp-example"
DIR_CHANGED = "the trainer set jax_compilation_cache_dir to "
# The cheapest compile (tests/cli_trainer/cli-trainer.yaml's flags): a fraction of the CPU
# of the example config's default compile, in each of the jobs' JAX processes.
CHEAPEST_COMPILE = "xla_flags=[--xla_backend_optimization_level=0, " \
    "--xla_cpu_use_fusion_emitters=false]"


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> str:
    """jsp-train as an installed console script, on a PYTHONPATH that also holds the
    adapter."""
    return jsp.install(tmp_path_factory.mktemp("site"))


def args_for(tmp_path: Path, pythonpath: str, *extra: str,
             cache: Path | None = None) -> list[str]:
    """The runs under TMP_PATH, the cache too unless CACHE is given."""
    # Threshold 0: the step is stored however fast this machine compiles it.
    return [str(CONFIG), f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={cache or tmp_path / 'cache'}",
            "cache.min_compile_time_secs=0", CHEAPEST_COMPILE,
            f"env={{PYTHONPATH: {json.dumps(pythonpath)}}}",
            f"entrypoint.args=[--out, {tmp_path / 'trainer'}]", *extra]


def layout(processes: int) -> tuple[str, str]:
    return (f"topology.processes_per_node={processes}",
            f"topology.devices_per_process={4 // processes}")


def report(tmp_path: Path, job: str = "train", process: int = 0) -> dict:
    return json.loads(report_path(tmp_path / "runs" / RUN, job, 0, process).read_text())


def settings_changed(data: dict) -> list[str]:
    """The report's warnings that the trainer changed jaxwarm's cache dir."""
    return [w["text"] for w in data["warnings"]
            if w["kind"] == SETTING_CHANGED and w["text"].startswith(DIR_CHANGED)]


def step_records(data: dict) -> list[dict]:
    return [fn for fn in data["functions"] if fn["name"] == "jit_step"]


def headline(shown: str) -> list[str]:
    """The report's first lines after the launch's prewarm decision."""
    lines = shown.splitlines()
    return lines[1:] if lines[0].startswith("prewarm job: ") else lines


def assert_trained_with_a_hit(cli: Cli, tmp_path: Path, stdout: str) -> None:
    # The report's headline is the prewarmed step's HIT.
    shown = cli("report", str(tmp_path / "runs" / RUN)).stdout
    label, step = headline(shown)[:2]
    assert label == "train restart 0, process 0: warm", shown
    assert step.startswith("jit_step: HIT on process 0"), shown
    train = report(tmp_path)
    prewarmed = report(tmp_path, "prewarm")
    train_step, eval_step = step_records(train)
    assert train_step["hit"] and train_step["key"] == step_records(prewarmed)[0]["key"]
    # The eval step is another function named `step`: told apart, never "explained".
    assert eval_step["signature"] != train_step["signature"]
    assert train_step["prewarmed"] and not eval_step["prewarmed"]
    assert "jit_step: MISS" not in stdout and "why:" not in stdout
    # The trainer never calls mark_first_step(): the end of the step's first run counts.
    assert train["first_step_from"] == \
        f"the first execution of jit_step, a step the prewarm of run {RUN!r} recorded"
    assert train["time_to_first_step_s"] > 0
    # Its own cache dir is caught in one line, and jaxwarm's stayed in force.
    changed = settings_changed(train)
    assert len(changed) == 1 and "cache.enforce is on" in changed[0], train["warnings"]
    assert train["cache_dir"] == str(tmp_path / "cache")
    assert changed[0] in stdout


@dataclass(frozen=True)
class Launched:
    root: Path  # what args_for was given: the run and the cache are under it
    result: subprocess.CompletedProcess[str]

    @property
    def cache(self) -> Path:
        return self.root / "cache"


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory,
             installed: str) -> Callable[[int], Launched]:
    """jsp-train launched locally (prewarm, then train) on 1 or 2 processes, once per module
    for each: the launch is what the HIT tests check, and a cache its step was prewarmed into
    on one process is what the tests of verify on another layout, of a trainer that is
    followed and of a warm first step need (they write into it only what a training job
    adds, or work on a copy). Each prewarm costs a JAX process per rank."""
    runs: dict[int, Launched] = {}

    def launch(processes: int) -> Launched:
        if processes not in runs:
            root = tmp_path_factory.mktemp(f"launched-{processes}")
            runs[processes] = Launched(root, run_cli(
                "launch", *args_for(root, installed, *layout(processes)), "--local"))
        return runs[processes]
    return launch


@pytest.mark.e2e
@pytest.mark.parametrize("processes", [1, 2])
def test_unchanged_trainer_hits_locally(launched: Callable[[int], Launched], processes: int,
                                        cli: Cli) -> None:
    run = launched(processes)
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr[-3000:]
    assert_trained_with_a_hit(cli, run.root, run.result.stdout)
    assert headline(run.result.stdout)[1].startswith("jit_step: HIT on process 0")
    # The uncommitted key argument is declared so: no warning about its missing sharding.
    assert "without a sharding" not in run.result.stderr
    table = cli("report", str(run.root / "runs" / RUN), "--all")
    assert table.returncode == 0 and "jit__threefry_fold_in" in table.stdout


@pytest.mark.e2e
def test_verify_and_verify_trainer_say_warm_under_the_launchs_key(
        installed: str, launched: Callable[[int], Launched]) -> None:
    """verify, and verify --trainer asked of jsp-train itself (its console script, its own
    cache settings put back by the guard), on the one-process launch's run: the first
    jit_step each looks up is the train step, WARM under the key the launch hit. One
    process: what is jsp-train's here is its wrapping, not its layout (verify --trainer on
    two processes is tests/test_verify_trainer.py's)."""
    run = launched(1)
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr[-3000:]
    key = step_records(report(run.root))[0]["key"]
    warm = run_cli("verify", *args_for(run.root, installed, *layout(1)), "--local")
    assert warm.returncode == 0, warm.stdout + warm.stderr[-2000:]
    assert f"WARM  jit_step  {key}" in warm.stdout
    asked = run_cli("verify", "--trainer", *args_for(run.root, installed, *layout(1)),
                    "--local")
    assert asked.returncode == 0, asked.stdout + asked.stderr[-2000:]
    assert f"WARM  jit_step  {key}" in asked.stdout


@pytest.mark.e2e
def test_verify_on_another_process_layout_says_so(tmp_path: Path, installed: str,
                                                   launched: Callable[[int], Launched]) -> None:
    """verify on one process against the step prewarmed on two (one JAX process, not two)."""
    prewarmed = launched(2).cache
    cold = run_cli("verify", *args_for(tmp_path, installed, *layout(1), cache=prewarmed),
                   "--local")
    assert cold.returncode == 1, cold.stdout + cold.stderr[-2000:]
    assert "the process layout differs" in cold.stdout
    assert "compile_options differs" not in cold.stdout


@pytest.mark.e2e
def test_without_enforce_jaxwarm_follows_the_trainer_and_says_so(
        tmp_path: Path, installed: str, launched: Callable[[int], Launched]) -> None:
    """On a copy of a prewarmed cache: what the miss is explained against."""
    shutil.copytree(launched(1).cache, tmp_path / "cache")
    followed = run_cli("launch", *args_for(tmp_path, installed, "cache.enforce=false"),
                       "--local", "--no-prewarm")
    assert followed.returncode == 0, followed.stdout + followed.stderr[-3000:]
    train = report(tmp_path)
    changed = settings_changed(train)
    assert len(changed) == 1 and "jaxwarm follows the trainer" in changed[0]
    assert train["cache_dir"] == str(tmp_path / "trainer" / "jax-cache")
    assert not step_records(train)[0]["hit"]
    assert "jit_step: MISS on process 0" in followed.stdout
    assert f"why: this process looked its entries up in {tmp_path / 'trainer'}" in followed.stdout


@pytest.mark.e2e
def test_first_step_is_timed_cold_and_warm_from_another_runs_prewarm(
        tmp_path: Path, installed: str, launched: Callable[[int], Launched], cli: Cli) -> None:
    """jsp-train never calls mark_first_step(). Cold (--no-prewarm, an empty cache, no
    prewarm of its step anywhere), the function with the largest inputs is taken for the
    step: its train step, not its init (which compiles longer) nor its eval step. Warm from
    another run's prewarm (the launched one's, in its cache), the step that prewarm recorded
    ends the first step. The report shows both attempts of the run side by side."""
    args = args_for(tmp_path, installed, *layout(1))
    cold = run_cli("launch", *args, "--local", "--no-prewarm")
    assert cold.returncode == 0, cold.stdout + cold.stderr[-3000:]
    first = report(tmp_path)
    assert not any(fn["hit"] for fn in first["functions"])
    assert first["time_to_first_step_s"] > 0
    assert first["first_step_from"].startswith(
        "the first execution of jit_step, the function with the largest inputs so far")
    train_step = step_records(first)[0]  # the train step is compiled (and run) first
    assert first["time_to_first_step_s"] > sum(
        fn["seconds"] for fn in first["functions"][:first["functions"].index(train_step) + 1])

    warm = run_cli("launch", *args_for(tmp_path, installed, *layout(1),
                                       cache=launched(1).cache), "--local", "--no-prewarm")
    assert warm.returncode == 0, warm.stdout + warm.stderr[-3000:]
    second = report(tmp_path)
    assert step_records(second)[0]["hit"]
    assert second["first_step_from"] == \
        f"the first execution of jit_step, a step the prewarm of run {RUN!r} recorded"
    assert 0 < second["time_to_first_step_s"]

    shown = cli("report", str(tmp_path / "runs" / RUN)).stdout
    line = next(line for line in shown.splitlines()
                if line.startswith("time to first step on process 0"))
    assert f"cold {first['time_to_first_step_s']:.2f} s (0 of" in line, shown
    # The line is written at the first step: a lookup still in flight then (counted, its
    # hit not yet recorded) shows in the report's final figures only.
    warm_hits = re.search(rf"warm {second['time_to_first_step_s']:.2f} s \((\d+) of", line)
    assert warm_hits is not None, shown
    assert 1 <= int(warm_hits[1]) <= second["hits"]
    assert "newest" in line.split("warm")[1]


FACTORY = '''
import jax, numpy as np
from jaxwarm.step import CompileTarget
from jaxwarm.step import StepBundle

def make(config, mesh):
    step = jax.jit(lambda state, frozen, residual, key: state)
    spec = jax.ShapeDtypeStruct((4,), np.float32)
    return StepBundle(targets=(CompileTarget("train_step", step, (spec, spec)),))
'''


@pytest.mark.e2e
def test_a_target_that_does_not_fit_its_function_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "my_factory.py").write_text(FACTORY)
    args = ["verify", str(CONFIG), "--local", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", "step.factory=my_factory:make",
            f"env={{PYTHONPATH: {json.dumps(str(tmp_path))}}}"]
    result = run_cli(*args)
    assert result.returncode == 2, result.stdout + result.stderr[-2000:]
    assert "step.factory: target 'train_step' cannot be lowered" in result.stderr
    assert "missing 2 required positional arguments: 'residual' and 'key'" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    launched = run_cli("launch", *args[1:], "entrypoint.command=['true']")
    assert launched.returncode == 2, launched.stderr[-2000:]
    assert "prewarm failed" in launched.stderr and "cannot be lowered" in launched.stderr
    assert "Traceback" not in launched.stderr


@pytest.mark.e2e
def test_a_command_that_is_not_a_python_script_gets_no_report_and_is_told(
        tmp_path: Path) -> None:
    result = run_cli("launch", str(CONFIG), "--local", "--no-prewarm",
                     f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}",
                     "entrypoint.command=['true']", "entrypoint.args=[]")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is not a Python console script" in result.stderr
    assert "the training job wrote no init report" in result.stdout


@pytest.mark.e2e
@pytest.mark.slurm(lane=2)
def test_unchanged_trainer_hits_on_slurm(tmp_path: Path, installed: str, cli: Cli) -> None:
    ensure_cluster()
    launched = run_cli("launch", *args_for(tmp_path, installed, "topology.nodes=2",
                                           "topology.devices_per_process=2",
                                           "mesh.axes={data: 4}"),
                       "--slurm", "--wait", timeout=600)
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    assert_trained_with_a_hit(cli, tmp_path, launched.stdout)

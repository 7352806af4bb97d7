"""A step factory that hands `step.args` to its model's own config class: a key that class does not
take (a typo, `d_modle`) or one it needs and does not get ends the job with one line naming the
config file, `step.args.<key>` and the factory's call, exit 2, in the prewarm job, verify and the
trainer alike (they all build the step through `jaxwarm.step.build_step`), not a 40-line
traceback. `jaxwarm.step.step_args`, the config's converter, also checks types. Anything else
a factory raises (an absl parser refusing a flag) is one line too, naming the factory and
what it raised, with the log of its traceback (written once, never to the terminal), exit 2,
in every command that builds the step. The pure tests build the step in this process; the
e2e tests run each job once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.rundir import log_path, pinned_config, traceback_path, verify_config
from jaxwarm.step import FactoryError, build_step
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, run_cli

FACTORY = '''
from dataclasses import dataclass

from jaxwarm.step import step_args


@dataclass(frozen=True)
class ModelConfig:
    d_model: int
    n_layers: int = 2


def unpacked(config, mesh):
    model = ModelConfig(**config.step.args)
    raise AssertionError(f"built {model}")


def converted(config, mesh):
    model = step_args(config, ModelConfig)
    raise AssertionError(f"built {model}")


def other_type_error(config, mesh):
    return len(5)
'''
LINE = 14  # the line of `ModelConfig(**config.step.args)` above


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "typo_factory.py"
    path.write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def built(function: str, args: str) -> str:
    """The one line build_step ends with, for the demo config with this factory."""
    config = load_config(DEMO, ["mesh.axes=null", f"step.factory=typo_factory:{function}",
                                f"step.args={args}"])
    with pytest.raises(ConfigError) as refused:
        build_step(config)
    return str(refused.value)


@pytest.mark.usefixtures("factory")
def test_an_unknown_key_passed_on_by_the_factory_is_one_line_with_the_closest_one() -> None:
    assert built("unpacked", "{d_modle: 64}") == (
        f"{DEMO}: unknown key 'step.args.d_modle' (did you mean 'step.args.d_model'?): the "
        f"step factory passes it to ModelConfig, which takes no such argument "
        f"(typo_factory.py:{LINE})")


@pytest.mark.usefixtures("factory")
def test_a_missing_key_the_factory_s_class_needs_is_one_line() -> None:
    assert built("unpacked", "{n_layers: 4}") == (
        f"{DEMO}: missing required key 'step.args.d_model': the step factory passes "
        f"step.args to ModelConfig, which needs it (typo_factory.py:{LINE})")


@pytest.mark.usefixtures("factory")
def test_step_args_reads_them_with_the_config_s_converter() -> None:
    assert built("converted", "{d_modle: 64}") == \
        f"{DEMO}: unknown key 'step.args.d_modle' (did you mean 'step.args.d_model'?)"
    assert built("converted", "{d_model: wide}") == \
        f"{DEMO}: step.args.d_model: expected an integer, got string 'wide'"
    assert built("converted", "{}") == f"{DEMO}: missing required key 'step.args.d_model'"


@pytest.mark.usefixtures("factory")
def test_anything_else_the_factory_raises_is_one_line_with_it_as_the_cause() -> None:
    config = load_config(DEMO, ["mesh.axes=null", "step.factory=typo_factory:other_type_error"])
    with pytest.raises(FactoryError) as raised:
        build_step(config)
    assert str(raised.value) == (f"{DEMO}: step.factory: typo_factory:other_type_error raised "
                                 f"TypeError: object of type 'int' has no len()")
    assert isinstance(raised.value.__cause__, TypeError)  # its traceback, for the job's log


@pytest.mark.e2e
@pytest.mark.parametrize("command", [("prewarm",), ("verify",), ("launch", "--prewarm=never")],
                         ids=["prewarm", "verify", "trainer"])
def test_every_job_ends_with_the_one_line(tmp_path: Path, factory: Path,
                                          command: tuple[str, ...]) -> None:
    result = run_cli(*command, str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                     f"cache.dir={tmp_path / 'cache'}", *ONE_PROCESS, *FAST_STEP,
                     "step.factory=typo_factory:unpacked", "step.args={d_modle: 64}",
                     f"env={{PYTHONPATH: {json.dumps(str(factory.parent))}}}")
    assert result.returncode == 2, result.stderr[-3000:]
    line = (f"unknown key 'step.args.d_modle' (did you mean 'step.args.d_model'?): the step "
            f"factory passes it to ModelConfig, which takes no such argument "
            f"(typo_factory.py:{LINE})")
    assert line in result.stderr.splitlines()[-1], result.stderr[-3000:]
    job = "train" if command[0] == "launch" else command[0]
    run_dir = tmp_path / "runs" / "demo"
    log = log_path(run_dir, job, 0).read_text()
    # A job reads the config pinned for it (a verify's own, beside the run's), and names the
    # user's file it was pinned from, then the copy in brackets.
    pinned = verify_config(run_dir) if job == "verify" else pinned_config(run_dir)
    assert log.splitlines()[-1] == f"jaxwarm: error: {DEMO} [{pinned}]: {line}"
    assert "Traceback" not in log + result.stderr


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_job_with_a_missing_factory_function_ends_with_one_line(tmp_path: Path) -> None:
    """The launcher's static check cannot see every module (no source); the job's own
    error is one line, not a traceback per process."""
    import subprocess
    import sys

    from jaxwarm.core.config import load_config
    from jaxwarm.submit.prepare import pin_config
    from testing.jaxproc import jax_env

    config, pinned = pin_config(load_config(DEMO, [
        f"run.out_dir={tmp_path}", f"cache.dir={tmp_path / 'c'}",
        "step.factory=jaxwarm.step:no_such", "topology.processes_per_node=1",
        "topology.devices_per_process=1", "mesh.axes={data: 1}"]))
    result = subprocess.run([sys.executable, "-m", "jaxwarm.job.verify"], capture_output=True,
                            text=True, timeout=120,
                            env={**jax_env(1), "JAXWARM_CONFIG": str(pinned)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "step.factory: module 'jaxwarm.step' has no function 'no_such'" in result.stderr


@pytest.mark.e2e
def test_a_factory_that_raises_is_one_line_and_its_traceback_s_log_in_every_command(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "demo"
    common = [str(DEMO), "--local", f"run.out_dir={run_dir.parent}",
              f"cache.dir={tmp_path / 'cache'}", *ONE_PROCESS, *FAST_STEP]
    prewarmed = run_cli("prewarm", *common)  # what verify --trainer answers for
    assert prewarmed.returncode == 0, prewarmed.stderr[-3000:]
    raising = "tests.dying_factory:make_train_step_but_refuse_a_flag"
    # (command, the job that fails, the job whose process builds the step): the launch's
    # prewarm job (another factory, another fingerprint) is `jaxwarm prewarm`'s, and the
    # trainer verify --trainer runs builds its step as the launch's training job does.
    for command, job, builder in [(("launch",), "prewarm", "prewarm"),
                                  (("verify",), "verify", "verify"),
                                  (("verify", "--trainer"), "verify", "train")]:
        result = run_cli(*command, *common, f"step.factory={raising}")
        assert result.returncode == 2, result.stderr[-3000:]
        pinned = verify_config(run_dir) if job == "verify" else pinned_config(run_dir)
        traceback_log = traceback_path(run_dir, builder, 0)
        line = (f"{DEMO} [{pinned}]: step.factory: {raising} raised UnrecognizedFlagError: "
                f"Unknown command line flag 'd_model' (its traceback: {traceback_log})")
        assert result.stderr.splitlines()[-1].endswith(
            f": {job} failed: process 0 exited with 2: {line}"), command
        log = log_path(run_dir, job, 0).read_text()
        assert log.splitlines()[-1] == f"jaxwarm: error: {line}"
        assert "Traceback" not in result.stderr + log
        told = traceback_log.read_text()
        assert told.startswith("Traceback") and "make_train_step_but_refuse_a_flag" in told
        assert told.endswith("UnrecognizedFlagError: Unknown command line flag 'd_model'\n")

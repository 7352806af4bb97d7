"""Every launch form gets the init recorder and the cache-settings guard, with no change to
the trainer: a console script, `entrypoint.module` (python -m), a Python interpreter running
a script or `-m module`, an absl-style `entrypoint.function` main(argv), and a shell script
that execs Python (through the bootstrap sitecustomize, which runs the environment's own
sitecustomize too). The trainer (tests/launchforms/tinytrain.py) sets its own cache dir and
threshold; each launch must write its init report, say the guard's lines, keep jaxwarm's
cache dir, and say truly which form it found. One process, one tiny jit, --no-prewarm, one
shared cache: each test is one CLI process and one JAX process. A user error as the recorder
installs, or in what the reference trainer is given, ends the trainer with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxwarm.core.errors import EXIT_ERROR
from jaxwarm.core.records import SETTING_CHANGED
from jaxwarm.core.rundir import report_path
from jaxwarm.store.store import LocalStore
from jaxwarm.submit.jobs import with_bootstrap
from tests.conftest import REPO, Cli, run_cli

pytestmark = pytest.mark.e2e

FORMS = REPO / "tests" / "launchforms"
DIR_CHANGED = "the trainer set jax_compilation_cache_dir to "
THRESHOLD_CHANGED = "the trainer set jax_persistent_cache_min_compile_time_secs to 60.0"


def write_config(tmp_path: Path, cache: Path, entrypoint: dict, pythonpath: list[Path],
                 **extra: object) -> Path:
    config = {
        "run": {"name": "forms", "out_dir": str(tmp_path / "runs")},
        "cache": {"dir": str(cache), "min_compile_time_secs": 0},
        "topology": {"devices_per_process": 1},
        "mesh": {"axes": {"data": 1}},
        "step": {"factory": "tiny_adapter:make"},
        "entrypoint": {**entrypoint, "args": ["--out", str(tmp_path / "own")]},
        "env": {"PYTHONPATH": os.pathsep.join(map(str, pythonpath)),
                "TINY_PYTHON": sys.executable},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def launch(tmp_path: Path, cache: Path, entrypoint: dict,
           pythonpath: list[Path] = (FORMS,)) -> tuple[dict, str]:
    config = write_config(tmp_path, cache, entrypoint, list(pythonpath))
    result = run_cli("launch", str(config), "--local", "--no-prewarm")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "first step done at" in output and f"(out {tmp_path / 'own'})" in output, output
    report = json.loads(report_path(tmp_path / "runs" / "forms", "train", 0, 0).read_text())
    assert "jit_tiny_step" in [fn["name"] for fn in report["functions"]], report
    # The guard caught both of the trainer's settings and kept jaxwarm's dir in force.
    changed = [w["text"] for w in report["warnings"] if w["kind"] == SETTING_CHANGED]
    assert any(w.startswith(DIR_CHANGED) and "cache.enforce is on" in w
               for w in changed), report["warnings"]
    assert any(w.startswith(THRESHOLD_CHANGED) for w in changed), report["warnings"]
    assert report["cache_dir"] == str(cache)
    assert DIR_CHANGED in result.stdout  # the launch's own summary says it too
    assert "wrote no init report" not in output
    return report, result.stderr


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """tinytrain's console script, installed the way pip records one."""
    site = tmp_path / "site"
    info = site / "tinytrain-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinytrain\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[console_scripts]\ntiny-train = tinytrain:cli\n")
    return site


def test_console_script(tmp_path: Path, shared_cache: Path, site: Path) -> None:
    _, log = launch(tmp_path, shared_cache, {"command": ["tiny-train"]}, [site, FORMS])
    assert "tiny-train is a Python console script (tinytrain:cli)" in log


def test_entrypoint_module(tmp_path: Path, shared_cache: Path) -> None:
    _, log = launch(tmp_path, shared_cache, {"module": "tinytrain"})
    assert "entrypoint.module: tinytrain runs as python -m tinytrain" in log


def test_python_running_a_script(tmp_path: Path, shared_cache: Path) -> None:
    script = FORMS / "tinytrain.py"
    _, log = launch(tmp_path, shared_cache, {"command": [sys.executable, "-u", str(script)]})
    assert f"Python ({sys.executable}) running script {script}" in log


def test_python_running_a_module(tmp_path: Path, shared_cache: Path) -> None:
    _, log = launch(tmp_path, shared_cache, {"command": [sys.executable, "-m", "tinytrain"]})
    assert f"Python ({sys.executable}) running module tinytrain" in log


def test_absl_main_argv_function(tmp_path: Path, shared_cache: Path) -> None:
    # main(argv) is called through absl's app.run, which parsed --out from entrypoint.args.
    _, log = launch(tmp_path, shared_cache, {"function": "tinytrain:main"})
    assert "entrypoint.function: tinytrain:main is called as a console script's main() or " \
           "absl's main(argv)" in log


def test_shell_script_that_execs_python(tmp_path: Path, shared_cache: Path) -> None:
    _, log = launch(tmp_path, shared_cache, {"command": [str(FORMS / "train.sh")]},
                    [FORMS, FORMS / "chained"])
    assert "train.sh is not a Python console script nor a Python interpreter" in log
    assert "helper python" in log
    assert "the environment's own sitecustomize ran" in log


def test_a_function_that_needs_more_than_argv_is_refused_before_any_job(
        tmp_path: Path, cli: Cli) -> None:
    (tmp_path / "needy.py").write_text("def main(argv, config):\n    pass\n")
    config = write_config(tmp_path, tmp_path / "cache", {"function": "needy:main"},
                          [FORMS, tmp_path])
    result = cli("launch", str(config), "--local", "--no-prewarm")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "entrypoint.function: needy:main" in result.stderr
    assert "needs 2 argument(s) (argv, config)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def run_python(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A Python process started as a job starts it (the bootstrap first on PYTHONPATH, then
    tinytrain's folder), on CPU, with `env` added."""
    job_env = with_bootstrap({**os.environ, "JAX_PLATFORMS": "cpu", **env,
                              "PYTHONPATH": os.pathsep.join(map(str, [FORMS, REPO]))})
    return subprocess.run([sys.executable, *args], env=job_env, capture_output=True,
                          text=True, timeout=300)


def test_a_user_error_as_the_recorder_installs_ends_the_trainer_with_one_line(
        tmp_path: Path) -> None:
    """The recorder installs inside the trainer's own `import jax`; a user error there (here
    the pinned config that JAXWARM_CONFIG names, edited into a bad value) ends the trainer
    with one line naming the file and the key, exit 2: no traceback, no step run."""
    config = write_config(tmp_path, tmp_path / "cache", {"module": "tinytrain"}, [FORMS])
    data = json.loads(config.read_text())
    data["cache"]["min_compile_time_secs"] = "soon"
    config.write_text(json.dumps(data))
    result = run_python(str(FORMS / "tinytrain.py"), "--out", str(tmp_path / "own"),
                        JAXWARM_CONFIG=str(config))
    assert result.returncode == EXIT_ERROR, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"jaxwarm: error: {config}: cache.min_compile_time_secs: expected a number, "
        f"got string 'soon'")
    assert "first step done" not in result.stdout


def test_the_reference_trainer_refuses_a_bundle_of_targets_only(tmp_path: Path) -> None:
    """jaxwarm-train runs the short form (train_step, init_state); tinytrain's factory gives
    only `targets`: one line naming the file and the key, exit 2, no traceback."""
    config = write_config(tmp_path, tmp_path / "cache", {"command": ["jaxwarm-train"]}, [FORMS])
    result = run_python("-m", "jaxwarm.workload.trainer", str(config))
    assert result.returncode == EXIT_ERROR, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith(
        f"jaxwarm: error: {config}: step.factory: tiny_adapter:make returned no train_step "
        f"and init_state")


def test_a_setting_the_step_factory_changes_is_said_as_the_step_factory(tmp_path: Path) -> None:
    """In the prewarm and verify jobs the trainer does not run: the step factory does (here
    replaying the trainer's 60 s threshold), and the guard's line says so."""
    config = write_config(tmp_path, tmp_path / "cache", {"module": "tinytrain"}, [FORMS])
    for job in ("verify", "prewarm"):
        result = run_cli(job, str(config), "--local", "step.args={threshold: 60}")
        assert result.returncode in (0, 1), result.stderr[-3000:]  # verify: COLD at first
        report = json.loads(report_path(tmp_path / "runs" / "forms", job, 0, 0).read_text())
        changed = [w["text"] for w in report["warnings"] if w["kind"] == SETTING_CHANGED]
        assert len(changed) == 1 and changed[0].startswith(
            "the step factory set jax_persistent_cache_min_compile_time_secs to 60.0 after "
            "jaxwarm set 0"), changed
        assert "cache.enforce is on: jaxwarm set it back" in changed[0]
        assert changed[0] in result.stderr and "the trainer set" not in result.stderr


def test_without_enforce_a_miss_names_the_dir_the_process_used(tmp_path: Path) -> None:
    """cache.enforce off: tinytrain's own dir wins, and its miss of the prewarmed step is
    explained by where it looked, not as an entry "gone": the entry is intact in jaxwarm's
    dir. (Without XLA's caches the cache path is not in the key, so the keys are equal.)"""
    cache, own = tmp_path / "cache", tmp_path / "own" / "own-cache"
    config = write_config(tmp_path, cache, {"module": "tinytrain"}, [FORMS])
    data = json.loads(config.read_text())
    data["cache"].update(enforce=False, xla_caches="none")
    config.write_text(json.dumps(data))
    launched = run_cli("launch", str(config), "--local")
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    report = json.loads(report_path(tmp_path / "runs" / "forms", "train", 0, 0).read_text())
    assert report["cache_dir"] == str(own)
    step, = [fn for fn in report["functions"] if fn["name"] == "jit_tiny_step"]
    assert not step["hit"] and LocalStore(cache).entry_path(step["key"]).is_file()
    assert "jit_tiny_step: MISS on process 0" in launched.stdout
    assert f"why: this process looked its entries up in {own}, the trainer's cache dir" \
        in launched.stdout
    assert f"why: its entry is in {cache}, but this process looked it up in {own}" \
        in launched.stdout
    assert "pruned or deleted" not in launched.stdout

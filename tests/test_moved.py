"""An adapter, a step factory or an entrypoint written against an earlier layout (0.1.0's
`prewarm.step`, `launcher.config`; `jaxwarm.prewarm.*` between) gets one line naming the new
import, where the module path is checked (the CLI, before anything is written) and where
it is imported (a job, the entrypoint runner). Pure: no JAX process; the runner's test
starts a plain Python child that fails at its first import."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxwarm.core.errors import ConfigError
from jaxwarm.core.moved import MOVED, moved_import, new_module
from jaxwarm.step import load_factory
from tests.conftest import DEMO, REPO, Cli

SINCE = "since jaxwarm 0.2.0 (CHANGELOG.md)"


def test_every_move_lands_on_a_module_of_the_package() -> None:
    missing = [new for new in set(MOVED.values())
               if not (REPO / f"{new.replace('.', '/')}.py").is_file()
               and not (REPO / new.replace(".", "/") / "__init__.py").is_file()]
    assert missing == []


def test_both_earlier_layouts_map_and_nothing_else_does() -> None:
    assert new_module("prewarm.step") == new_module("jaxwarm.prewarm.step") == "jaxwarm.step"
    assert new_module("prewarm.workload.chunkwise") == "jaxwarm.workload.chunkwise"
    assert new_module("launcher.injob.guard") == "jaxwarm.job.start.cacheguard"
    assert new_module("launcher") == "jaxwarm"
    # A module of an old package that is nowhere now, and any module of today's: no move.
    assert new_module("launcher.nothing") is None
    assert new_module("jaxwarm.step") is None and new_module("mystep") is None


@pytest.fixture
def adapters(tmp_path: Path) -> Iterator[Path]:
    """Adapters written against 0.1.0, importable from `tmp_path`."""
    (tmp_path / "old_adapter.py").write_text(
        '"""An adapter of 0.1.0."""\n'
        "from prewarm.step import (\n"
        "    CompileTarget,\n"
        "    StepBundle,\n"
        ")\n"
        "\n\ndef make_step(config, mesh):\n    return StepBundle(targets=())\n")
    (tmp_path / "old_workload.py").write_text(
        "import launcher.injob.hook as hook\n"
        "from prewarm.workload.chunkwise import make_train_step\n")
    (tmp_path / "own_error.py").write_text("import no_such_module_here\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("old_adapter", "old_workload", "own_error"):
        sys.modules.pop(name, None)


def test_a_factory_importing_an_old_module_gets_the_new_import(adapters: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_factory("old_adapter:make_step", "my.yaml")
    assert str(caught.value) == (
        f"my.yaml: step.factory: cannot import module 'old_adapter': old_adapter.py:2 imports "
        f"'prewarm.step', which is 'jaxwarm.step' {SINCE}: from jaxwarm import CompileTarget, "
        f"StepBundle")
    with pytest.raises(ImportError) as failed:
        __import__("old_workload")
    assert moved_import(failed.value) == (
        f"old_workload.py:1 imports 'launcher.injob.hook', which is 'jaxwarm.job.start.hook' "
        f"{SINCE}: import jaxwarm.job.start.hook as hook")
    with pytest.raises(ConfigError, match="'own_error': No module named 'no_such_module_here'$"):
        load_factory("own_error:make_step", "my.yaml")


def test_a_factory_path_of_the_old_layout_is_named_in_the_job_and_at_the_cli(
        tmp_path: Path, cli: Cli) -> None:
    old = "prewarm.workload.chunkwise"
    with pytest.raises(ConfigError) as caught:
        load_factory(f"{old}:make_train_step", "my.yaml")
    assert str(caught.value) == (f"my.yaml: step.factory: cannot import module '{old}': it is "
                                 f"'jaxwarm.workload.chunkwise' {SINCE}")
    result = cli("verify", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                 f"cache.dir={tmp_path / 'cache'}", f"step.factory={old}:make_train_step")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"jaxwarm: error: {DEMO}: step.factory: module '{old}' was not found: it is "
        f"'jaxwarm.workload.chunkwise' {SINCE}"]
    assert not (tmp_path / "runs").exists()


def test_an_entrypoint_importing_an_old_module_ends_with_the_one_line(adapters: Path) -> None:
    script = adapters / "old_trainer.py"
    script.write_text("from launcher.config import Config\nprint('trained')\n")
    ran = subprocess.run([sys.executable, "-m", "jaxwarm.job.start.call", "--path", str(script)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 2
    assert ran.stderr.splitlines() == [
        f"jaxwarm: error: entrypoint {script}: old_trainer.py:1 imports 'launcher.config', "
        f"which is 'jaxwarm.core.config' {SINCE}: from jaxwarm import Config"]

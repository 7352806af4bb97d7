"""Run files never land on a user's files: run.name is one path component, nothing is written
before every check passed, one launch per run dir, and `render` writes nothing over a run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.files import locked
from jaxwarm.core.rundir import lock_path, pinned_config
from jaxwarm.submit.prepare import pin_config
from tests.conftest import DEMO, run_cli
from tests.hostile import assert_refused, snapshot

pytestmark = pytest.mark.e2e


def overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}", *extra]


def pinned_run(tmp_path: Path) -> Path:
    """A run dir as an earlier launch left it: its pinned config is what requeued jobs read."""
    config, pinned = pin_config(load_config(DEMO, overrides(tmp_path)))
    return config.run_dir


def test_a_run_name_that_climbs_out_is_refused_and_the_users_config_survives(
        tmp_path: Path) -> None:
    users = tmp_path / "config.yaml"
    users.write_text("my own config\n")
    (tmp_path / "runs").mkdir()
    before = snapshot(tmp_path)
    for name in ("..", ".", "a/../..", "/etc"):
        result = run_cli("launch", str(DEMO), "--local", *overrides(tmp_path, f"run.name={name}"))
        assert_refused(result, "run.name: expected one path component")
    assert snapshot(tmp_path) == before


def test_a_launch_refused_after_loading_leaves_the_pinned_config_alone(tmp_path: Path) -> None:
    run_dir = pinned_run(tmp_path)
    before = snapshot(tmp_path)
    result = run_cli("launch", str(DEMO), "--local",
                     *overrides(tmp_path, "entrypoint.command=[no-such-trainer]",
                                "train.steps=99"))
    assert_refused(result, "entrypoint.command: 'no-such-trainer' was not found")
    assert snapshot(tmp_path) == before
    assert "steps: 99" not in pinned_config(run_dir).read_text()


def test_render_writes_nothing_over_a_run(tmp_path: Path) -> None:
    run_dir = pinned_run(tmp_path)
    pinned = pinned_config(run_dir).read_bytes()
    before = snapshot(tmp_path)
    for job in ("prewarm", "train"):
        result = run_cli("render", str(DEMO), *overrides(tmp_path, "train.steps=99"),
                         "--job", job)
        assert_refused(result, "is pinned to other values")
    assert snapshot(tmp_path) == before
    # The run's own config renders, and its pinned config stays as it was.
    same = run_cli("render", str(DEMO), *overrides(tmp_path), "--job", "train")
    assert same.returncode == 0 and "#SBATCH" in same.stdout, same.stderr
    assert pinned_config(run_dir).read_bytes() == pinned
    # A new run dir gets what its script needs to run under plain sbatch, and no more.
    fresh = tmp_path / "fresh"
    result = run_cli("render", str(DEMO), f"run.out_dir={fresh}", f"cache.dir={fresh}/c",
                     "--job", "train")
    assert result.returncode == 0, result.stderr
    assert pinned_config(fresh / "demo").is_file()
    assert (fresh / "demo" / "slurm" / "train").is_dir()
    assert not (fresh / "demo" / "reports").exists()


def test_a_second_launch_of_a_busy_run_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    run_dir = pinned_run(tmp_path)
    # This test process plays the first launch: it holds the run dir's lock, as a launch does
    # for its whole life.
    with locked(lock_path(run_dir), "run dir"):
        before = snapshot(tmp_path)
        for command in ("launch", "prewarm", "verify"):
            result = run_cli(command, str(DEMO), "--local", *overrides(tmp_path, "train.steps=99"))
            assert_refused(result, f"run dir {run_dir} is in use by pid {os.getpid()} on ")
        assert snapshot(tmp_path) == before
    assert not (run_dir / "checkpoints").exists()


def test_two_configs_of_one_prewarm_cannot_share_a_run_dir(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(DEMO.read_text())
    result = run_cli("prewarm", str(DEMO), str(other), "--local", *overrides(tmp_path))
    assert_refused(result, f"run dir {tmp_path / 'runs' / 'demo'} is also the run dir of")
    assert not (tmp_path / "runs").exists()

"""A non-editable install works away from the checkout: the templates ship as package data,
and the demo runs from another working directory.

The wheel goes into a venv made without pip of its own, by this venv's pip (`--python`),
dependencies included, without byte-compiling them (`--no-compile`: half of the install's
CPU, and nothing a user of the install could tell); the demo runs on one process (the
installed flow, prewarm then train, not the ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxwarm.launcher.rundir import report_path
from tests.conftest import DEMO, ONE_PROCESS, REPO

pytestmark = pytest.mark.e2e


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_installed_wheel_renders_and_runs_the_demo_elsewhere(tmp_path: Path) -> None:
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp_path / "dist",
        REPO, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("jaxwarm-*.whl"))
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet",
        "--no-compile", wheel, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run(venv / "bin" / "python", "-c",
                "import jaxwarm.slurm_templates; print(jaxwarm.__file__)", cwd=elsewhere)
    assert str(REPO) not in where.stdout and "site-packages" in where.stdout

    rendered = run(venv / "bin" / "jaxwarm", "render", DEMO, "--job", "train",
                   "run.out_dir=runs", cwd=elsewhere)
    assert rendered.stdout.startswith("#!/bin/bash") and "srun" in rendered.stdout
    assert "jaxwarm-train" in rendered.stdout

    demo = run(venv / "bin" / "jaxwarm", "launch", DEMO, "--local", "train.steps=1",
               *ONE_PROCESS, "run.out_dir=runs", "cache.dir=cache", cwd=elsewhere)
    assert "jit_train_step: HIT on process 0" in demo.stdout
    report = json.loads(report_path(elsewhere / "runs" / "demo", "train", 0, 0).read_text())
    assert report["hits"] >= 1

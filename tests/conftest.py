"""Shared fixtures: run the real `jaxwarm` CLI in a subprocess against temp dirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import TINY_STEP

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo.yaml"

def ranks_layout(processes: int, data: int, fsdp: int) -> tuple[str, ...]:
    """Overrides for `processes` ranks of one CPU device each, the mesh data x fsdp, the
    smallest batch that mesh takes, the tiny step and one training step."""
    return (f"topology.processes_per_node={processes}", "topology.devices_per_process=1",
            f"mesh.axes={{data: {data}, fsdp: {fsdp}}}", f"step.args.global_batch={data * fsdp}",
            "train.steps=1", *TINY_STEP)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`jaxwarm ARGS...` as a user runs it; output captured as text."""
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for tests that only need a warm step, so each compiles it once."""
    return tmp_path_factory.mktemp("shared-cache")

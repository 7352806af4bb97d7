"""Shared fixtures: run the real `jaxwarm` CLI in a subprocess against temp dirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo.yaml"


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

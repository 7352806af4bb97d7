"""Run JAX snippets in fresh interpreters, with a chosen number of fake CPU devices.

JAX fixes its device count when it is imported, so a test that needs 8 or 64 devices
(or several processes) cannot run in the pytest process: it runs a subprocess instead,
and gets the child's stderr tail in its failure message rather than a bare exit code.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "RESULT "


def jax_env(devices: int, platform: str = "cpu",
            xla_flags: Sequence[str] = ()) -> dict[str, str]:
    """The environment of a child with the repo importable: on CPU, `devices` fake devices
    and LLVM at -O0 as in the demo config (the children check what compiles and what it
    computes, not how fast it runs; -O0 halves the compile), and `xla_flags`; on GPU
    (`bench.gpu_check`), the GPUs there, with memory taken as needed so that several
    children can share one GPU."""
    env = dict(os.environ)
    if platform == "cpu":
        env["XLA_FLAGS"] = " ".join(["--xla_backend_optimization_level=0",
                                     f"--xla_force_host_platform_device_count={devices}",
                                     *xla_flags])
        env["JAX_PLATFORMS"] = "cpu"
    else:
        env["JAX_PLATFORMS"] = "cuda"
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run_jax(code: str, devices: int, timeout: float = 300, args: tuple[str, ...] = (),
            xla_flags: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run `code` with `python -c` (extra `args` in sys.argv[1:]); fail unless it exits 0."""
    proc = subprocess.run([sys.executable, "-c", code, *args],
                          env=jax_env(devices, xla_flags=xla_flags),
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"JAX subprocess exited {proc.returncode}:\n"
                             f"{(proc.stdout + proc.stderr)[-4000:]}")
    return proc


def run_jax_processes(code: str, processes: int, devices: int, timeout: float = 300,
                      args: tuple[str, ...] = (),
                      platform: str = "cpu") -> list[subprocess.CompletedProcess[str]]:
    """Run `code` as a `processes`-process JAX job, each with `devices` fake devices (or, with
    `platform="gpu"`, the GPUs there: see `jax_env`).

    Each child gets sys.argv[1:] = [coordinator address, process count, process id] for
    `jax.distributed.initialize`, then `args`. All are started before any is waited on,
    since initialization blocks until every process has joined.
    """
    address = f"localhost:{free_port()}"
    children = [subprocess.Popen([sys.executable, "-c", code, address, str(processes), str(i),
                                  *args],
                                 env=jax_env(devices, platform), cwd=REPO, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                for i in range(processes)]
    results = []
    try:
        for child in children:
            out, _ = child.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(child.args, child.returncode, out, ""))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    failed = [(i, r) for i, r in enumerate(results) if r.returncode != 0]
    if failed:
        i, proc = failed[0]
        raise AssertionError(f"JAX process {i} of {processes} exited {proc.returncode}:\n"
                             f"{proc.stdout[-4000:]}")
    return results


def result(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a child printed on its last `RESULT <json>` line."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    assert lines, f"no {RESULT_PREFIX!r} line in output:\n{proc.stdout[-2000:]}"
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]

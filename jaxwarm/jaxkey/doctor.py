"""The key self-check (`python -m jaxwarm.jaxkey.selfcheck`) run beside the CLI.

`jaxwarm doctor` runs it alone; `jaxwarm verify` runs it alongside the verify job, so its
verdicts say whether the key prediction they rest on is exact on this JAX. It is a child
process: the CLI never imports jax. It runs on CPU whatever the job's platform: the probe is
the same code on every backend, and a check beside a running GPU job must not take GPU
memory from it (JAX preallocates most of it) or need a GPU on a login node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from jaxwarm.core.environment import merge_environment
from jaxwarm.core.errors import EXIT_ERROR, EXIT_INEXACT, EXIT_OK

SELFCHECK_MODULE = "jaxwarm.jaxkey.selfcheck"


@dataclass
class RunningCheck:
    process: subprocess.Popen[str]

    def finish(self) -> int:
        """Print the check's line; 0 when the prediction is exact or could not be checked
        here (the line says why), EXIT_ERROR when it is not exact."""
        output, _ = self.process.communicate()
        lines = [line for line in output.splitlines() if line.startswith("jaxwarm:")]
        print(lines[-1] if lines else f"jaxwarm: self-check exited {self.process.returncode} "
              f"without a verdict: {output.strip()[-300:]}", flush=True)
        return EXIT_ERROR if self.process.returncode == EXIT_INEXACT else EXIT_OK


@contextmanager
def selfcheck(job_env: dict[str, str] | None = None) -> Iterator[RunningCheck]:
    """Start the self-check with a job's environment (or the CLI's own); never left running."""
    env = dict(os.environ) if job_env is None else merge_environment(dict(os.environ), job_env)
    env["JAX_PLATFORMS"] = "cpu"
    process = subprocess.Popen([sys.executable, "-m", SELFCHECK_MODULE], env=env, text=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    try:
        yield RunningCheck(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def doctor() -> int:
    """`jaxwarm doctor`: the self-check's one line and its exit status."""
    with selfcheck() as check:
        check.finish()
        return check.process.returncode

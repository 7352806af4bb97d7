"""How every job of a run starts and ends: the prewarm job, the verify job and the trainer.

Kept apart from `jaxwarm.step` (the protocol a user's adapter imports) because starting a
job needs the in-job hook and, through it, the cache store: an adapter that only builds a
`StepBundle` should not load them.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import jax
from jax.sharding import Mesh

from jaxwarm.core.config import Config
from jaxwarm.core.errors import run_main
from jaxwarm.core.files import atomic_write, make_dirs
from jaxwarm.core.rundir import traceback_path
from jaxwarm.jaxkey.versionguard import jax_job
from jaxwarm.job.record.recorder import InitRecorder
from jaxwarm.job.start.distributed import initialize
from jaxwarm.job.start.gpu import apply_mock, require_devices
from jaxwarm.job.start.hook import enable_cache
from jaxwarm.step import FactoryError, StepBundle, build_step


def job_main(main: Callable[[], int]) -> int:
    """Run a job's main so that bad input (an untested jax, a missing factory function, a
    step factory that raised, a broken manifest, a stuck lock, a full disk) ends it with one
    line and exit 2, as the launcher's errors do; only a bug shows a traceback."""
    return run_main(jax_job(main))


def start_job(config: Config, job: str, calling: AbstractContextManager[Any] | None = None
              ) -> tuple[InitRecorder, Mesh, StepBundle]:
    """How every job of a run starts, in the order that matters: set the mock topology of a
    one-node prewarm (before any device), join jax.distributed, refuse a GPU target without
    GPUs, turn the cache on and start the init report (before the first compile), build
    mesh and step (`calling` around the factory's call). Prewarm, verify and the trainer all
    start here, so they lower the same program."""
    apply_mock(config)
    initialize(config)
    require_devices(config)
    recorder = enable_cache(config, job=job)
    try:
        mesh, bundle = build_step(config, calling=calling)
    except FactoryError as exc:
        raise FactoryError(f"{exc} (its traceback: "
                           f"{keep_traceback(config, job, exc.__cause__ or exc)})") from None
    return recorder, mesh, bundle


def keep_traceback(config: Config, job: str, exc: BaseException) -> Path:
    """Write what the step factory raised, with its traceback, to this process's
    traceback log; its path."""
    path = traceback_path(config.run_dir, job, jax.process_index())
    make_dirs(path.parent)
    return atomic_write(path, "".join(traceback.format_exception(exc)))

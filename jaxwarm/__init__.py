"""jaxwarm: prewarm, verify and operate JAX's persistent compilation cache for training jobs.

The one import package, in floors (docs/architecture.md): `core` (what every side shares),
`jaxkey` (JAX's internals), `store` (the cache dir), `submit`, `job` (what runs inside a job),
`report`, `cli` on top. What an adapter or a trainer needs is exported here (the names are
held by tests/test_layout.py):

    from jaxwarm import CompileTarget, StepBundle, trainer_argv

Each name is imported on first use (module `__getattr__`), so `import jaxwarm`, the CLI's
start and a job's bootstrap import no jax.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names' types, for a type checker (`X as X`: re-exported)
    from jaxwarm.core.config import Config as Config
    from jaxwarm.core.config import load_config as load_config
    from jaxwarm.job.start.distributed import initialize as initialize
    from jaxwarm.job.start.hook import enable_cache as enable_cache
    from jaxwarm.job.start.pinned import config_from_env as config_from_env
    from jaxwarm.specs import sharded_specs as sharded_specs
    from jaxwarm.specs import warn_risky_inputs as warn_risky_inputs
    from jaxwarm.step import CompileTarget as CompileTarget
    from jaxwarm.step import StepBundle as StepBundle
    from jaxwarm.step import build_mesh as build_mesh
    from jaxwarm.step import build_step as build_step
    from jaxwarm.step import seed_spec as seed_spec
    from jaxwarm.step import step_args as step_args
    from jaxwarm.step import trainer_argv as trainer_argv

# Exported name -> the module that defines it.
EXPORTS = {
    "Config": "jaxwarm.core.config",
    "load_config": "jaxwarm.core.config",
    "initialize": "jaxwarm.job.start.distributed",
    "config_from_env": "jaxwarm.job.start.pinned",
    "enable_cache": "jaxwarm.job.start.hook",
    "sharded_specs": "jaxwarm.specs",
    "warn_risky_inputs": "jaxwarm.specs",
    "CompileTarget": "jaxwarm.step",
    "StepBundle": "jaxwarm.step",
    "build_mesh": "jaxwarm.step",
    "build_step": "jaxwarm.step",
    "seed_spec": "jaxwarm.step",
    "step_args": "jaxwarm.step",
    "trainer_argv": "jaxwarm.step",
}

__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in EXPORTS:
        raise AttributeError(f"module 'jaxwarm' has no attribute {name!r}")
    value = getattr(importlib.import_module(EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *EXPORTS})

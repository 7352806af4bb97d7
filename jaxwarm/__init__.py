"""jaxwarm: prewarm, verify and operate JAX's persistent compilation cache for training jobs.

The one import package. `jaxwarm.launcher` is the submit side and what every side shares,
`jaxwarm.prewarm` the jobs, the step protocol and the reference trainer
(docs/architecture.md). What an adapter or a trainer needs is exported here:

    from jaxwarm import CompileTarget, StepBundle, trainer_argv

Each name is imported on first use (module `__getattr__`), so `import jaxwarm`, the CLI's
start and a job's bootstrap import no jax.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names' types, for a type checker (`X as X`: re-exported)
    from jaxwarm.launcher.config import Config as Config
    from jaxwarm.launcher.config import load_config as load_config
    from jaxwarm.launcher.environment import config_from_env as config_from_env
    from jaxwarm.launcher.injob.distributed import initialize as initialize
    from jaxwarm.launcher.injob.hook import enable_cache as enable_cache
    from jaxwarm.prewarm.specs import sharded_specs as sharded_specs
    from jaxwarm.prewarm.specs import warn_risky_inputs as warn_risky_inputs
    from jaxwarm.prewarm.step import CompileTarget as CompileTarget
    from jaxwarm.prewarm.step import StepBundle as StepBundle
    from jaxwarm.prewarm.step import build_mesh as build_mesh
    from jaxwarm.prewarm.step import build_step as build_step
    from jaxwarm.prewarm.step import seed_spec as seed_spec
    from jaxwarm.prewarm.step import step_args as step_args
    from jaxwarm.prewarm.step import trainer_argv as trainer_argv

# Exported name -> the module that defines it.
EXPORTS = {
    "Config": "jaxwarm.launcher.config",
    "load_config": "jaxwarm.launcher.config",
    "initialize": "jaxwarm.launcher.injob.distributed",
    "config_from_env": "jaxwarm.launcher.environment",
    "enable_cache": "jaxwarm.launcher.injob.hook",
    "sharded_specs": "jaxwarm.prewarm.specs",
    "warn_risky_inputs": "jaxwarm.prewarm.specs",
    "CompileTarget": "jaxwarm.prewarm.step",
    "StepBundle": "jaxwarm.prewarm.step",
    "build_mesh": "jaxwarm.prewarm.step",
    "build_step": "jaxwarm.prewarm.step",
    "seed_spec": "jaxwarm.prewarm.step",
    "step_args": "jaxwarm.prewarm.step",
    "trainer_argv": "jaxwarm.prewarm.step",
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

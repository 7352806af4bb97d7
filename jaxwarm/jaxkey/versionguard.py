"""Job entry points on an untested jax: one line and exit 2, never a traceback.

A job process (`python -m jaxwarm.job.prewarm`, `python -m jaxwarm.job.verify`, `jaxwarm-train`)
may be started by SLURM long after the CLI checked the version, or by hand. Outside the tested range
(and unless JAXWARM_ALLOW_UNTESTED_JAX=1) its `main` stops before it calls into jax (its module has
imported jax's public API, nothing more); allowed to try, a jax internal that moved (ImportError,
AttributeError, a missing probe seam) is reported as one line naming the version instead of a
traceback from deep inside jax. A jax that fails `import jax` itself is beyond this: that traceback
comes from the module's imports.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from jaxwarm.core.errors import say
from jaxwarm.jaxkey.versions import (
    UnsupportedJaxVersion,
    in_range,
    installed,
    unsupported_message,
    version_problem,
)

Main = TypeVar("Main", bound=Callable[..., int])


def jax_job(main: Main) -> Main:
    """Decorate a job's `main`; see the module docstring."""

    @functools.wraps(main)
    def guarded(*args: object, **kwargs: object) -> int:
        problem = version_problem()
        if problem:
            return say(problem)
        try:
            return main(*args, **kwargs)
        except UnsupportedJaxVersion as exc:
            return say(str(exc))
        except (ImportError, AttributeError) as exc:
            versions = installed()
            if versions is None or in_range(versions.jax):
                raise
            return say(unsupported_message(versions.jax, f"{type(exc).__name__}: {exc}"))

    return guarded  # type: ignore[return-value]


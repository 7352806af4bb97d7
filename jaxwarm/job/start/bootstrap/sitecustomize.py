"""jaxwarm's bootstrap, first on a training job's PYTHONPATH when its entrypoint reaches
Python through another program (a shell script): installs the init recorder when this
process imports jax (`jaxwarm.job.start.jaximport`), then imports the `sitecustomize`
it shadows (a distribution's, a virtualenv's, the trainer's), as Python would have without
it. Python imports it at start-up; it imports no jax itself."""

import importlib
import os
import sys


def _record() -> None:
    try:
        from jaxwarm.job.start.jaximport import record_when_jax_imports
    except ImportError as exc:
        print(f"jaxwarm: warning: {sys.executable} cannot import jaxwarm ({exc}): this "
              f"process records no init report; run the trainer with the Python jaxwarm is "
              f"installed in", file=sys.stderr, flush=True)
    else:
        record_when_jax_imports()


def _chain() -> None:
    own = os.path.dirname(os.path.realpath(__file__))
    saved = list(sys.path)
    sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or ".") != own]
    this = sys.modules.pop("sitecustomize")
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        sys.modules["sitecustomize"] = this


if os.environ.get("JAXWARM_CONFIG"):
    _record()
_chain()

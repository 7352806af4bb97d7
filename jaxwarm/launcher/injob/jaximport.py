"""Installs the init recorder in a training job's Python process the moment it imports jax.

Every launch form reaches this: `jaxwarm.launcher.injob.call` (console script, `entrypoint.module`,
`entrypoint.function`, a Python interpreter running a script) calls `record_when_jax_imports`
before the trainer's code, and a command that reaches Python some other way (a shell script
that execs or starts `python train.py`) gets it from the bootstrap `sitecustomize` that the
launcher puts first on the training job's PYTHONPATH (`bootstrap/sitecustomize.py`).

Why at jax's import and not before the trainer's code: jax's import is the earliest point at
which the recorder can exist (it listens to jax's events), and the trainer cannot touch a
jax setting before it. So the recorder sees every setting the trainer makes and every
compile, and a launch form costs no jax import of its own (a process that never imports
jax, like a shell script's helper `python -c ...`, pays nothing). The recorder's start time
is the process's own start (`recorder.process_start_time`), not the install time.

Only one process of a job's process tree installs it: the first to import jax marks the
environment (`RECORDER_PID`), and Python processes it starts (data-loader workers, an eval
subprocess) inherit the mark and stay out, so none of them overwrites its init report.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

# The directory whose sitecustomize.py a training job's Python processes load at start; it
# imports the one it shadows itself (so that runs even where jaxwarm cannot be imported).
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
RECORDER_PID = "JAXWARM_RECORDER_PID"
# Set by `jaxwarm verify --trainer`: the trainer runs only up to its prewarmed lookups, and
# not into its first step (FIRST_STEP) unless asked to (UNTIL_ALL: --until-all-looked-up).
VERIFY_TRAINER = "JAXWARM_VERIFY_TRAINER"
FIRST_STEP, UNTIL_ALL = "first-step", "until-all-looked-up"


def install_now() -> None:
    """Install the training job's recorder (config from JAXWARM_CONFIG) in this process;
    bad input (a config that cannot be read, a process already pointed at another cache
    dir) ends the process with one line and exit 2, as every job does."""
    from jaxwarm.launcher.injob.hook import install_recorder

    try:
        if os.environ.get(VERIFY_TRAINER):  # jaxwarm verify --trainer (jaxwarm.prewarm.verify)
            from jaxwarm.launcher.injob.trainerverify import watch_trainer
            from jaxwarm.launcher.rundir import VERIFY
            watch_trainer(install_recorder(job=VERIFY),
                          until_all=os.environ[VERIFY_TRAINER] == UNTIL_ALL)
        else:
            install_recorder()
    except Exception as exc:  # one line, never a traceback from a hook
        from jaxwarm.launcher.errors import is_user_error, one_line, say
        if not is_user_error(exc):
            raise
        raise SystemExit(say(one_line(exc))) from None
    os.environ[RECORDER_PID] = str(os.getpid())


class _AfterJaxImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `jax` is about to be imported, it takes the spec the other
    finders give and runs `install_now` right after jax's own module code."""

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != "jax":
            return None
        sys.meta_path.remove(self)  # once; and find_spec below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_install(module: ModuleType) -> None:
            exec_module(module)
            install_now()

        loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


def record_when_jax_imports() -> None:
    """Install the recorder when this process imports jax (now, if it already has), unless
    a process this one descends from already has it (see the module docstring)."""
    if os.environ.get(RECORDER_PID):
        return
    if "jax" in sys.modules:
        install_now()
    elif not any(isinstance(finder, _AfterJaxImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterJaxImport())


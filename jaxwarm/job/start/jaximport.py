"""Installs the init recorder in a training job's Python process the moment it imports jax.

Every launch form reaches this: `jaxwarm.job.start.call` (console script, `entrypoint.module`,
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

`jaxwarm verify --trainer` arms its time limit here too, before the trainer's code runs, not
at jax's import: a trainer that blocks before it imports jax is ended at the limit with one
line (`arm_verify_limit`); the watch that jax's import installs answers at it instead
(`jaxwarm.job.trainerverify`).

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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from jaxwarm.core.childwait import DEADLINE

# The directory whose sitecustomize.py a training job's Python processes load at start; it
# imports the one it shadows itself (so that runs even where jaxwarm cannot be imported).
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
RECORDER_PID = "JAXWARM_RECORDER_PID"
# Set by `jaxwarm verify --trainer` to its time limit (init_budget_s, s): the trainer runs
# only up to its prewarmed lookups, or to the limit.
VERIFY_TRAINER = "JAXWARM_VERIFY_TRAINER"
# Set by `verify --trainer --until-all-looked-up`: the trainer runs on past its first step
# (which verify --trainer otherwise stops before) until each prewarmed function is looked up.
VERIFY_UNTIL_ALL = "JAXWARM_VERIFY_UNTIL_ALL"
# What verify --trainer's time limit runs, once the trainer's watch is installed: its answer.
_at_verify_limit: list[Callable[[], None]] = []
_verify_timer: list[threading.Timer] = []


def arm_verify_limit(deadline: float, budget_s: float) -> None:
    """verify --trainer's time limit in this process (once): at `deadline`, init_budget_s
    `budget_s` from the trainer's start."""
    if _verify_timer:
        return
    timer = threading.Timer(max(0.0, deadline - time.time()), _verify_limit, args=(budget_s,))
    timer.daemon = True
    timer.start()
    _verify_timer.append(timer)


def on_verify_limit(answer: Callable[[], None]) -> None:
    """`answer` runs at verify --trainer's time limit instead of the plain end below."""
    _at_verify_limit[:] = [answer]


def _verify_limit(budget_s: float) -> None:
    if _at_verify_limit:
        _at_verify_limit[0]()
        return
    from jaxwarm.core.errors import EXIT_ERROR, say
    say(f"verify --trainer: stopped at the time limit (init_budget_s {budget_s:g} s from the "
        f"trainer's start): the trainer had not imported jax; the answer is unknown")
    os._exit(EXIT_ERROR)  # at once: nothing of the trainer runs on (its exit handlers)


def install_now() -> None:
    """Install the training job's recorder (config from JAXWARM_CONFIG) in this process;
    bad input (a config that cannot be read, a process already pointed at another cache
    dir) ends the process with one line and exit 2, as every job does."""
    from jaxwarm.job.start.hook import install_recorder

    try:
        if os.environ.get(VERIFY_TRAINER):  # jaxwarm verify --trainer (jaxwarm.job.verify)
            from jaxwarm.core.records import VERIFY
            from jaxwarm.job.trainerverify import watch_trainer
            watch_trainer(install_recorder(job=VERIFY),
                          until_all=bool(os.environ.get(VERIFY_UNTIL_ALL)))
        else:
            install_recorder()
    except Exception as exc:  # one line, never a traceback from a hook
        from jaxwarm.core.errors import is_user_error, one_line, say
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
    if os.environ.get(VERIFY_TRAINER) and os.environ.get(DEADLINE):
        # Only the wrapper's command has the deadline: not the wrapper itself (the local
        # supervisor, whose Python loads the bootstrap too, runs in the job environment).
        arm_verify_limit(float(os.environ[DEADLINE]), float(os.environ[VERIFY_TRAINER]))
    if "jax" in sys.modules:
        install_now()
    elif not any(isinstance(finder, _AfterJaxImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterJaxImport())


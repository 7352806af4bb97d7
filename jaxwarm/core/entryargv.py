"""The trainer's own argv: what its `sys.argv` will be in the training job, from the config.

One source of truth for a trainer's settings is its command line: a step factory that builds
the step by calling the trainer's own argument parser with this argv (`jaxwarm.step.
trainer_argv`) lowers the program the trainer will, whatever `entrypoint.args` a launch's
overrides gave it. The launcher (`jaxwarm.submit.jobs`, which starts the trainer) and the
jobs (which build its step) read the command through the same `python_command` here, so
they agree on which words are the interpreter's and which the trainer's.

argv[0] per launch form (`jaxwarm.job.start.call` runs each):
- a command `python [flags] SCRIPT ARGS`: SCRIPT as given, as Python sets it;
- `entrypoint.module` or a command `python -m MODULE`: the module's file, as `python -m`
  sets it (`pkg/__main__.py` for a package);
- a console script: its name as the command gives it;
- `entrypoint.function`: `module:function`, which a `main(argv)` gets as absl's `app.run`
  would pass it (a function without arguments sees the same `sys.argv`);
- any other command (a shell script that starts Python): the command line itself, as the
  shell script gets it; the Python process it starts has whatever argv the script gives it.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from jaxwarm.core.config import Config

CONFIG_PLACEHOLDER = "{config}"

# An interpreter's name, and its own flags that take no value and may come before the
# script or -m.
PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
PYTHON_FLAGS = re.compile(r"-[BEIOPRbdqsuv]+")


@dataclass(frozen=True)
class PythonCommand:
    """A command `python [flags] (SCRIPT | -m MODULE) ARGS`, in its parts: `form` is
    `--path` (a script) or `--module`, as `jaxwarm.job.start.call` takes them."""

    flags: list[str]
    form: str
    target: str
    args: list[str]


def python_command(rest: list[str]) -> PythonCommand | None:
    """The parts of an interpreter's arguments (the command after `python`), or None for
    another form (`-c`, `-X opt`, no script) that runs as it is."""
    rest = list(rest)
    flags = []
    while rest and PYTHON_FLAGS.fullmatch(rest[0]):
        flags.append(rest.pop(0))
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return PythonCommand(flags, "--module", rest[1], rest[2:])
    if rest and not rest[0].startswith("-"):
        return PythonCommand(flags, "--path", rest[0], rest[1:])
    return None


def entry_args(config: Config, config_path: str | Path) -> list[str]:
    """`entrypoint.args`, with `{config}` made the pinned config's path."""
    return [arg.replace(CONFIG_PLACEHOLDER, str(config_path))
            for arg in config.entrypoint.args]


def module_file(module: str) -> str:
    """What `python -m MODULE` puts in sys.argv[0]: the file it runs (a package's
    `__main__`); the name itself where it cannot be found here (the job fails on it too)."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{module}.__main__")
    except (ImportError, ValueError):
        return module
    return spec.origin if spec is not None and spec.origin else module


def trainer_argv(config: Config) -> list[str]:
    """The training entrypoint's argv as its `sys.argv` will be (module docstring), for the
    pinned config a job reads (`config.source`, which `{config}` names)."""
    entry = config.entrypoint
    args = entry_args(config, config.source)
    if entry.function is not None:
        return [entry.function, *args]
    if entry.module is not None:
        return [module_file(entry.module), *args]
    command = list(entry.command or [])
    if command and PYTHON.fullmatch(Path(command[0]).name):
        parts = python_command(command[1:])
        if parts is not None:
            target = module_file(parts.target) if parts.form == "--module" else parts.target
            return [target, *parts.args, *args]
    return [*command, *args]

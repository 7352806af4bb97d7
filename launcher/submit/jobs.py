"""What each job of a run executes: the prewarm job and the training entrypoint.

A job is an argv plus the job environment; runners (local, SLURM) only decide where and
how many times it runs. The prewarm job is started by module path, so the launcher never
imports prewarm code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from launcher.config import Config, ConfigError
from launcher.environment import job_environment
from launcher.jaxkey.versions import version_problem
from launcher.rundir import PREWARM, TRAIN, VERIFY

log = logging.getLogger("jaxwarm.jobs")

PREWARM_MODULE = "prewarm.job"
VERIFY_MODULE = "prewarm.verify"
CALL_MODULE = "launcher.injob.call"
CONFIG_PLACEHOLDER = "{config}"


@dataclass(frozen=True)
class JobSpec:
    name: str
    argv: list[str]
    env: dict[str, str]


@contextmanager
def job_import_path(config: Config) -> Iterator[None]:
    """While it is held, this process finds modules and installed distributions the way the
    job will: with the config's `env: {PYTHONPATH: ...}` in front of sys.path (relative
    entries against the working directory, where jobs start)."""
    entries = [str(Path(entry).absolute()) for entry in
               config.env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    saved = list(sys.path)
    sys.path[:0] = entries
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved
        importlib.invalidate_caches()


def check_modules(config: Config) -> None:
    """Fail before submitting when the jobs' jax is untested, or the step factory's or
    entrypoint's module does not exist, or its source plainly does not define the function.

    Only locates and parses the modules (no import: that would import the user's jax code
    here), with the job's PYTHONPATH; a module without Python source, or one that
    star-imports, is given the benefit of the doubt and checked in the job."""
    if problem := version_problem():
        raise ConfigError(problem)
    specs = [("step.factory", config.step.factory)]
    if config.entrypoint.function is not None:
        specs.append(("entrypoint.function", config.entrypoint.function))
    with job_import_path(config):
        for key, spec in specs:
            module, _, function = spec.partition(":")
            try:
                found = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                found = None
            if found is None:
                where = " or the config's env PYTHONPATH" if "PYTHONPATH" in config.env else ""
                raise ConfigError(f"{config.source}: {key}: module {module!r} was not found "
                                  f"(is it installed in {sys.executable}{where}?)")
            names = top_level_names(found.origin)
            if names is not None and function not in names:
                raise ConfigError(f"{config.source}: {key}: module {module!r} "
                                  f"({found.origin}) defines no {function!r}")


def top_level_names(origin: str | None) -> set[str] | None:
    """Names a Python source file binds at its top level; None when that cannot be known."""
    if origin is None or not origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(origin).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def console_script(config: Config, name: str) -> EntryPoint | None:
    """The Python entry point behind a console-script name, as the job would find it."""
    with job_import_path(config):
        found = entry_points(group="console_scripts", name=name)
    return next(iter(found), None)


def entrypoint_argv(config: Config, config_path: str | Path) -> list[str]:
    """The training entrypoint as an argv; `{config}` in its args becomes the pinned config.

    A console script (`entrypoint.command: [jsp-train, ...]`) runs as its Python entry point
    under `launcher.injob.call --script`, which installs the init recorder before the
    trainer's own code: the trainer needs no change for the cache report. Any other command
    runs as it is, and then only a trainer that calls `enable_cache()` writes a report."""
    entry = config.entrypoint
    args = [arg.replace(CONFIG_PLACEHOLDER, str(config_path)) for arg in entry.args]
    if entry.function is not None:
        return [sys.executable, "-m", CALL_MODULE, entry.function, *args]
    command = list(entry.command or [])
    script = console_script(config, command[0])
    if script is not None:
        return [sys.executable, "-m", CALL_MODULE, "--script", command[0], script.value,
                *command[1:], *args]
    path = config.env.get("PATH", os.environ.get("PATH", ""))
    search = os.pathsep.join([path, str(Path(sys.executable).parent)])
    found = shutil.which(command[0], path=search)
    if found is None:
        raise ConfigError(f"{config.source}: entrypoint.command: {command[0]!r} was not found "
                          f"on PATH nor as a Python console script")
    log.warning("%s: entrypoint.command %s is not a Python console script: it runs as it is, "
                "and jaxwarm cannot record an init report for it unless it calls "
                "launcher.enable_cache()", config.source, command[0])
    return [found, *command[1:], *args]


def prewarm_job(config: Config, config_path: str | Path) -> JobSpec:
    return JobSpec(PREWARM, [sys.executable, "-m", PREWARM_MODULE],
                   job_environment(config, config_path))


def verify_job(config: Config, config_path: str | Path) -> JobSpec:
    return JobSpec(VERIFY, [sys.executable, "-m", VERIFY_MODULE],
                   job_environment(config, config_path))


def train_job(config: Config, config_path: str | Path) -> JobSpec:
    return JobSpec(TRAIN, entrypoint_argv(config, config_path),
                   job_environment(config, config_path))

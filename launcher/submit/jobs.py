"""What each job of a run executes: the prewarm job and the training entrypoint.

A job is an argv plus the job environment; runners (local, SLURM) only decide where and
how many times it runs. The prewarm job is started by module path, so the launcher never
imports prewarm code.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.config import Config, ConfigError
from launcher.environment import job_environment
from launcher.rundir import PREWARM, TRAIN, VERIFY

PREWARM_MODULE = "prewarm.job"
VERIFY_MODULE = "prewarm.verify"
CONFIG_PLACEHOLDER = "{config}"


@dataclass(frozen=True)
class JobSpec:
    name: str
    argv: list[str]
    env: dict[str, str]


def check_modules(config: Config) -> None:
    """Fail before submitting when the step factory's or entrypoint's module does not exist,
    or its source plainly does not define the function.

    Only locates and parses the modules (no import: that would import the user's jax code
    here); a module without Python source, or one that star-imports, is given the benefit
    of the doubt and checked in the job."""
    specs = [("step.factory", config.step.factory)]
    if config.entrypoint.function is not None:
        specs.append(("entrypoint.function", config.entrypoint.function))
    for key, spec in specs:
        module, _, function = spec.partition(":")
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise ConfigError(f"{config.source}: {key}: module {module!r} was not found "
                              f"(is it installed in {sys.executable}?)")
        names = top_level_names(found.origin)
        if names is not None and function not in names:
            raise ConfigError(f"{config.source}: {key}: module {module!r} ({found.origin}) "
                              f"defines no {function!r}")


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


def entrypoint_argv(config: Config, config_path: str | Path) -> list[str]:
    """The training entrypoint as an argv; `{config}` in its args becomes the pinned config."""
    entry = config.entrypoint
    args = [arg.replace(CONFIG_PLACEHOLDER, str(config_path)) for arg in entry.args]
    if entry.function is not None:
        return [sys.executable, "-m", "launcher.injob.call", entry.function, *args]
    command = list(entry.command or [])
    search = os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)])
    found = shutil.which(command[0], path=search)
    if found is None:
        raise ConfigError(f"{config.source}: entrypoint.command: {command[0]!r} was not found "
                          f"on PATH")
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

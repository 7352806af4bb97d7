"""What each job of a run executes: the prewarm job and the training entrypoint.

A job is an argv plus the job environment; runners (local, SLURM) only decide where and
how many times it runs. The prewarm job is started by module path, so the launcher never
imports prewarm code.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.config import Config, ConfigError
from launcher.environment import job_environment
from launcher.rundir import PREWARM, TRAIN, VERIFY
from prewarm.jaxkey.versions import version_problem

PREWARM_MODULE = "prewarm.job"
VERIFY_MODULE = "prewarm.verify"
CONFIG_PLACEHOLDER = "{config}"


@dataclass(frozen=True)
class JobSpec:
    name: str
    argv: list[str]
    env: dict[str, str]


def check_modules(config: Config) -> None:
    """Fail before submitting when the jobs' jax is untested, or the step factory's or
    entrypoint's module does not exist.

    Only locates the modules (no import: that would import the user's jax code here)."""
    if problem := version_problem():
        raise ConfigError(problem)
    specs = [("step.factory", config.step.factory)]
    if config.entrypoint.function is not None:
        specs.append(("entrypoint.function", config.entrypoint.function))
    for key, spec in specs:
        module = spec.partition(":")[0]
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            raise ConfigError(f"{config.source}: {key}: module {module!r} was not found "
                              f"(is it installed in {sys.executable}?)")


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

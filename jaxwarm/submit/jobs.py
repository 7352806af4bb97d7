"""What each job of a run executes: the prewarm job and the training entrypoint.

A job is an argv plus the job environment; runners (local, SLURM) only decide where and
how many times it runs. The prewarm job is started by module path, so the launcher never
imports prewarm code.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import pkgutil
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from jaxwarm.core.config import Config
from jaxwarm.core.entryargv import PYTHON, entry_args, python_command
from jaxwarm.core.environment import (
    PINNED_DIGEST,
    VERIFY_INVOCATION,
    job_environment,
    merge_environment,
)
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.gputarget import mock_environment
from jaxwarm.core.moved import moved_module
from jaxwarm.core.records import PREWARM, TRAIN, VERIFY
from jaxwarm.jaxkey.versions import refuse_key_change, version_problem
from jaxwarm.job.start.jaximport import BOOTSTRAP_DIR, VERIFY_TRAINER, VERIFY_UNTIL_ALL

log = logging.getLogger(__name__)

# jaxwarm's own import package, which nothing on a job's PYTHONPATH may shadow.
PACKAGE = "jaxwarm"
PREWARM_MODULE = "jaxwarm.job.prewarm"
VERIFY_MODULE = "jaxwarm.job.verify"
CALL_MODULE = "jaxwarm.job.start.call"
JAXIMPORT_MODULE = "jaxwarm.job.start.jaximport"


@dataclass(frozen=True)
class JobSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    # verify --trainer's time limit, which its wrapper keeps from the trainer's start
    # (`jaxwarm.submit.supervise`, `jaxwarm.job.start.task`).
    init_budget_s: float | None = None

    def pinned(self, digest: str) -> JobSpec:
        """This job with the sha256 of the pinned config it reads, as the launch wrote it
        (`PINNED_DIGEST`): its processes refuse a config that is not that file."""
        return dataclasses.replace(self, env={**self.env, PINNED_DIGEST: digest})


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
    entrypoint's module does not exist, or its source plainly does not define the function,
    or the entrypoint function plainly cannot be called with no argument or with argv.

    Only locates and parses the modules (no import, not even of their parent packages: that
    would import the user's jax code here), with the job's PYTHONPATH; a module without
    Python source, or one that star-imports, is given the benefit of the doubt and checked
    in the job."""
    if problem := version_problem():
        raise ConfigError(problem)
    entry = config.entrypoint
    specs = [("step.factory", config.step.factory)]
    if entry.function is not None:
        specs.append(("entrypoint.function", entry.function))
    refuse_shadowing(config)
    with job_import_path(config):
        if config.report.mlperf and importlib.util.find_spec("mlperf_logging") is None:
            raise ConfigError(f"{config.source}: report.mlperf: the training job logs MLPerf's "
                              f"lines through the mlperf-logging package, which is not "
                              f"installed: pip install 'jaxwarm[mlperf]'")
        if entry.module is not None:
            found = locate(config, "entrypoint.module", entry.module)
            if found.submodule_search_locations is not None and not any(
                    (Path(where) / "__main__.py").is_file()
                    for where in found.submodule_search_locations):
                raise ConfigError(f"{config.source}: entrypoint.module: {entry.module!r} is a "
                                  f"package without a __main__.py, so python -m cannot run it")
        for key, spec in specs:
            module, _, function = spec.partition(":")
            found = locate(config, key, module)
            tree = parse_source(found.origin)
            names = top_level_names(tree)
            if names is not None and function not in names:
                raise ConfigError(f"{config.source}: {key}: module {module!r} "
                                  f"({found.origin}) defines no {function!r}")
            if key == "entrypoint.function" and tree is not None:
                check_callable(config, spec, found.origin, tree)


def refuse_shadowing(config: Config) -> None:
    """A package of the user's named `jaxwarm` in an entry of the config's PYTHONPATH would
    be imported in every job in place of jaxwarm itself (an installed wheel comes after
    PYTHONPATH): one line, before anything runs, not a traceback from every job. A dir of
    that name without `__init__.py` is a namespace portion, which shadows nothing."""
    ours = Path(sys.modules[PACKAGE].__file__ or "").parent
    for entry in config.env.get("PYTHONPATH", "").split(os.pathsep):
        finder = pkgutil.get_importer(str(Path(entry).absolute())) if entry else None
        found = finder.find_spec(PACKAGE) if finder is not None else None
        where = Path(found.origin) if found is not None and found.loader is not None and \
            found.origin else None
        if where is not None and ours != where.parent:
            raise ConfigError(f"{config.source}: env.PYTHONPATH: {entry} holds a package named "
                              f"{PACKAGE!r} ({where}), which every job would import in place "
                              f"of jaxwarm itself; rename it")


def locate(config: Config, key: str, module: str) -> importlib.machinery.ModuleSpec:
    """Where `module` is, found without importing it or its parent packages."""
    found = find_module(module)
    if found is None:
        if moved := moved_module(module):
            raise ConfigError(f"{config.source}: {key}: module {module!r} was not found: "
                              f"{moved}")
        where = " or the config's env PYTHONPATH" if "PYTHONPATH" in config.env else ""
        raise ConfigError(f"{config.source}: {key}: module {module!r} was not found "
                          f"(is it installed in {sys.executable}{where}?)")
    return found


def find_module(name: str) -> importlib.machinery.ModuleSpec | None:
    """Where a module is, found without importing it or its parent packages (a top-level
    package already imported is taken as it is); None when it is not found."""
    parts = name.split(".")
    try:
        found = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else \
            getattr(sys.modules[parts[0]], "__spec__", None)
        for depth in range(1, len(parts)):
            if found is None or found.submodule_search_locations is None:
                return None
            found = find_submodule(".".join(parts[:depth + 1]),
                                   list(found.submodule_search_locations))
    except (ImportError, ValueError):
        return None
    return found


def find_submodule(name: str, locations: list[str]) -> importlib.machinery.ModuleSpec | None:
    """`name` in its parent package's directories, as `PathFinder.find_spec` finds it, but
    also when it is a namespace package (a directory without `__init__.py`, as
    `maxtext.trainers` is): PathFinder then looks its parent up in sys.modules (Python
    3.12+), which this check never imports."""
    portions: list[str] = []
    for where in locations:
        finder = pkgutil.get_importer(where)
        spec = finder.find_spec(name) if finder is not None else None
        if spec is not None and spec.loader is not None:
            return spec
        if spec is not None:
            portions.extend(spec.submodule_search_locations or [])
    if not portions:
        return None
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def parse_source(origin: str | None) -> ast.Module | None:
    """A module's parsed source; None when it has none that can be read."""
    if origin is None or not origin.endswith(".py"):
        return None
    try:
        return ast.parse(Path(origin).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None


def top_level_names(tree: ast.Module | None) -> set[str] | None:
    """Names a Python source file binds at its top level; None when that cannot be known."""
    if tree is None:
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


def check_callable(config: Config, spec: str, origin: str | None, tree: ast.Module) -> None:
    """An `entrypoint.function` defined at the top level of its module must take no required
    argument (a console script's `main()`) or one (`main(argv)`, as absl's app.run calls it):
    `jaxwarm.job.start.call` calls it one of those two ways."""
    name = spec.partition(":")[2]
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name),
                None)
    if node is None:
        return
    positional = [*node.args.posonlyargs, *node.args.args]
    required = [a.arg for a in positional[:len(positional) - len(node.args.defaults)]]
    keyword_only = [a.arg for a, default
                    in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                    if default is None]
    if len(required) > 1 or keyword_only:
        required += keyword_only
        raise ConfigError(
            f"{config.source}: entrypoint.function: {spec} ({origin}:{node.lineno}) needs "
            f"{len(required)} argument(s) ({', '.join(required)}); expected none (called like "
            f"a console script's main()) or one positional (main(argv), called with "
            f"[{spec}, *entrypoint.args] as absl's app.run does)")


def console_script(config: Config, name: str) -> EntryPoint | None:
    """The Python entry point behind a console-script name, as the job would find it."""
    with job_import_path(config):
        found = entry_points(group="console_scripts", name=name)
    return next(iter(found), None)


@dataclass(frozen=True)
class Entrypoint:
    """The training job's argv, and whether its Python processes need the bootstrap
    (`jaxwarm.job.start.jaximport`) on PYTHONPATH because no jaxwarm code runs before the
    trainer's."""

    argv: list[str]
    bootstrap: bool = False


def entrypoint(config: Config, config_path: str | Path) -> Entrypoint:
    """The training entrypoint; `{config}` in its args becomes the pinned config. Each form
    gets jaxwarm's init recorder and cache guard, installed when the trainer imports jax
    (`jaxwarm.job.start.jaximport`), and the launcher logs which form it found:

    - `entrypoint.function`, `entrypoint.module`, a console script, and a command that is a
      Python interpreter running a script or `-m module`: the trainer runs under
      `jaxwarm.job.start.call`, which installs the recorder first;
    - any other command (a shell script that starts Python): runs as it is, and jaxwarm's
      bootstrap `sitecustomize` goes first on the job's PYTHONPATH.
    """
    entry = config.entrypoint
    args = entry_args(config, config_path)
    if entry.function is not None:
        log.info("entrypoint.function: %s is called as a console script's main() or absl's "
                 "main(argv), with jaxwarm's init recorder", entry.function)
        return Entrypoint(call_argv(sys.executable, [], "--function", entry.function, args))
    if entry.module is not None:
        log.info("entrypoint.module: %s runs as python -m %s, with jaxwarm's init recorder",
                 entry.module, entry.module)
        return Entrypoint(call_argv(sys.executable, [], "--module", entry.module, args))
    command = list(entry.command or [])
    script = console_script(config, command[0])
    if script is not None:
        log.info("entrypoint.command: %s is a Python console script (%s): it runs with "
                 "jaxwarm's init recorder", command[0], script.value)
        return Entrypoint(call_argv(sys.executable, [], "--script", command[0],
                                    [script.value, *command[1:], *args]))
    found = find_command(config, command[0])
    if PYTHON.fullmatch(Path(found).name):
        return python_entrypoint(config, found, command[1:], args)
    log.warning("%s: entrypoint.command %s is not a Python console script nor a Python "
                "interpreter (a shell script?): it runs as it is, with jaxwarm's bootstrap "
                "first on its PYTHONPATH, so the first Python process it starts that imports "
                "jax records the init report (one started with -S, -I or -E, or without "
                "jaxwarm installed, records none)", config.source, command[0])
    return Entrypoint([found, *command[1:], *args], bootstrap=True)


def find_command(config: Config, name: str) -> str:
    path = config.env.get("PATH", os.environ.get("PATH", ""))
    search = os.pathsep.join([path, str(Path(sys.executable).parent)])
    found = shutil.which(name, path=search)
    if found is None:
        raise ConfigError(f"{config.source}: entrypoint.command: {name!r} was not found "
                          f"on PATH nor as a Python console script")
    return found


def python_entrypoint(config: Config, python: str, rest: list[str],
                      args: list[str]) -> Entrypoint:
    """`[python, (-u ...), script.py | -m module, ...]` runs under `jaxwarm.job.start.call` in
    the same interpreter; another form (`-c`, `-X opt`) runs as it is, with the bootstrap."""
    if not imports_jaxwarm(config, python):
        log.warning("%s: entrypoint.command: %s cannot import jaxwarm: it runs as it is and "
                    "records no init report; install jaxwarm into it, or name %s",
                    config.source, python, sys.executable)
        return Entrypoint([python, *rest, *args])
    parts = python_command(rest)
    if parts is None:
        log.warning("%s: entrypoint.command: Python (%s) with %s, neither a script nor -m "
                    "module: it runs as it is, with jaxwarm's bootstrap first on its "
                    "PYTHONPATH, which records the init report when it imports jax",
                    config.source, python, " ".join(rest[:1]) or "no script")
        return Entrypoint([python, *rest, *args], bootstrap=True)
    log.info("entrypoint.command: Python (%s) running %s %s: it runs with jaxwarm's init "
             "recorder", python, "module" if parts.form == "--module" else "script",
             parts.target)
    return Entrypoint(call_argv(python, parts.flags, parts.form, parts.target,
                                [*parts.args, *args]))


def imports_jaxwarm(config: Config, python: str) -> bool:
    """Whether `python` finds this jaxwarm: yes in this interpreter's own environment (its
    bin dir); elsewhere asked, with the job's PYTHONPATH."""
    if Path(python).absolute().parent == Path(sys.executable).absolute().parent:
        return True
    env = merge_environment(dict(os.environ), {k: v for k, v in config.env.items()
                                              if k == "PYTHONPATH"})
    probe = subprocess.run([python, "-c", f"import {JAXIMPORT_MODULE}"], env=env, check=False,
                           capture_output=True, timeout=60)
    return probe.returncode == 0


def call_argv(python: str, flags: list[str], form: str, target: str,
              args: list[str]) -> list[str]:
    return [python, *flags, "-m", CALL_MODULE, form, target, *args]


def with_bootstrap(env: dict[str, str]) -> dict[str, str]:
    """The job environment with jaxwarm's bootstrap first on PYTHONPATH, in front of the
    config's PYTHONPATH or, without one, the submitting shell's (which the job inherits)."""
    rest = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(BOOTSTRAP_DIR), rest]))}


def prewarm_job(config: Config, config_path: str | Path) -> JobSpec:
    """The prewarm job: the run's environment, plus the topology to mock when it compiles
    for the run's layout on one node (`prewarm.layout: mock`)."""
    return JobSpec(PREWARM, [sys.executable, "-m", PREWARM_MODULE],
                   {**job_environment(config, config_path), **mock_environment(config, PREWARM)})


def verify_job(config: Config, config_path: str | Path) -> JobSpec:
    return JobSpec(VERIFY, [sys.executable, "-m", VERIFY_MODULE],
                   {**job_environment(config, config_path), VERIFY_INVOCATION: uuid.uuid4().hex})


def train_job(config: Config, config_path: str | Path) -> JobSpec:
    """The training job; refused where its node-local staging would change the key."""
    refuse_key_change(config.cache, config.source)
    entry = entrypoint(config, config_path)
    env = job_environment(config, config_path)
    return JobSpec(TRAIN, entry.argv, with_bootstrap(env) if entry.bootstrap else env)


def verify_trainer_job(config: Config, config_path: str | Path,
                       until_all: bool = False) -> JobSpec:
    """`jaxwarm verify --trainer`: the training job's entrypoint, argv and environment, as
    the verify job: it runs up to the lookup of each prewarmed function, or of the first
    step's, whichever comes first; `until_all`: of each (`jaxwarm.job.trainerverify`)."""
    train = train_job(config, config_path)
    until = {VERIFY_UNTIL_ALL: "1"} if until_all else {}
    return JobSpec(VERIFY, train.argv, {**train.env, VERIFY_TRAINER: f"{config.init_budget_s!r}",
                                        VERIFY_INVOCATION: uuid.uuid4().hex, **until},
                   config.init_budget_s)

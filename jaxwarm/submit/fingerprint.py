"""What the login node can know, before any job, that enters the cache keys of a run's step.

A launch with `--prewarm auto` goes without its prewarm job when a completed prewarm ran
under the same fingerprint (`jaxwarm.store.prewarms`). The key hashes the traced program,
the jax and jaxlib versions, the XLA flags, the compile options, the topology and the
compression library; what decides those, and the launcher can see without starting JAX:

- `jax`, `jaxlib`, `python`: the versions the jobs run (the jobs run this interpreter);
- `packages`: every installed distribution and its version, on the job's PYTHONPATH (flax,
  optax, a jax plugin, zstandard, a pip-installed trainer: each can change the program);
- `environment`: the job environment (cache settings, JAX options, XLA_FLAGS with the device
  count, the platform, the config's `env`), less what names the run, and every variable JAX
  or XLA read that the jobs inherit from this shell (`jaxwarm.core.environment.key_variable`:
  LIBTPU_INIT_ARGS, TPU_*, CUDA_*, XLA_*...); `variables` keeps a hash of each key variable,
  so a difference is said by name;
- `topology`, `mesh`, `step` (factory and its arguments), `hardware` (the SLURM partition,
  constraint and GPUs per node, which pick the machines), `backend` (local or SLURM);
- `source`: the step factory's module and every module it imports, transitively, that is
  Python source outside the standard library and installed distributions (the user's model
  code, an editable install), found by reading their imports without importing them;
- `entrypoint`: the trainer's command and arguments, where those sources read them
  (`jaxwarm.step.trainer_argv`: the factory builds the step with the trainer's own parser,
  so a changed flag is another program); a factory that does not read them builds the
  same step whatever they are, and a run that only changes its output dir or step count
  keeps its prewarm;
- `step.inputs`: files the config names as the step's inputs, signed here, with the sources
  (an absent one as ABSENT, so that its appearance is a change);
- `reads` (not in the digest: the login node cannot know them before a prewarm ran): the
  files the factory read while it built the step, as the prewarm job recorded them
  (`jaxwarm.job.record.reads`); a launch signs them again (`changed_reads`).

Files are signed as `jaxwarm.core.contents` says: by content up to 8 MiB, larger ones by
size, times and inode, so that a launch spends milliseconds on them whatever their size.

What it cannot see is found by the jobs themselves: the compute nodes' GPU model and driver
(the backend version), a module imported dynamically (`importlib.import_module` of a computed
name) when the factory's module is imported, a file read outside the factory's call. The
training job's processes look each function up under JAX's own key as always and report a
miss by component; a miss of an entry a recorded prewarm promised forgets that record, so
the next launch runs its prewarm again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import Distribution, distributions, version
from pathlib import Path
from typing import Any

from jaxwarm.core.config import Config
from jaxwarm.core.contents import (
    LINK,
    covered,
    file_signature,
    installed_tops,
    library_dirs,
    link_record,
)
from jaxwarm.core.environment import (
    PINNED_DIGEST,
    job_environment,
    key_environment,
    key_variable,
)
from jaxwarm.core.errors import ConfigError, one_line
from jaxwarm.core.records import Fingerprint
from jaxwarm.submit.jobs import find_module, job_import_path, parse_source

# Job variables that name the run, not the program: a run of another name shares its keys.
RUN_VARIABLES = ("JAXWARM_CONFIG", "JAXWARM_RUN_DIR", PINNED_DIGEST)
# What a step factory reads the trainer's command line through (`jaxwarm.step`).
ARGV_READER = "trainer_argv"
# The most source files followed from the factory: a bound on the walk, not a limit anyone
# should reach (a big trainer is a few hundred).
MAX_FILES = 5000
# The record of a `step.inputs` file that is not there (yet).
ABSENT = "absent"


def short_hash(data: Any) -> str:
    text = data if isinstance(data, str) else json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(config: Config, pinned: str | Path, backend: str) -> Fingerprint:
    """The fingerprint of a run's step, as this launcher sees it (pure but for reading
    package metadata and the step's sources)."""
    job_env = job_environment(config, pinned)
    env = {k: v for k, v in {**job_env, **key_environment(dict(os.environ), job_env)}.items()
           if k not in RUN_VARIABLES}
    with job_import_path(config):
        installed = list(distributions())
        # Each distribution's METADATA parsed once (`dist.version` parses it again).
        packages = sorted({(meta["Name"] or "?").lower(): meta["Version"]
                           for meta in (dist.metadata for dist in installed)}.items())
        sources = step_sources(config.step.factory.partition(":")[0], installed)
        versions = {name: version(name) for name in ("jax", "jaxlib")}
    parts = {
        **versions,
        "python": platform.python_version(),
        "packages": short_hash(packages),
        "environment": short_hash(env),
        "topology": short_hash(config.topology),
        "mesh": short_hash(config.mesh),
        "step": short_hash(config.step),
        "hardware": short_hash([config.slurm.partition, config.slurm.constraint,
                                config.slurm.gpus_per_node]),
        "backend": backend,
    }
    files = {**sources.files, **input_signatures(config)}
    parts["source"] = short_hash(files)
    if sources.reads_argv:
        parts["entrypoint"] = short_hash(config.entrypoint)
    variables = {name: short_hash(value) for name, value in env.items() if key_variable(name)}
    return Fingerprint(digest=short_hash(parts), parts=parts, files=files,
                       variables=variables)


def input_signatures(config: Config) -> dict[str, str]:
    """Each `step.inputs` file's signature, by absolute path (ABSENT where there is none);
    one that cannot be read, or is no regular file, is refused in one line."""
    files = {}
    for given in config.step.inputs:
        path = os.path.abspath(given)
        try:
            files[path] = file_signature(path)
        except FileNotFoundError:
            files[path] = ABSENT
        except OSError as exc:
            raise ConfigError(f"{config.source}: step.inputs: {one_line(exc)}; expected a "
                              f"regular file the launch can read") from None
    return files


def changed_reads(reads: dict[str, str]) -> list[str]:
    """Which of the files a recorded prewarm's step factory read (`Fingerprint.reads`, path
    -> hash as it read them) hold something else now, or are gone."""
    changed = []
    for path, recorded in sorted(reads.items()):
        try:
            now = link_record(path) if recorded.startswith(LINK) else file_signature(path)
        except OSError:
            now = None
        if now != recorded:
            changed.append(path)
    return changed




def names_trainer_argv(tree: ast.Module) -> bool:
    """Whether a parsed source names `trainer_argv` (imports, calls or reaches it as an
    attribute): then the trainer's command line is part of the step it builds."""
    return any(isinstance(node, ast.Name) and node.id == ARGV_READER
               or isinstance(node, ast.Attribute) and node.attr == ARGV_READER
               or isinstance(node, ast.alias) and node.name.split(".")[-1] == ARGV_READER
               for node in ast.walk(tree))


def statements(body: list[Any]) -> Iterator[Any]:
    """Every statement of a block and of the blocks inside it, at any depth (a function's,
    a branch's, a handler's, a match case's): where an import can be. Expressions, most of
    a tree's nodes, are not visited."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, block, None)
            if isinstance(inner, list):
                yield from statements(inner)


def imported_names(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """The modules a source file imports (and their parent packages, which run too):
    `import a.b`, `from a.b import c` (a.b, and a.b.c if it is a module), relative ones."""
    names: set[str] = set()
    for node in statements(tree.body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".strip(".")
            if base:
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names
                             if alias.name != "*")
    parents = {".".join(name.split(".")[:depth]) for name in names
               for depth in range(1, name.count(".") + 1)}
    return names | parents


@dataclass(frozen=True)
class StepSources:
    """The step factory's sources as the fingerprint sees them: each file's hash (path ->
    hash), and whether one of them, jaxwarm's own aside (which define it and which every
    factory imports), names `trainer_argv`."""

    files: dict[str, str]
    reads_argv: bool


def step_sources(module: str, installed: list[Distribution]) -> StepSources:
    """The hash of each Python source file the step factory's module reaches through its
    imports, outside the standard library and installed distributions: an installed file is
    covered by its distribution's version (the `packages` part), wherever it is installed;
    hashing it again would read all of jax where jax is on PYTHONPATH. `installed`: the
    distributions the `packages` part read, in the same import path. Each file is parsed
    once, for its imports and for `trainer_argv`."""
    libraries = library_dirs()
    tops = installed_tops(libraries, installed)
    own = Path(__file__).resolve().parents[1]  # the jaxwarm package
    seen: set[str] = set()
    files: dict[str, str] = {}
    reads_argv = False
    queue = [module]
    while queue and len(files) < MAX_FILES:
        name = queue.pop()
        if name in seen:
            continue
        seen.add(name)
        spec = find_module(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        path = Path(spec.origin).resolve()
        if covered(path, libraries, tops):
            continue
        try:
            files[str(path)] = file_signature(path)
        except OSError:
            continue
        tree = parse_source(str(path))
        if tree is not None:
            queue.extend(imported_names(tree, name, spec.submodule_search_locations
                                        is not None) - seen)
            reads_argv = reads_argv or (not path.is_relative_to(own)
                                        and names_trainer_argv(tree))
    return StepSources(files, reads_argv)

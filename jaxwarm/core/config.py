"""The YAML config as typed dataclasses, with one-line errors for every way it can be wrong.

This module is the schema (the sections, their types, ranges and choices as annotations)
and the checks that span fields; `jaxwarm.core.decode` reads values into it. Parsing is pure:
`parse_config(raw, source)` turns a dict into a `Config` or raises `ConfigError`. Only
`load_config` touches the file system. Every error names the file, the dotted key and what
was expected, because a user reading a failed 64-node submission has one line to
understand it from.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import re
import stat
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from jaxwarm.core.decode import UNREAD, Bound, CommandLine, NumbersAsText, convert
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.yamlio import config_text, load_yaml, parse_yaml, read_config, read_config_bytes

PositiveInt = Annotated[int, Bound(0, inclusive=False)]
NonNegativeInt = Annotated[int, Bound(0)]
PositiveFloat = Annotated[float, Bound(0, inclusive=False)]
NonNegativeFloat = Annotated[float, Bound(0)]
# Every duration and size of the config has a maximum, so that a typo (`1e16`) is refused
# here in one line instead of breaking a job later. A week is longer than any one wait,
# timeout or budget of a job, and within what every reader takes (a barrier's milliseconds
# fit an int32); a pebibyte is more than any cache dir.
MAX_DURATION_S = 7 * 24 * 3600
MAX_SIZE_BYTES = 1 << 50
Seconds = Annotated[float, Bound(0, high=MAX_DURATION_S, high_means="a week")]
PositiveSeconds = Annotated[float, Bound(0, inclusive=False, high=MAX_DURATION_S,
                                         high_means="a week")]
Bytes = Annotated[int, Bound(0, high=MAX_SIZE_BYTES, high_means="1 PiB")]
# An environment variable's or an sbatch option's value, which YAML may read as a number.
EnvText = Annotated[str, NumbersAsText()]
# sbatch's --signal=<sig>@<time>: SLURM takes at most 65535 s.
SIGNAL_LEAD_MAX_S = 65535


@dataclass(frozen=True)
class RunConfig:
    name: str
    out_dir: str = "runs"


@dataclass(frozen=True)
class CacheConfig:
    dir: str = "jax-cache"
    min_compile_time_secs: Seconds = 1.0
    min_entry_size_bytes: Bytes = 0
    # JAX's jax_persistent_cache_enable_xla_caches: "none", "all" or a comma list.
    xla_caches: str = "xla_gpu_per_fusion_autotune_cache_dir"
    # -1 (unbounded) or a positive number of bytes up to MAX_SIZE_BYTES (_validate).
    max_size: int = -1
    # A group that shares the dir on purpose: then another member may own it (see security).
    trusted_group: str | None = None
    # When the trainer changes the cache settings after jaxwarm set them: put jaxwarm's back
    # before each lookup (true), or follow the trainer (false). Either way it is reported.
    enforce: bool = True
    # A node-local dir the training job's JAX reads its entries from: one process per node
    # copies the run's entries there from `dir` at job start (jaxwarm/job/stage.py).
    # `$VAR`s in it are expanded on each node (e.g. $TMPDIR).
    stage: str | None = None
    # How long a node's other processes wait for that copy before they read `dir` instead.
    stage_wait_s: PositiveSeconds = 600.0
    # "auto": a training job loads the executables its run's prewarm recorded on background
    # threads from the time it has its backend, each once a core is idle, so that the
    # trainer never waits for a core (jaxwarm/job/prefetch.py); true: each at once, whether
    # a core is idle or not; false (YAML's off): JAX loads each one at the trainer's own
    # call, as without jaxwarm.
    prefetch: bool | str = "auto"
    # At most this many bytes of serialized executables are held by the prefetch at once.
    prefetch_max_size: Bytes = 4 << 30


@dataclass(frozen=True)
class PgleConfig:
    """JAX's automatic profile-guided latency estimation (PGLE, for GPU): each jitted
    function is compiled, run `profiling_runs` times under the profiler, then compiled again
    with the profile, and that second compile is stored under a key of its own. A process
    whose cache holds it loads it at its first call (no first compile, no profiling).
    Either option changes the key of the first compile too (JAX compiles it without command
    buffers), so every job of the run (prewarm, verify, train) gets the same ones."""

    enabled: bool = False  # jax_enable_pgle
    profiling_runs: PositiveInt = 3  # jax_pgle_profiling_runs
    # Load a stored profile-guided executable even with PGLE off, and warn where a function
    # has only its first compile stored (jax_compilation_cache_expect_pgle).
    expect: bool = False


@dataclass(frozen=True)
class TopologyConfig:
    nodes: PositiveInt = 1
    processes_per_node: PositiveInt = 1
    devices_per_process: PositiveInt = 1
    platform: Literal["cpu", "gpu"] = "cpu"

    @property
    def num_processes(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def num_devices(self) -> int:
        return self.num_processes * self.devices_per_process


@dataclass(frozen=True)
class PrewarmConfig:
    # "run": the prewarm job runs on the run's own layout (nodes x processes). "mock" (GPU):
    # one process on one node compiles for the run's layout through JAX's mock GPU topology
    # (jaxwarm/core/gputarget.py), so a 64-GPU step is prewarmed on one node.
    layout: Literal["run", "mock"] = "run"


@dataclass(frozen=True)
class MeshConfig:
    # Axis name -> size, in mesh order (YAML mappings keep their order). None: the step
    # factory builds the trainer's own mesh and returns it (`StepBundle.mesh`), as a trainer
    # that derives its mesh from its own parallelism settings (MaxText) must.
    axes: dict[str, PositiveInt] | None = None
    # "auto" builds jax.sharding.Mesh; "explicit" uses jax.make_mesh's Explicit axes.
    # The two lower to different programs, so prewarm and run must agree.
    axis_types: Literal["auto", "explicit"] = "auto"


@dataclass(frozen=True)
class StepConfig:
    factory: str
    args: dict[str, Any] = field(default_factory=dict)
    # Files the step depends on that the prewarm cannot see its factory read (read by native
    # code, or looked for and absent): `--prewarm auto` signs them at each launch
    # (jaxwarm/submit/fingerprint.py). Relative to the directory the launch runs in.
    inputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EntrypointConfig:
    """The training entrypoint: exactly one of a command, a module (`python -m`) or a
    function, each run with jaxwarm's init recorder installed first
    (jaxwarm/submit/jobs.py)."""

    command: Annotated[list[str], CommandLine()] | None = None
    module: str | None = None
    function: str | None = None
    args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SlurmConfig:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str = "01:00:00"
    gpus_per_node: PositiveInt | None = None
    cpus_per_task: PositiveInt = 1
    mem: str | None = None
    signal: Literal["USR1", "USR2", "TERM", "INT"] = "USR1"
    signal_lead_s: Annotated[int, Bound(0, high=SIGNAL_LEAD_MAX_S,
                                        high_means="what sbatch --signal takes")] = 300
    max_requeues: NonNegativeInt = 3
    extra: dict[str, EnvText] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    steps: PositiveInt = 10
    checkpoint_every: NonNegativeInt = 0
    seed: NonNegativeInt = 0
    log_every: PositiveInt = 1
    # Seconds the reference trainer sleeps after dispatching each step, as a GPU job's host
    # waits on its device: on CPU a job meant to run for minutes until a signal (a time-limit
    # requeue, a preemption) then leaves the cores to others instead of spinning on them.
    step_pause_s: Seconds = 0.0
    # Stop a training job whose first step has not come this long after it started (local
    # runner; the job's process 0 report marks the first step). None: wait as long as it takes.
    first_step_timeout_s: PositiveSeconds | None = None


@dataclass(frozen=True)
class RanksConfig:
    """How the processes of a job meet before each multi-process program first runs, and
    agree on its cache key before they look it up (jaxwarm/job/ranks.py)."""

    # How long a rank waits for the others at a meeting before it stops the job with one
    # line naming the late ranks. None: 3x the longest compile the manifest recorded for the
    # run's layout, at least 300 s.
    meet_timeout_s: PositiveSeconds | None = None
    # How long a rank waits at the jax.distributed join for the others to come (they start
    # at different times: a node's start, imports, staging) before it stops the job with one
    # line naming the ranks that never came (jaxwarm/job/start/distributed.py). JAX's own
    # default.
    join_timeout_s: PositiveSeconds = 300.0
    # Rank agreement before each compile: "auto" (on for GPU jobs), true or false.
    agree: Literal[True, False, "auto"] = "auto"


@dataclass(frozen=True)
class ReportConfig:
    # Process 0 of the training job logs MLPerf's init_start / init_stop / run_start
    # (jaxwarm/job/record/mlperf.py; needs the `mlperf` extra).
    mlperf: bool = False


@dataclass(frozen=True)
class Config:
    run: RunConfig
    step: StepConfig
    mesh: MeshConfig = field(default_factory=MeshConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    prewarm: PrewarmConfig = field(default_factory=PrewarmConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    pgle: PgleConfig = field(default_factory=PgleConfig)
    entrypoint: EntrypointConfig = field(default_factory=EntrypointConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ranks: RanksConfig = field(default_factory=RanksConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    env: dict[str, EnvText] = field(default_factory=dict)
    xla_flags: list[str] = field(default_factory=list)
    jax: dict[str, str | int | float | bool] = field(default_factory=dict)
    init_budget_s: PositiveSeconds = 1800.0
    # How long a job's processes get to exit after SIGTERM/SIGINT before SIGKILL (local runner).
    stop_grace_s: PositiveSeconds = 30.0
    # Where the config came from; used in error messages, never written back.
    source: str = field(default="<config>", compare=False, metadata={UNREAD: True})

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        return data


# prewarm.layout: on the run's own layout, or through a mock of it on one node (GPU).
MOCK_LAYOUT = "mock"
# What a mocked GPU compile needs off (it can hang with sharded autotuning, openxla/xla
# #28959, as MaxText found); every XLA flag is in the key, so every job of the run carries it.
SHARD_AUTOTUNING = "--xla_gpu_shard_autotuning"
MOCK_XLA_FLAGS = (f"{SHARD_AUTOTUNING}=false",)
# URL schemes a cache dir may have: JAX reaches them through etils.epath (the remote extra).
REMOTE_SCHEMES = ("s3", "gs")
# JAX options the cache and pgle sections set (see jaxwarm.core.environment.jax_options), by
# config key.
OWNED_OPTIONS = {"jax_compilation_cache_dir": "cache.dir",
                 "jax_persistent_cache_min_compile_time_secs": "cache.min_compile_time_secs",
                 "jax_persistent_cache_min_entry_size_bytes": "cache.min_entry_size_bytes",
                 "jax_persistent_cache_enable_xla_caches": "cache.xla_caches",
                 "jax_compilation_cache_max_size": "cache.max_size",
                 "jax_enable_pgle": "pgle.enabled",
                 "jax_pgle_profiling_runs": "pgle.profiling_runs",
                 "jax_compilation_cache_expect_pgle": "pgle.expect"}
# Patterns are matched with fullmatch: `$` would accept a trailing newline.
_MODULE_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_SLURM_TIME = re.compile(r"(\d+-)?\d{1,2}(:\d{2}){0,2}")
_JAX_OPTION = re.compile(r"jax_[a-z0-9_]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_OPTION = re.compile(r"[a-z][a-z0-9_-]*")
# Variables the job environment owns: a user value would make prewarm and run disagree. Not
# JAX_LOCAL_DEVICE_IDS: which of a node's GPUs a process uses is not in the key
# (jaxwarm.job.start.distributed sets it from the layout unless the config does).
LOCAL_DEVICE_IDS = "JAX_LOCAL_DEVICE_IDS"
_MANAGED_ENV = re.compile(rf"JAX_(?!{LOCAL_DEVICE_IDS[4:]}$).*|XLA_FLAGS|JAXWARM_.*")
_DEVICE_IDS = re.compile(r"\d+(,\d+)*")


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config file, apply `KEY.SUB=VALUE` overrides, expand the variables of its
    paths from this process's environment, and validate it."""
    source = str(path)
    return parse_config(parse_yaml(read_config(path), source), source, overrides, os.environ)


# A pinned config's first line says who reads it and the file it was pinned from: the file
# the user edits, which the jobs name in their errors (`pinned_text`, `load_pinned`).
PINNED_BY = "# Pinned by jaxwarm ("
PINNED_FROM = ") from: "


def pinned_text(config: Config, readers: str) -> str:
    """The text of `config` pinned into a run dir, for the jobs that read it (`readers`)."""
    return f"{PINNED_BY}{readers}{PINNED_FROM}{config.source}\n" + \
        yaml.safe_dump(config.to_dict(), sort_keys=False)


def load_pinned(path: str | Path, digest: str | None = None) -> Config:
    """A run's pinned config as a job reads it, naming in its errors the user's file it was
    pinned from and, in brackets, the copy the job read (`s2s.yaml [runs/s2s/config.yaml]`);
    a copy that does not say (pinned by an earlier jaxwarm, or by hand) names itself.

    It names the code every job imports, so it is read only as the launch left it: a
    regular file, not through a link, owned by this user and writable by nobody else, and,
    when the launch gave its sha256 (`digest`, `config_digest` of what it wrote), that very
    file. Anything else is one line."""
    data, info = read_config_bytes(path, follow=False)
    mode = stat.S_IMODE(info.st_mode)
    problem = None
    if info.st_uid != os.geteuid():
        problem = f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    elif mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"is writable by other users (mode {mode:04o})"
    elif digest is not None and config_digest(data) != digest:
        problem = (f"is not the file the launch pinned (sha256 {config_digest(data)[:16]}..., "
                   f"pinned {digest[:16]}...): it was changed since")
    if problem:
        raise ConfigError(f"{path}: the run's pinned config {problem}; refusing to run a "
                          f"job from it (launch again to pin it anew)")
    text = config_text(data, str(path))
    first = text.partition("\n")[0]
    origin = first.partition(PINNED_FROM)[2] if first.startswith(PINNED_BY) else ""
    source = f"{origin} [{path}]" if origin else str(path)
    return parse_config(parse_yaml(text, source), source)


def config_digest(data: bytes) -> str:
    """The sha256 a pinned config is checked against (`load_pinned`)."""
    return hashlib.sha256(data).hexdigest()


def parse_config(raw: dict[str, Any], source: str = "<config>",
                 overrides: typing.Sequence[str] = (),
                 environ: Mapping[str, str] | None = None) -> Config:
    """With `environ`, `$NAME` / `${NAME}` in `run.out_dir` and `cache.dir` are expanded
    from it (`expand_paths`; a pinned config, expanded at launch, is read without)."""
    raw = dict(raw)
    for override in overrides:
        apply_override(raw, override, source)
    refuse_unencodable(raw, "", source)
    config = convert(Config, raw, "", source)
    config = dataclasses.replace(config, source=source)
    if environ is not None:
        config = expand_paths(config, environ)
    _validate(config)
    return config


# `$NAME` or `${NAME}` in a path: expanded from the environment (`cache.stage` on each node,
# `run.out_dir` and `cache.dir` at launch).
_VARIABLE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def expand_variables(text: str,
                     environ: Mapping[str, str] = os.environ) -> tuple[str, list[str]]:
    """`text` with each `$NAME` / `${NAME}` replaced by its value, and the names that are
    unset or empty, which are left as written. An empty value counts as unset: expanded,
    `$TMPDIR/x` with TMPDIR set to '' would be `/x`, a dir in the filesystem root."""
    missing: list[str] = []

    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        if environ.get(name):
            return environ[name]
        missing.append(name)
        return match[0]

    return _VARIABLE.sub(value, text), missing


def expand_paths(config: Config, environ: Mapping[str, str]) -> Config:
    """`run.out_dir` and `cache.dir` with their variables expanded, as `cache.stage` is (once,
    where the config is loaded: the pinned config holds the result); one unset or empty is
    one line, never a dir named `$HOME` made in the working directory."""
    paths = {}
    for key, text in (("run.out_dir", config.run.out_dir), ("cache.dir", config.cache.dir)):
        paths[key], missing = expand_variables(text, environ)
        if missing:
            raise ConfigError(f"{config.source}: {key}: {text!r} names ${missing[0]}, which is "
                              f"not set (or empty) here; set it, or write the path out")
    return dataclasses.replace(
        config, run=dataclasses.replace(config.run, out_dir=paths["run.out_dir"]),
        cache=dataclasses.replace(config.cache, dir=paths["cache.dir"]))


def refuse_unencodable(value: Any, key: str, source: str) -> None:
    """Every string of the config (keys and values, however deep, overrides included) must be
    text UTF-8 can write: a lone surrogate (`"\\ud800"` in YAML, or bytes of another encoding
    in a command-line override) would pass every check and fail where the pinned config, a
    job script or the environment is written."""
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for name, item in items:
        where = f"{key}[{name}]" if isinstance(value, list) else \
            f"{key}.{name}" if key else str(name)
        for text in (name, item):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise ConfigError(f"{source}: {ascii(where)[1:-1]}: expected text, got "
                                      f"{ascii(text)}: {exc.reason} (a lone surrogate is no "
                                      f"character)") from None
        refuse_unencodable(item, where, source)


def add_overrides_argument(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """The `KEY.SUB=VALUE ...` overrides of a command that reads a config. The empty
    default makes them optional: without it argparse names them as required beside a
    missing config (`the following arguments are required: config, KEY.SUB=VALUE`)."""
    parser.add_argument("overrides", nargs="*", default=[], metavar="KEY.SUB=VALUE",
                        help=help)


def apply_override(raw: dict[str, Any], override: str, source: str) -> None:
    """Set one `KEY.SUB=VALUE` in the raw dict; VALUE is read as YAML (so 3 is an int)."""
    key, sep, value = override.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{source}: override {override!r}: expected KEY.SUB=VALUE")
    parts = key.split(".")
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{source}: override {override!r}: "
                              f"'{'.'.join(parts[:depth + 1])}' is not a section")
        else:
            child = node[part] = dict(child)
        node = child
    try:
        node[parts[-1]] = load_yaml(value, f"{source}: override {key}") if value else ""
    except ConfigError:
        node[parts[-1]] = value


# How a check says what is wrong: raises ConfigError naming the config file and the key.
Fail = typing.Callable[[str, str], typing.NoReturn]


def _validate(config: Config) -> None:
    """Checks that span fields, or that a type and a bound alone cannot express: one per
    section, in the order a config reads; the first problem found is the one said."""
    src = config.source

    def fail(key: str, problem: str) -> typing.NoReturn:
        raise ConfigError(f"{src}: {key}: {problem}")

    for check in (_validate_prewarm_layout, _validate_run, _validate_cache, _validate_mesh,
                  _validate_step, _validate_entrypoint, _validate_flags, _validate_slurm,
                  _validate_env):
        check(config, fail)


def _validate_run(config: Config, fail: Fail) -> None:
    """`run.name` names the run dir under `run.out_dir`: one path component."""
    if config.run.name in ("", ".", "..") or "/" in config.run.name:
        fail("run.name", f"expected one path component (not '.' or '..', no '/'), "
                         f"got {config.run.name!r}")


def _validate_cache(config: Config, fail: Fail) -> None:
    """The cache dir (a path or a remote URL), its node-local staging and its size cap."""
    cache = config.cache
    if not cache.dir or os.path.normpath(cache.dir) == ".":
        got = repr(cache.dir) if cache.dir else "an empty string"
        fail("cache.dir", f"expected a directory path, got {got} (which would mean the "
                          f"working directory)")
    scheme, sep, _ = cache.dir.partition("://")
    if sep and scheme not in REMOTE_SCHEMES:
        fail("cache.dir", f"expected a path or a {' or '.join(s + '://' for s in REMOTE_SCHEMES)}"
                          f" URL, got a {scheme}:// URL")
    # `bool | str`: the type admits any string; `auto` is the one meant.
    if cache.prefetch not in (True, False, "auto"):
        fail("cache.prefetch", f"expected auto, true or false (off), got {cache.prefetch!r}")
    stage = cache.stage
    # `$VARIABLE/...`: the node expands it (e.g. $TMPDIR), so it is not absolute here.
    if stage is not None and not (os.path.isabs(stage) or stage.startswith("$")):
        fail("cache.stage", f"expected an absolute path on each node's own disk (or one "
                            f"starting with a $VARIABLE the node expands), got {stage!r}")
    if stage is not None and sep:
        fail("cache.stage", f"staging copies from a local or mounted cache dir; cache.dir is "
                            f"a {scheme}:// URL")
    if stage is not None and _within(stage, cache.dir):
        fail("cache.stage", f"{stage} is inside cache.dir {cache.dir} (or contains "
                            f"it); the node-local copy needs a dir of its own")
    # 0 is refused too: JAX turns its cache off at 0 (its "no limit" is -1).
    if cache.max_size < -1 or cache.max_size == 0 or cache.max_size > MAX_SIZE_BYTES:
        fail("cache.max_size", f"expected -1 (unbounded) or a positive number of bytes, at "
                               f"most {MAX_SIZE_BYTES} (1 PiB), got {cache.max_size}")


def _validate_mesh(config: Config, fail: Fail) -> None:
    """`mesh.axes`, when given, spans every device of the topology."""
    axes, topo = config.mesh.axes, config.topology
    if axes is not None and not axes:
        fail("mesh.axes", "expected at least one axis (or no mesh.axes, when the step "
                          "factory builds the mesh)")
    if axes and (mesh_size := math.prod(axes.values())) != topo.num_devices:
        shape = " x ".join(f"{a}={s}" for a, s in axes.items())
        fail("mesh.axes", f"{shape} is {mesh_size} devices, but topology has "
                          f"{topo.num_devices} (nodes {topo.nodes} x processes_per_node "
                          f"{topo.processes_per_node} x devices_per_process "
                          f"{topo.devices_per_process})")


def _validate_step(config: Config, fail: Fail) -> None:
    if not _MODULE_FUNCTION.fullmatch(config.step.factory):
        fail("step.factory", f"expected 'module:function', got {config.step.factory!r}")


def _validate_entrypoint(config: Config, fail: Fail) -> None:
    """Exactly one way to start the trainer, each in its own form."""
    entry = config.entrypoint
    given = [entry.command, entry.module, entry.function]
    if sum(value is not None for value in given) != 1:
        fail("entrypoint", "expected exactly one of 'entrypoint.command' (a command), "
                           "'entrypoint.module' (run as python -m) or 'entrypoint.function' "
                           "('module:function')")
    if entry.command is not None and not entry.command:
        fail("entrypoint.command", "expected a non-empty list")
    if entry.module is not None and not _MODULE.fullmatch(entry.module):
        fail("entrypoint.module", f"expected a dotted module name like 'pkg.train', "
                                  f"got {entry.module!r}")
    if entry.function is not None and not _MODULE_FUNCTION.fullmatch(entry.function):
        fail("entrypoint.function", f"expected 'module:function', got {entry.function!r}")


def _validate_flags(config: Config, fail: Fail) -> None:
    """`xla_flags` and the `jax` options: well formed, and none that a section owns."""
    for i, flag in enumerate(config.xla_flags):
        # One flag per item: a space would pass two through XLA_FLAGS unchecked.
        if not flag.startswith("--xla_") or " " in flag:
            fail(f"xla_flags[{i}]", f"expected one flag like '--xla_...', got {flag!r}")
    for option in config.jax:
        if not _JAX_OPTION.fullmatch(option):
            fail(f"jax.{option}", "expected a JAX option name like "
                                  "'jax_default_matmul_precision'")
        if option in OWNED_OPTIONS:
            key = OWNED_OPTIONS[option]
            fail(f"jax.{option}", f"the {key.split('.')[0]} section owns this option (every "
                                  f"job gets it from there, and it is checked before any job "
                                  f"runs); set {key} instead")


def _validate_slurm(config: Config, fail: Fail) -> None:
    """What goes into `#SBATCH` lines as written: a time sbatch reads, option names only."""
    if not _SLURM_TIME.fullmatch(config.slurm.time):
        fail("slurm.time", f"expected [D-]HH:MM:SS, got {config.slurm.time!r}")
    for name in config.slurm.extra:
        if not _SBATCH_OPTION.fullmatch(name):
            fail(f"slurm.extra.{name}", "expected an sbatch option name like 'exclusive' "
                                        "or 'gres'")


def _validate_env(config: Config, fail: Fail) -> None:
    """The `env` section: variable names a shell can export, none that jaxwarm sets itself."""
    for name in config.env:
        if not _ENV_NAME.fullmatch(name):
            fail(f"env.{name}", "expected a variable name of letters, digits and '_' "
                                "(not starting with a digit)")
        if _MANAGED_ENV.fullmatch(name):
            fail(f"env.{name}", "jaxwarm sets this variable itself, the same for every job; "
                                "use the cache, jax or xla_flags section instead")
    ids = config.env.get(LOCAL_DEVICE_IDS)
    if ids is not None and not _DEVICE_IDS.fullmatch(ids):
        fail(f"env.{LOCAL_DEVICE_IDS}", f"expected GPU indices separated by commas, e.g. "
                                        f"0,1, got {ids!r}")


def _validate_prewarm_layout(config: Config, fail: Fail) -> None:
    """`prewarm.layout: mock` needs what JAX's mock topology needs: a GPU target and a run of
    several processes; and it owns the sharded-autotuning flag every job carries."""
    layout, topo = config.prewarm.layout, config.topology
    if layout != MOCK_LAYOUT:
        return
    if topo.platform != "gpu":
        fail("prewarm.layout", f"mock needs topology.platform: gpu (JAX mocks only GPU "
                               f"topologies, jax_mock_gpu_topology), got {topo.platform!r}")
    if topo.num_processes == 1:
        fail("prewarm.layout", "mock prewarms a layout of several processes on one; this run "
                               "has 1 process (topology.nodes x processes_per_node): use "
                               "prewarm.layout: run")
    for i, flag in enumerate(config.xla_flags):
        if flag.partition("=")[0] == SHARD_AUTOTUNING and flag not in MOCK_XLA_FLAGS:
            fail(f"xla_flags[{i}]", f"prewarm.layout: mock gives every job "
                                    f"{MOCK_XLA_FLAGS[0]} (a mocked compile can hang with "
                                    f"sharded autotuning, openxla/xla #28959), got {flag!r}")


def _within(one: str, other: str) -> bool:
    """Whether either path (as written) is the other or inside it."""
    one, other = os.path.normpath(one), os.path.normpath(other)
    return one == other or one.startswith(other + os.sep) or other.startswith(one + os.sep)

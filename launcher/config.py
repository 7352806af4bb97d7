"""The YAML config as typed dataclasses, with one-line errors for every way it can be wrong.

Parsing is pure: `parse_config(raw, source)` turns a dict into a `Config` or raises
`ConfigError`. Only `load_config` touches the file system. Every error names the file,
the dotted key and what was expected, because a user reading a failed 64-node submission
has one line to understand it from.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config problem, already phrased as the one line the user sees."""


@dataclass(frozen=True)
class RunConfig:
    name: str
    out_dir: str = "runs"


@dataclass(frozen=True)
class CacheConfig:
    dir: str = "jax-cache"
    min_compile_time_secs: float = 1.0
    min_entry_size_bytes: int = 0
    # JAX's jax_persistent_cache_enable_xla_caches: "none", "all" or a comma list.
    xla_caches: str = "xla_gpu_per_fusion_autotune_cache_dir"
    max_size: int = -1
    # A group that shares the dir on purpose: then another member may own it (see security).
    trusted_group: str | None = None
    # When the trainer changes the cache settings after jaxwarm set them: put jaxwarm's back
    # before each lookup (true), or follow the trainer (false). Either way it is reported.
    enforce: bool = True


@dataclass(frozen=True)
class TopologyConfig:
    nodes: int = 1
    processes_per_node: int = 1
    devices_per_process: int = 1
    platform: str = "cpu"

    @property
    def num_processes(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def num_devices(self) -> int:
        return self.num_processes * self.devices_per_process


@dataclass(frozen=True)
class MeshConfig:
    # Axis name -> size, in mesh order (YAML mappings keep their order).
    axes: dict[str, int]
    # "auto" builds jax.sharding.Mesh; "explicit" uses jax.make_mesh's Explicit axes.
    # The two lower to different programs, so prewarm and run must agree.
    axis_types: str = "auto"


@dataclass(frozen=True)
class StepConfig:
    factory: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EntrypointConfig:
    command: list[str] | None = None
    function: str | None = None
    args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SlurmConfig:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str = "01:00:00"
    gpus_per_node: int | None = None
    cpus_per_task: int = 1
    mem: str | None = None
    signal: str = "USR1"
    signal_lead_s: int = 300
    max_requeues: int = 3
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 10
    checkpoint_every: int = 0
    seed: int = 0
    log_every: int = 1


@dataclass(frozen=True)
class Config:
    run: RunConfig
    step: StepConfig
    mesh: MeshConfig
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    entrypoint: EntrypointConfig = field(default_factory=EntrypointConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    env: dict[str, str] = field(default_factory=dict)
    xla_flags: list[str] = field(default_factory=list)
    jax: dict[str, str | int | float | bool] = field(default_factory=dict)
    init_budget_s: float = 1800.0
    # Where the config came from; used in error messages, never written back.
    source: str = field(default="<config>", compare=False)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        return data


_PLATFORMS = ("cpu", "gpu")
_AXIS_TYPES = ("auto", "explicit")
_MODULE_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_SLURM_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")
_JAX_OPTION = re.compile(r"^jax_[a-z0-9_]+$")
_SIGNALS = ("USR1", "USR2", "TERM", "INT")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SBATCH_OPTION = re.compile(r"^[a-z][a-z0-9_-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Variables the job environment owns: a user value would make prewarm and run disagree.
_MANAGED_ENV = re.compile(r"^(JAX_.*|XLA_FLAGS|JAXWARM_.*)$")


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config file, apply `KEY.SUB=VALUE` overrides, and validate it."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config: {exc.strerror}") from None
    return parse_config(parse_yaml(text, source), source, overrides)


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, "
                          f"got {type(raw).__name__}")
    return raw


def parse_config(raw: dict[str, Any], source: str = "<config>",
                 overrides: typing.Sequence[str] = ()) -> Config:
    raw = dict(raw)
    for override in overrides:
        apply_override(raw, override, source)
    config = _convert(Config, raw, "", source)
    config = dataclasses.replace(config, source=source)
    _validate(config)
    return config


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
        node[parts[-1]] = yaml.safe_load(value) if value else ""
    except yaml.YAMLError:
        node[parts[-1]] = value


def _convert(tp: Any, value: Any, key: str, source: str) -> Any:
    """Convert a YAML value to the annotated type, or raise a ConfigError naming `key`."""
    where = key or "<top level>"
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {where}: expected a mapping, got {_describe(value)}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp) if f.name != "source"}
        kwargs = {}
        for name, item in value.items():
            full = f"{key}.{name}" if key else str(name)
            if name not in fields:
                close = difflib.get_close_matches(str(name), list(fields), n=1)
                hint = f" (did you mean '{_join(key, close[0])}'?)" if close else \
                    f" (valid keys: {', '.join(fields)})"
                raise ConfigError(f"{source}: unknown key '{full}'{hint}")
            kwargs[name] = _convert(hints[name], item, full, source)
        for name, f in fields.items():
            if name not in kwargs and f.default is dataclasses.MISSING \
                    and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{source}: missing required key '{_join(key, name)}'")
        return tp(**kwargs)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        errors = []
        for member in members:
            try:
                return _convert(member, value, key, source)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0] if len(members) == 1 else ConfigError(
            f"{source}: {where}: expected one of {', '.join(_name(m) for m in members)}, "
            f"got {_describe(value)}")
    if origin is list:
        if isinstance(value, str) and args[0] is str and key.endswith("command"):
            raise ConfigError(f"{source}: {where}: expected a list of arguments "
                              f"(e.g. [jaxwarm-train, --flag]), got a string; "
                              f"no shell is used to split it")
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {where}: expected a list, got {_describe(value)}")
        return [_convert(args[0], item, f"{key}[{i}]", source) for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {where}: expected a mapping, got {_describe(value)}")
        return {str(k): _convert(args[1], v, f"{key}.{k}", source) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                (key.startswith("env.") or key.startswith("slurm.extra.")):
            return str(value)
    raise ConfigError(f"{source}: {where}: expected {_name(tp)}, got {_describe(value)}")


def _validate(config: Config) -> None:
    """Checks that span fields, or that a type alone cannot express."""
    src = config.source
    topo = config.topology
    for name in ("nodes", "processes_per_node", "devices_per_process"):
        if getattr(topo, name) < 1:
            raise ConfigError(f"{src}: topology.{name}: expected a positive integer, "
                              f"got {getattr(topo, name)}")
    if topo.platform not in _PLATFORMS:
        raise ConfigError(f"{src}: topology.platform: expected one of "
                          f"{', '.join(_PLATFORMS)}, got {topo.platform!r}")
    if not config.run.name or "/" in config.run.name:
        raise ConfigError(f"{src}: run.name: expected a non-empty name without '/', "
                          f"got {config.run.name!r}")
    if not config.mesh.axes:
        raise ConfigError(f"{src}: mesh.axes: expected at least one axis")
    for axis, size in config.mesh.axes.items():
        if size < 1:
            raise ConfigError(f"{src}: mesh.axes.{axis}: expected a positive size, got {size}")
    mesh_size = 1
    for size in config.mesh.axes.values():
        mesh_size *= size
    if mesh_size != topo.num_devices:
        shape = " x ".join(f"{a}={s}" for a, s in config.mesh.axes.items())
        raise ConfigError(
            f"{src}: mesh.axes: {shape} is {mesh_size} devices, but topology has "
            f"{topo.num_devices} (nodes {topo.nodes} x processes_per_node "
            f"{topo.processes_per_node} x devices_per_process {topo.devices_per_process})")
    if config.mesh.axis_types not in _AXIS_TYPES:
        raise ConfigError(f"{src}: mesh.axis_types: expected one of {', '.join(_AXIS_TYPES)}, "
                          f"got {config.mesh.axis_types!r}")
    if not _MODULE_FUNCTION.match(config.step.factory):
        raise ConfigError(f"{src}: step.factory: expected 'module:function', "
                          f"got {config.step.factory!r}")
    entry = config.entrypoint
    if (entry.command is None) == (entry.function is None):
        raise ConfigError(f"{src}: entrypoint: expected exactly one of 'entrypoint.command' "
                          f"(a console command) or 'entrypoint.function' ('module:function')")
    if entry.command is not None and not entry.command:
        raise ConfigError(f"{src}: entrypoint.command: expected a non-empty list")
    if entry.function is not None and not _MODULE_FUNCTION.match(entry.function):
        raise ConfigError(f"{src}: entrypoint.function: expected 'module:function', "
                          f"got {entry.function!r}")
    if config.cache.min_compile_time_secs < 0:
        raise ConfigError(f"{src}: cache.min_compile_time_secs: expected >= 0, "
                          f"got {config.cache.min_compile_time_secs}")
    if config.cache.max_size < -1 or config.cache.max_size == 0:
        raise ConfigError(f"{src}: cache.max_size: expected -1 (unbounded) or a positive "
                          f"number of bytes, got {config.cache.max_size}")
    for i, flag in enumerate(config.xla_flags):
        if not flag.startswith("--xla_"):
            raise ConfigError(f"{src}: xla_flags[{i}]: expected a flag like '--xla_...', "
                              f"got {flag!r}")
    for option in config.jax:
        if not _JAX_OPTION.match(option):
            raise ConfigError(f"{src}: jax.{option}: expected a JAX option name like "
                              f"'jax_default_matmul_precision'")
    if not _SLURM_TIME.match(config.slurm.time):
        raise ConfigError(f"{src}: slurm.time: expected [D-]HH:MM:SS, got {config.slurm.time!r}")
    if config.slurm.signal not in _SIGNALS:
        raise ConfigError(f"{src}: slurm.signal: expected one of {', '.join(_SIGNALS)}, "
                          f"got {config.slurm.signal!r}")
    if config.train.steps < 1:
        raise ConfigError(f"{src}: train.steps: expected a positive integer, "
                          f"got {config.train.steps}")
    if config.init_budget_s <= 0:
        raise ConfigError(f"{src}: init_budget_s: expected a positive number of seconds, "
                          f"got {config.init_budget_s}")
    _check_script_safe(config)
    for name in config.env:
        if _MANAGED_ENV.match(name):
            raise ConfigError(f"{src}: env.{name}: jaxwarm sets this variable itself, the same "
                              f"for every job; use the cache, jax or xla_flags section instead")


def _check_script_safe(config: Config) -> None:
    """What ends up in a job script: env names are exported unquoted, and a newline in an
    #SBATCH value would start a new (executed) script line. Values are shell-quoted."""
    src = config.source
    for name in config.env:
        if not _ENV_NAME.match(name):
            raise ConfigError(f"{src}: env.{name}: expected a variable name of letters, digits "
                              f"and '_' (not starting with a digit)")
    for name in config.slurm.extra:
        if not _SBATCH_OPTION.match(name):
            raise ConfigError(f"{src}: slurm.extra.{name}: expected an sbatch option name "
                              f"like 'exclusive' or 'gres'")
    fields = {"run.name": config.run.name,
              **{f"slurm.{f.name}": getattr(config.slurm, f.name)
                 for f in dataclasses.fields(config.slurm)
                 if isinstance(getattr(config.slurm, f.name), str)},
              **{f"slurm.extra.{k}": v for k, v in config.slurm.extra.items()}}
    for key, value in fields.items():
        if _CONTROL.search(value):
            raise ConfigError(f"{src}: {key}: expected a single line without control "
                              f"characters, got {value!r}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if tp in names:
        return names[tp]
    if typing.get_origin(tp) is list:
        return "a list"
    if typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"

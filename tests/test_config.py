"""Every class of config error: one line naming the file and the key, exit 2, nothing run."""

from __future__ import annotations

import dataclasses
import json.tool
import os
import shutil
import typing
from importlib.metadata import distributions
from pathlib import Path

import pytest
import yaml

from jaxwarm.core import yamlio
from jaxwarm.core.config import (
    MAX_DURATION_S,
    MAX_SIZE_BYTES,
    SIGNAL_LEAD_MAX_S,
    Config,
    apply_override,
    config_digest,
    load_config,
    parse_config,
)
from jaxwarm.core.entryargv import trainer_argv
from jaxwarm.core.environment import PINNED_DIGEST
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.records import Fingerprint, differences
from jaxwarm.core.rundir import logs_dir
from jaxwarm.core.yamlio import YAML_MAX_DEPTH
from jaxwarm.job.start.pinned import config_from_env
from jaxwarm.submit.fingerprint import fingerprint, step_sources
from jaxwarm.submit.jobs import check_modules, job_import_path
from jaxwarm.submit.prepare import pin_config
from tests.conftest import DEMO, REPO, Cli
from tests.hostile import assert_refused, snapshot


def demo_raw() -> dict:
    return yaml.safe_load(DEMO.read_text())


def write(tmp_path: Path, raw: dict | str | bytes) -> Path:
    path = tmp_path / "bad.yaml"
    if isinstance(raw, bytes):
        path.write_bytes(raw)
    else:
        path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False))
    return path


def mutate(raw: dict, dotted: str, value) -> dict:
    apply_override(raw, f"{dotted}={yaml.safe_dump(value, default_flow_style=True).strip()}",
                   "test")
    return raw


CASES = {
    "yaml syntax": ("run:\n  name: demo\n  out_dir: [unclosed\nstep: {}\n",
                    ["bad.yaml:", "YAML syntax error"]),
    "unknown key": (mutate(demo_raw(), "cache.min_compile_time", 1),
                    ["unknown key 'cache.min_compile_time'",
                     "did you mean 'cache.min_compile_time_secs'"]),
    "wrong type": (mutate(demo_raw(), "topology.nodes", "two"),
                   ["topology.nodes: expected an integer, got string 'two'"]),
    "missing required": ({k: v for k, v in demo_raw().items() if k != "step"},
                         ["missing required key 'step'"]),
    "missing nested": (mutate(demo_raw(), "step", {"args": {}}),
                       ["missing required key 'step.factory'"]),
    "mesh size": (mutate(demo_raw(), "mesh.axes", {"data": 3, "fsdp": 4}),
                  ["mesh.axes: data=3 x fsdp=4 is 12 devices, but topology has 8"]),
    "managed env": (mutate(demo_raw(), "env", {"XLA_FLAGS": "--xla_foo"}),
                    ["env.XLA_FLAGS: jaxwarm sets this variable itself"]),
    "command as string": (mutate(demo_raw(), "entrypoint.command", "jaxwarm-train --x"),
                          ["entrypoint.command: expected a list of arguments"]),
    "env name": (mutate(demo_raw(), "env", {"A;touch x": "1"}),
                 ["env.A;touch x: expected a variable name"]),
    "newline in sbatch value": (mutate(demo_raw(), "slurm.partition", "gpu\nrm -rf ~"),
                                ["slurm.partition: expected a single line"]),
    "sbatch option name": (mutate(demo_raw(), "slurm.extra", {"--gres": "gpu:8"}),
                           ["slurm.extra.--gres: expected an sbatch option name"]),
    "bad factory": (mutate(demo_raw(), "step.factory", "no_colon_here"),
                    ["step.factory: expected 'module:function'"]),
    "negative count": (mutate(demo_raw(), "slurm.cpus_per_task", -4),
                       ["slurm.cpus_per_task: expected a positive integer, got -4"]),
    "nan": (mutate(demo_raw(), "init_budget_s", float("nan")),
            ["init_budget_s: expected a finite number, got nan"]),
    "infinity": (mutate(demo_raw(), "cache.min_compile_time_secs", float("inf")),
                 ["cache.min_compile_time_secs: expected a finite number, got inf"]),
    "zero where meaningless": (mutate(demo_raw(), "train.log_every", 0),
                               ["train.log_every: expected a positive integer, got 0"]),
    "negative mesh axis": (mutate(demo_raw(), "mesh.axes", {"data": -2, "fsdp": -4}),
                           ["mesh.axes.data: expected a positive integer, got -2"]),
    "newline in an argument": (mutate(demo_raw(), "entrypoint.args", ["a\n#SBATCH --wrap=x"]),
                               ["entrypoint.args[0]: expected a single line without control"]),
    "trailing newline in an option name": (mutate(demo_raw(), "slurm.extra", {"gres\n": "x"}),
                                           ["slurm.extra.'gres\\n': expected a single line"]),
    "trailing newline in an env name": (mutate(demo_raw(), "env", {"FOO\n": "x"}),
                                        ["env.'FOO\\n': expected a single line"]),
    "control character in an env value": (mutate(demo_raw(), "env", {"FOO": "a\rb"}),
                                          ["env.FOO: expected a single line"]),
    "run name is a path": (mutate(demo_raw(), "run.name", ".."),
                           ["run.name: expected one path component"]),
    "not utf-8": (b"run:\n  name: d\xffmo\n", ["not UTF-8 text (byte 0xff at offset 14)"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_error_is_one_clear_line_and_nothing_runs(tmp_path: Path, case: str,
                                                         cli: Cli) -> None:
    raw, expected = CASES[case]
    path = write(tmp_path, raw)
    out = tmp_path / "runs"
    result = cli("launch", str(path), "--local", f"run.out_dir={out}",
                     f"cache.dir={tmp_path / 'cache'}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"jaxwarm: error: {path}"), lines[0]
    for fragment in expected:
        assert fragment in lines[0]
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_bad_override_names_the_key(cli: Cli) -> None:
    result = cli("launch", str(DEMO), "--local", "train.stepz=3")
    assert result.returncode == 2
    assert "unknown key 'train.stepz' (did you mean 'train.steps'?)" in result.stderr


def test_missing_entrypoint_command_is_reported_before_anything_runs(tmp_path: Path,
                                                                    cli: Cli) -> None:
    result = cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                     f"cache.dir={tmp_path / 'cache'}", "entrypoint.command=[no-such-trainer]")
    assert result.returncode == 2
    assert "entrypoint.command: 'no-such-trainer' was not found on PATH" in result.stderr
    assert not logs_dir(tmp_path / "runs" / "demo").exists()


def test_missing_config_file(cli: Cli) -> None:
    result = cli("launch", "nope.yaml", "--local")
    assert result.returncode == 2
    assert result.stderr.strip() == "jaxwarm: error: nope.yaml: cannot read config: " \
                                    "No such file or directory"


def test_overrides_are_read_as_yaml() -> None:
    config = load_config(DEMO, ["train.steps=3", "mesh.axes={data: 8, fsdp: 1}",
                                "jax.jax_default_matmul_precision=highest"])
    assert config.train.steps == 3
    assert list(config.mesh.axes.items()) == [("data", 8), ("fsdp", 1)]
    assert config.jax == {"jax_default_matmul_precision": "highest"}


def test_both_configs_validate() -> None:
    demo = load_config(DEMO)
    assert demo.topology.num_devices == 8 and demo.init_budget_s == 1800
    big = load_config(DEMO.parent / "llama3-8b-64gpu.yaml")
    assert big.topology.num_devices == 64 and big.topology.platform == "gpu"


def test_entrypoint_needs_exactly_one_form() -> None:
    raw = demo_raw()
    raw["entrypoint"] = {"command": ["a"], "function": "m:f"}
    with pytest.raises(ConfigError, match="exactly one of"):
        parse_config(raw, "x.yaml")


def test_unknown_factory_module_is_reported_before_anything_runs(tmp_path: Path,
                                                                 cli: Cli) -> None:
    result = cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                     f"cache.dir={tmp_path / 'cache'}", "step.factory=my_modle:make_step")
    assert result.returncode == 2
    assert "step.factory: module 'my_modle' was not found" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_newline_in_the_run_dir_is_refused() -> None:
    with pytest.raises(ConfigError, match="run.out_dir: expected a single line without control"):
        load_config(DEMO, ["run.out_dir=\"runs\\n#SBATCH --wrap=x\""])


def test_a_jobs_pinned_config_is_read_only_as_the_launch_wrote_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every job reads the pinned config (it names the code the job imports): another
    user's copy, one others may write, a link, or a file changed since the launch (its
    sha256 is in the job's environment) is one line, and no job runs from it."""
    config, pinned = pin_config(load_config(DEMO, [f"run.out_dir={tmp_path / 'runs'}",
                                                   f"cache.dir={tmp_path / 'cache'}"]))
    written = pinned.read_bytes()
    monkeypatch.setenv("JAXWARM_CONFIG", str(pinned))
    monkeypatch.setenv(PINNED_DIGEST, config_digest(written))
    assert config_from_env() == config

    def refused(why: str) -> None:
        with pytest.raises(ConfigError) as caught:
            config_from_env()
        assert str(caught.value).startswith(f"{pinned}: {why}"), caught.value

    pinned.write_bytes(written.replace(b"factory: ", b"factory: evil_"))
    refused("the run's pinned config is not the file the launch pinned (sha256 ")
    pinned.write_bytes(written)
    pinned.chmod(0o666)
    refused("the run's pinned config is writable by other users (mode 0666); refusing to "
            "run a job from it")
    pinned.chmod(0o644)
    os.chown(pinned, 12345, -1)
    refused(f"the run's pinned config is owned by uid 12345, not by you (uid {os.geteuid()})")
    pinned.unlink()
    theirs = tmp_path / "theirs.yaml"
    theirs.write_bytes(written)
    pinned.symlink_to(theirs)
    refused("cannot read config: not a regular file (a symlink)")


def test_a_lone_surrogate_anywhere_is_one_line_and_render_writes_nothing(
        tmp_path: Path, cli: Cli) -> None:
    """A string UTF-8 cannot write (a lone surrogate, from YAML's escape or an override's
    bytes) passed every check and failed as "a jaxwarm bug" where the config was pinned."""
    config = tmp_path / "c.yaml"
    config.write_text(DEMO.read_text().replace("name: demo", 'name: "demo\\ud800"'))
    before = snapshot(tmp_path)
    runs = f"run.out_dir={tmp_path / 'runs'}"
    for args, key, got in [([str(config)], "run.name", "'demo\\ud800'"),
                           ([str(DEMO), 'step.args.extra="a\\udcff"'], "step.args.extra",
                            "'a\\udcff'"),
                           ([str(DEMO), "run.name=b\udcff"], "run.name", "'b\\udcff'")]:
        result = cli("render", *args, runs, "--job", "train")
        assert_refused(result, f": {key}: expected text, got {got}: surrogates not allowed")
    assert snapshot(tmp_path) == before


def test_variables_in_the_run_and_cache_dirs_are_expanded_or_one_line(
        tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """`$VAR` in run.out_dir and cache.dir was kept as written, and render made `./$HOME/...`:
    expanded as cache.stage is; unset (or empty), one line and nothing made."""
    monkeypatch.setenv("JW_TEST_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.delenv("JW_TEST_UNSET", raising=False)
    config = load_config(DEMO, ["run.out_dir=$JW_TEST_SCRATCH/runs",
                                "cache.dir=${JW_TEST_SCRATCH}/cache"])
    assert (config.run.out_dir, config.cache.dir) == (f"{tmp_path}/scratch/runs",
                                                      f"{tmp_path}/scratch/cache")
    monkeypatch.chdir(tmp_path)
    for key in ("run.out_dir", "cache.dir"):
        result = cli("render", str(DEMO), f"{key}=$JW_TEST_UNSET/x", "--job", "train")
        assert_refused(result, f"{key}: '$JW_TEST_UNSET/x' names $JW_TEST_UNSET, which is not "
                               f"set (or empty) here")
    assert list(tmp_path.iterdir()) == []


def test_a_package_named_jaxwarm_on_the_jobs_pythonpath_is_one_line(
        tmp_path: Path, cli: Cli) -> None:
    """It would be imported in every job in place of jaxwarm (the prewarm ended with a raw
    traceback); a namespace dir of that name shadows nothing, jaxwarm's own tree is itself."""
    package = tmp_path / "pkgs" / "jaxwarm"
    package.mkdir(parents=True)
    (tmp_path / "module").mkdir()
    (tmp_path / "module" / "jaxwarm.py").write_text("X = 1\n")
    runs = f"run.out_dir={tmp_path / 'runs'}"
    for entry, found in [(package.parent, package), (tmp_path / "module",
                                                     tmp_path / "module" / "jaxwarm.py")]:
        if found == package:
            (package / "__init__.py").write_text("X = 1\n")
        result = cli("prewarm", str(DEMO), "--local", runs, f"env={{PYTHONPATH: {entry}}}")
        assert_refused(result, f"env.PYTHONPATH: {entry} holds a package named 'jaxwarm' ("
                               f"{found if found.suffix else found / '__init__.py'}), which "
                               f"every job would import in place of jaxwarm itself")
    (package / "__init__.py").unlink()  # a namespace portion
    for entry in (package.parent, REPO):
        check_modules(load_config(DEMO, [f"env={{PYTHONPATH: {entry}}}"]))
    assert not (tmp_path / "runs").exists()


def test_the_node_budget_names_aliases_only_when_there_are_some(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200,000 plain arguments were refused as "aliases repeating anchors". The budget is
    a thousand values here, so that reading to it is quick (100,000 takes PyYAML seconds)."""
    monkeypatch.setattr(yamlio, "YAML_MAX_NODES", 1000)
    many = tmp_path / "many.yaml"
    many.write_text(DEMO.read_text() + "extra: [" + ", ".join(["a"] * 2000) + "]\n")
    with pytest.raises(ConfigError, match=r"holds more than 1000 values \(a config is a few "
                                          r"hundred\); refusing it"):
        load_config(many)
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip("ab", "bc", strict=True)))
    with pytest.raises(ConfigError, match=r"expands to more than 1000 values \(aliases "
                                          r"repeating anchors\)"):
        load_config(laughs)


@pytest.mark.hostile
@pytest.mark.parametrize("character", ["\u2028", "\u2029", "\x85", "\x9b", "\u202e", "\u2066"])
def test_unicode_controls_are_refused_like_ascii_ones(tmp_path: Path, character: str) -> None:
    with pytest.raises(ConfigError) as caught:
        # YAML's double-quoted escape puts the very character in the value (a raw NEL in a
        # plain scalar is a line break to YAML, folded into a space before jaxwarm sees it).
        load_config(DEMO, [f'run.name="demo\\u{ord(character):04x}x"', f"run.out_dir={tmp_path}"])
    message = str(caught.value)
    assert "run.name: expected a single line without control characters" in message
    assert message.isascii(), message  # the line itself shows the character escaped


ATTACKS = {
    "run.out_dir=\"runs\\n#SBATCH --wrap=touch /tmp/pwned\"": "run.out_dir",
    "slurm.extra={\"gres\\n\": x}": "slurm.extra.'gres\\n'",
    "env={\"FOO\\n\": x}": "env.'FOO\\n'",
    "env={FOO: \"x\\ntouch /tmp/pwned\"}": "env.FOO",
    "slurm.partition=\"gpu\\n\"": "slurm.partition",
    "run.name=\"demo\\r\"": "run.name",
    "cache.dir=\"/tmp/c\\n\"": "cache.dir",
    "entrypoint.args=[\"--x\\u0000\"]": "entrypoint.args[0]",
    "xla_flags=[\"--xla_foo\\t\"]": "xla_flags[0]",
    "jax={jax_foo: \"a\\nb\"}": "jax.jax_foo",
    "step.factory=\"jaxwarm.step:f\\n\"": "step.factory",
    "mesh.axes={\"data\\n\": 1, fsdp: 8}": "mesh.axes.'data\\n'",
}


@pytest.mark.e2e
@pytest.mark.hostile
@pytest.mark.parametrize("override", sorted(ATTACKS))
def test_control_characters_are_refused_wherever_they_would_reach_a_script(
        tmp_path: Path, override: str, cli: Cli) -> None:
    before = snapshot(tmp_path)
    for command in (["render", str(DEMO), f"run.out_dir={tmp_path}", override, "--job", "train"],
                    ["launch", str(DEMO), "--local", f"cache.dir={tmp_path / 'c'}", override]):
        result = cli(*command)
        assert_refused(result, f"{ATTACKS[override]}: expected a single line without control")
    assert snapshot(tmp_path) == before


def test_an_empty_cache_dir_is_not_the_working_directory() -> None:
    with pytest.raises(ConfigError, match="cache.dir: expected a directory path, got an empty"):
        load_config(DEMO, ["cache.dir="])


@pytest.mark.e2e
@pytest.mark.hostile
def test_an_empty_cache_dir_never_means_the_working_directory(
        tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    users = tmp_path / "build-cache"
    users.write_text("the user's build cache\n")
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert_refused(cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                       "cache.dir="), "cache.dir: expected a directory path")
    assert_refused(cli("cache", "verify", str(DEMO), "cache.dir="),
                   "cache.dir: expected a directory path")
    assert snapshot(tmp_path) == before


def test_mesh_axes_are_optional_when_the_factory_builds_the_mesh() -> None:
    raw = demo_raw()
    del raw["mesh"]
    assert parse_config(raw, "x.yaml").mesh.axes is None
    assert load_config(DEMO, ["mesh.axes=null"]).mesh.axes is None
    with pytest.raises(ConfigError, match=r"mesh.axes: expected at least one axis \(or no "):
        load_config(DEMO, ["mesh.axes={}"])


def test_an_entrypoint_module_inside_a_namespace_package_is_found(tmp_path: Path) -> None:
    """maxtext.trainers has no __init__.py: the pre-launch check and the run's fingerprint
    find the module without importing it."""
    package = tmp_path / "nspkg"
    (package / "trainers").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('the check imported me')\n")
    (package / "trainers" / "train.py").write_text("def main(argv):\n    pass\n")
    (tmp_path / "factory.py").write_text("def make(config, mesh):\n    pass\n")
    env = f"env={{PYTHONPATH: {tmp_path}}}"
    for entry in ("entrypoint.module=nspkg.trainers.train",
                  "entrypoint.function=nspkg.trainers.train:main"):
        config = load_config(DEMO, ["entrypoint.command=null", entry, "step.factory=factory:make",
                                    env])
        check_modules(config)
    with job_import_path(config):  # the run's fingerprint reads the factory's sources too
        sources = step_sources("nspkg.trainers.train", list(distributions()))
    assert list(sources.files) == [str(package / "trainers" / "train.py")]
    missing = load_config(DEMO, ["entrypoint.command=null", "step.factory=factory:make", env,
                                 "entrypoint.module=nspkg.trainers.nope"])
    with pytest.raises(ConfigError, match="module 'nspkg.trainers.nope' was not found"):
        check_modules(missing)


def install_into(target: Path, name: str, version: str, source: str) -> None:
    """What `pip install --target TARGET` leaves of a one-module package: the package and
    its dist-info, whose RECORD lists the files installed."""
    (target / name).mkdir(parents=True, exist_ok=True)
    (target / name / "__init__.py").write_text(source)
    info = target / f"{name}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n"
                                 f"{info.name}/RECORD,,\n")


def test_packages_installed_on_pythonpath_are_covered_by_their_version(tmp_path: Path) -> None:
    """A package installed outside site-packages (an HPC module's prefix on PYTHONPATH) is
    part of the fingerprint by its version, like one in site-packages: its files are not
    hashed as the user's source (with jax there, that read all of jax at every launch)."""
    user, modules = tmp_path / "user", tmp_path / "modules"
    user.mkdir()
    (user / "model.py").write_text("import modlib\n\ndef make(config, mesh):\n    pass\n")
    install_into(modules, "modlib", "1.0", "VALUE = 1\n")
    config = load_config(DEMO, ["step.factory=model:make", f"env={{PYTHONPATH: {user}:{modules}}}"])
    before = fingerprint(config, tmp_path / "run", "local")
    assert list(before.files) == [str(user / "model.py")]
    (modules / "modlib" / "__init__.py").write_text("VALUE = 2\n")  # same version
    assert fingerprint(config, tmp_path / "run", "local") == before
    shutil.rmtree(modules / "modlib-1.0.dist-info")  # an upgrade
    install_into(modules, "modlib", "2.0", "VALUE = 2\n")
    after = fingerprint(config, tmp_path / "run", "local")
    assert differences(before, after) == ["packages differs"]


def test_another_steps_source_files_are_not_said_changed() -> None:
    """A first launch of a run is compared with another run's prewarm, whose step factory may
    read other files: those are new or no longer read, not changed."""
    old = Fingerprint("a", {"source": "1"}, {"model.py": "1", "data.py": "1", "old.py": "1"})
    new = Fingerprint("b", {"source": "2"}, {"model.py": "2", "data.py": "1", "jsp.py": "1"})
    assert differences(old, new) == ["source: model.py changed; jsp.py read now; old.py no "
                                     "longer read"]


@pytest.mark.parametrize(("entrypoint", "argv"), [
    ("{command: [python3, -u, train.py, --d-model, '8'], args: [--out, '{config}']}",
     ["train.py", "--d-model", "8", "--out", "PINNED"]),
    ("{command: [python, -m, json.tool], args: [--sort-keys]}",
     [str(Path(json.tool.__file__)), "--sort-keys"]),
    ("{module: json.tool, args: [-h]}", [str(Path(json.tool.__file__)), "-h"]),
    ("{command: [jsp-train, --steps, '3'], args: [--out, x]}",
     ["jsp-train", "--steps", "3", "--out", "x"]),
    ("{function: 'trainer:main', args: [--lr, '1']}", ["trainer:main", "--lr", "1"]),
    ("{command: [./run.sh, a], args: [b]}", ["./run.sh", "a", "b"]),
])
def test_trainer_argv_is_what_the_trainer_gets(entrypoint: str, argv: list[str]) -> None:
    """The argv a step factory reads (`jaxwarm.step.trainer_argv`), per launch form, as the
    trainer's sys.argv will be; `{config}` is the pinned config the job reads."""
    config = load_config(DEMO, [f"entrypoint={entrypoint}"])
    pinned = dataclasses.replace(config, source="PINNED")
    assert trainer_argv(pinned) == argv


# Every duration and size of the config, with the largest value it takes.
LIMITS = {"cache.min_compile_time_secs": MAX_DURATION_S, "cache.stage_wait_s": MAX_DURATION_S,
          "train.step_pause_s": MAX_DURATION_S, "train.first_step_timeout_s": MAX_DURATION_S,
          "ranks.meet_timeout_s": MAX_DURATION_S, "ranks.join_timeout_s": MAX_DURATION_S,
          "init_budget_s": MAX_DURATION_S,
          "stop_grace_s": MAX_DURATION_S, "slurm.signal_lead_s": SIGNAL_LEAD_MAX_S,
          "cache.min_entry_size_bytes": MAX_SIZE_BYTES, "cache.max_size": MAX_SIZE_BYTES,
          "cache.prefetch_max_size": MAX_SIZE_BYTES}


def config_fields(tp: type = Config, prefix: str = "") -> dict[str, type]:
    """Every leaf field of the config's dataclasses, by dotted key, with its annotation."""
    found = {}
    for name, hint in typing.get_type_hints(tp, include_extras=True).items():
        if dataclasses.is_dataclass(hint):
            found.update(config_fields(hint, f"{prefix}{name}."))
        elif name != "source":
            found[f"{prefix}{name}"] = hint
    return found


def test_every_duration_and_size_has_a_maximum() -> None:
    """A field named like a duration or a size is in LIMITS: a new one gets a maximum."""
    looks_like = [key for key in config_fields()
                  if key.endswith(("_s", "_secs", "_bytes", "max_size"))]
    assert sorted(looks_like) == sorted(LIMITS)


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_a_duration_or_size_past_its_maximum_is_one_line(key: str) -> None:
    """`ranks.meet_timeout_s: 1e16` passed, and every multi-rank job then died at its first
    meeting; now it is refused here, and the line says the maximum."""
    limit = LIMITS[key]
    load_config(DEMO, [f"{key}={limit}"])  # the maximum itself is taken
    floats = ("1.0e+16", "1.0e+308") if LIMITS[key] == MAX_DURATION_S else ()
    for too_big in (f"{limit + 1}", "10000000000000000", *floats):
        with pytest.raises(ConfigError) as refused:
            load_config(DEMO, [f"{key}={too_big}"])
        line = str(refused.value)
        assert line.startswith(f"{DEMO}: {key}: expected ") and "\n" not in line, line
        assert f"at most {limit:g}" in line or f"at most {limit}" in line, line
        if floats:
            assert "(a week)" in line


def test_the_fingerprint_has_the_trainers_command_line_where_the_factory_reads_it(
        tmp_path: Path) -> None:
    """A factory that reads the trainer's argv (tests/cli_trainer's, through trainer_argv)
    builds another step when only a flag changes; the demo's factory reads none, so its
    prewarm holds whatever the trainer's arguments are."""
    cli = REPO / "tests" / "cli_trainer" / "cli-trainer.yaml"
    base = fingerprint(load_config(cli), tmp_path / "run", "local")
    wider = fingerprint(load_config(cli, ["entrypoint.args=[--d-model, '24']"]),
                        tmp_path / "run", "local")
    assert differences(base, wider) == [
        "entrypoint differs (the trainer's command line, which the step factory reads)"]
    demo = fingerprint(load_config(DEMO), tmp_path / "run", "local")
    assert fingerprint(load_config(DEMO, ["entrypoint.args=[--steps, '3']"]),
                       tmp_path / "run", "local") == demo


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_run_name_that_climbs_out_is_refused_and_the_users_config_survives(
        tmp_path: Path, cli: Cli) -> None:
    users = tmp_path / "config.yaml"
    users.write_text("my own config\n")
    (tmp_path / "runs").mkdir()
    before = snapshot(tmp_path)
    for name in ("..", ".", "a/../..", "/etc"):
        result = cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                     f"cache.dir={tmp_path / 'cache'}", f"run.name={name}")
        assert_refused(result, "run.name: expected one path component")
    assert snapshot(tmp_path) == before


def laughs(levels: int) -> str:
    """A 'billion laughs': each anchor lists the previous one nine times."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for n in range(1, levels + 1):
        lines.append(f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]")
    return "\n".join(lines)


@pytest.mark.hostile
@pytest.mark.parametrize(("text", "line", "fragment"), [
    (f"x:\n{laughs(9)}\nrun:\n  name: *l9\n", None, "expands to more than"),
    ("x: " + "[" * 500 + "]" * 500 + "\n", 1, f"nested more than {YAML_MAX_DEPTH} levels"),
    ("x: " + "[" * 100_000 + "]" * 100_000 + "\n", 1, "nested more than"),
    ("".join("  " * i + f"k{i}:\n" for i in range(300)) + "  " * 300 + "v\n", None,
     "nested more than"),
    ("run:\n  name: a\ncache:\n  dir: /one\nstep:\n  factory: m:f\ncache:\n  dir: /two\n", 7,
     "duplicate key 'cache' (first at line 3)"),
])
def test_yaml_that_expands_nests_or_repeats_is_one_line(tmp_path: Path, text: str,
                                                        line: int | None,
                                                        fragment: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    message = str(caught.value)
    assert message.startswith(f"{config}:{line or ''}"), message
    assert fragment in message and "\n" not in message


@pytest.mark.e2e
@pytest.mark.hostile
def test_billion_laughs_in_step_args_ends_at_once_through_the_cli(tmp_path: Path,
                                                                  cli: Cli) -> None:
    config = tmp_path / "c.yaml"
    body = DEMO.read_text().replace("step:\n", f"{laughs(9)}\nstep:\n", 1)
    config.write_text(body.replace("args:\n", "args:\n    vocab_size: *l9\n", 1))
    before = snapshot(tmp_path)
    assert_refused(cli("cache", "stats", str(config), f"run.out_dir={tmp_path / 'runs'}",
                       f"cache.dir={tmp_path / 'cache'}"), str(config), "expands to more than")
    assert snapshot(tmp_path) == before


def refused(tmp_path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(DEMO, [f"run.out_dir={tmp_path / 'runs'}", *overrides])
    return str(caught.value)


@pytest.mark.hostile
@pytest.mark.parametrize(("override", "fragment"), [
    ("jax.jax_compilation_cache_dir=/elsewhere", "set cache.dir instead"),
    ("jax.jax_compilation_cache_max_size=10", "set cache.max_size instead"),
    ("jax.jax_persistent_cache_min_compile_time_secs=0",
     "set cache.min_compile_time_secs instead"),
    ("jax.jax_enable_pgle=true", "the pgle section owns this option"),
    ("jax.jax_compilation_cache_expect_pgle=true", "set pgle.expect instead"),
    ("pgle.profiling_runs=0", "pgle.profiling_runs: expected a positive integer, got 0"),
    ("env.JAX_COMPILATION_CACHE_DIR=/elsewhere", "jaxwarm sets this variable itself"),
    ("cache.dir=.", "would mean the working directory"),
    ("cache.dir=./", "would mean the working directory"),
    ("cache.dir=sub/..", "would mean the working directory"),
    ("cache.dir=file:///tmp/x", "got a file:// URL"),
    ("cache.dir=http://host/x", "got a http:// URL"),
])
def test_every_other_way_to_a_cache_dir_is_one_line(tmp_path: Path, override: str,
                                                      fragment: str) -> None:
    message = refused(tmp_path, override)
    assert message.startswith(f"{DEMO}: ") and fragment in message, message


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_jax_section_cache_dir_is_refused_by_render_and_launch(tmp_path: Path,
                                                                 cli: Cli) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    before = snapshot(tmp_path)
    for command in (("render", "--job", "train"), ("launch", "--local", "--no-prewarm")):
        result = cli(command[0], str(DEMO), *command[1:], f"run.out_dir={tmp_path / 'runs'}",
                     f"jax.jax_compilation_cache_dir={open_dir / 'cache'}")
        assert_refused(result, "jax.jax_compilation_cache_dir", "set cache.dir instead")
    assert snapshot(tmp_path) == before

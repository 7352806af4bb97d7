"""The house's floor plan, read from the source (no import is executed), and what the user
protocol loads (run in a fresh interpreter).

Imports point one way, down the floors of docs/architecture.md: `core` (the ground floor)
imports nothing of jaxwarm outside it; `jaxkey` (JAX's internals) only `core`; `store` only
those two; the user protocol (`step`, `specs`) only those; `report` and `job` (everything
that runs inside a job) build on them, and neither imports the other; `submit` builds on all
of them; nothing imports `cli` but `python -m jaxwarm`. The tests and the benchmarks share
their helpers through `testing/`, not through each other. `import jaxwarm` imports no jax;
its exports are imported on first use.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROTOCOL = ("jaxwarm.step", "jaxwarm.specs")
BELOW_JOB = ("jaxwarm.core", "jaxwarm.jaxkey", "jaxwarm.store", *PROTOCOL)
# Each floor and what of jaxwarm it may import besides itself.
FLOORS: dict[str, tuple[str, ...]] = {
    "jaxwarm/core": (),
    "jaxwarm/jaxkey": ("jaxwarm.core",),
    "jaxwarm/store": ("jaxwarm.core", "jaxwarm.jaxkey"),
    "jaxwarm/step.py": ("jaxwarm.core", "jaxwarm.jaxkey"),
    "jaxwarm/specs.py": ("jaxwarm.core", "jaxwarm.jaxkey"),
    "jaxwarm/report": ("jaxwarm.core", "jaxwarm.jaxkey", "jaxwarm.store"),
    "jaxwarm/job": BELOW_JOB,
    "jaxwarm/workload": (*BELOW_JOB, "jaxwarm.job"),
    "jaxwarm/submit": (*BELOW_JOB, "jaxwarm.job", "jaxwarm.report", "jaxwarm.workload"),
}


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports, at any depth (functions included), in every form:
    `import a.b`, `from a import b` (a, and a.b where b is a module), relative imports
    resolved against the file's package, and `importlib.import_module("a.b")` or
    `__import__("a.b")` with a literal name."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package = ".".join(path.relative_to(REPO).parts[:-1])
    return _imports(ast.parse(path.read_text(), filename=str(path)), package)


def _imports(tree: ast.AST, package: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                               "__import__"):
            names.add(node.args[0].value)
    return names


def test_the_import_reader_reads_every_form() -> None:
    source = ("import jaxwarm.cli.main\n"
              "from jaxwarm.submit import flow\n"
              "from jaxwarm.submit import local as backend\n"
              "def later():\n"
              "    from . import ranks\n"
              "    from ..store import entries\n"
              "    importlib.import_module('jaxwarm.submit.slurm')\n"
              "    __import__('jaxwarm.job.prewarm')\n")
    found = _imports(ast.parse(source), "jaxwarm.job")
    assert found >= {"jaxwarm.cli.main", "jaxwarm.submit.flow", "jaxwarm.submit.local",
                     "jaxwarm.job.ranks", "jaxwarm.store.entries", "jaxwarm.submit.slurm",
                     "jaxwarm.job.prewarm"}


def within(module: str, packages: tuple[str, ...]) -> bool:
    """Is `module` one of `packages` or inside one (`jaxwarm.cli.main` is not inside
    `jaxwarm.launcher.c`)?"""
    return any(module == p or module.startswith(f"{p}.") for p in packages)


def module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources_of(place: str) -> list[Path]:
    path = REPO / place
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def offenders(places: list[str], allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """What the modules under `places` import of jaxwarm outside themselves and `allowed`
    (the package's `__init__`, which only exports, aside)."""
    own = tuple(place.removesuffix(".py").replace("/", ".") for place in places)
    found = {}
    for place in places:
        for path in sources_of(place):
            wrong = sorted(m for m in imported_modules(path)
                           if within(m, ("jaxwarm",)) and m != "jaxwarm"
                           and not within(m, (*own, *allowed)))
            if wrong:
                found[str(path.relative_to(REPO))] = wrong
    return found


@pytest.mark.parametrize("floor", FLOORS)
def test_each_floor_imports_only_the_floors_below(floor: str) -> None:
    assert offenders([floor], FLOORS[floor]) == {}


def test_nothing_imports_the_cli() -> None:
    """The CLI is the top floor: only `python -m jaxwarm` (and the console script) enter it."""
    importers = {str(path.relative_to(REPO)) for path in package_sources()
                 if not within(module_of(path), ("jaxwarm.cli",))
                 and any(within(m, ("jaxwarm.cli",)) for m in imported_modules(path))}
    assert importers == {"jaxwarm/__main__.py"}


def test_every_module_is_on_a_floor() -> None:
    """A new folder or top-level module gets its rule here before it lands."""
    floors = tuple(place.removesuffix(".py").replace("/", ".") for place in FLOORS)
    loose = [module_of(path) for path in package_sources()
             if not within(module_of(path), (*floors, "jaxwarm.cli", "jaxwarm.slurm_templates"))
             and module_of(path) not in ("jaxwarm", "jaxwarm.__main__")]
    assert loose == []


def top_level_imports(path: Path) -> set[str]:
    """The jaxwarm modules a module imports when it is imported: its top-level statements,
    not a function's body nor a type checker's `if TYPE_CHECKING:` block."""
    tree = ast.parse(path.read_text(), filename=str(path))
    body = [node for node in tree.body
            if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")]
    names = _imports(ast.Module(body=[n for n in body if isinstance(n, (ast.Import,
                                                                         ast.ImportFrom))],
                                type_ignores=[]), module_of(path) if path.name == "__init__.py"
                     else module_of(path).rpartition(".")[0])
    modules = {module_of(p) for p in package_sources()}
    # a submodule's own packages are loaded before it by Python itself, not by its imports
    module = module_of(path)
    own_packages = {module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)}
    return {name for name in names if name in modules and name not in own_packages}


def test_no_import_circle() -> None:
    """No module imports, as it is imported, a module that imports it back (through any
    chain): every module can be read, and loaded, after what it builds on."""
    graph = {module_of(path): top_level_imports(path) - {module_of(path)}
             for path in package_sources()}
    circles = []
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for after in sorted(graph.get(module, ())):
            if state.get(after) == 1:
                circles.append(" -> ".join([*trail[trail.index(after):], after]))
            elif after not in state:
                visit(after, [*trail, after])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_tests_and_bench_share_helpers_through_testing_alone() -> None:
    """No tests <-> bench cycle: the benchmarks import nothing of the tests, and what both
    use (`testing/`) imports neither."""
    assert [path for path in sources_of("bench")
            if any(within(m, ("tests",)) for m in imported_modules(path))] == []
    assert [path for path in sources_of("testing")
            if any(within(m, ("tests", "bench")) for m in imported_modules(path))] == []


def loaded_by(code: str) -> list[str]:
    """The modules a fresh interpreter has loaded after running `code`."""
    return json.loads(subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120).stdout)


def test_the_user_protocol_loads_no_store_and_no_hook() -> None:
    """`from jaxwarm import StepBundle`, the line a user's adapter writes, loads the protocol
    and the config only; the job bootstrap (hook, recorder, store) is elsewhere."""
    ours = [name for name in loaded_by("from jaxwarm import StepBundle")
            if within(name, ("jaxwarm",))]
    assert [name for name in ours if within(name, ("jaxwarm.store", "jaxwarm.job",
                                                   "jaxwarm.submit"))] == []
    assert "jaxwarm.step" in ours


def test_import_jaxwarm_and_the_cli_import_no_jax() -> None:
    """The package's exports are imported on first use: `import jaxwarm` and the CLI's start
    (`jaxwarm --help` answers in a fraction of a second) import no jax; every export is
    there when asked for."""
    loaded = loaded_by("import jaxwarm, jaxwarm.cli.main")
    assert [name for name in loaded if within(name, ("jax", "jaxlib"))] == []
    exports = subprocess.run(
        [sys.executable, "-c", "import jaxwarm\n"
                               "print(sorted(n for n in jaxwarm.__all__ if getattr(jaxwarm, n) "
                               "is None))"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120)
    assert exports.stdout.strip() == "[]"


def test_the_cli_knows_no_backend() -> None:
    """`cli/main.py` parses arguments and maps errors to exit codes; which backend does what is
    the flow's and the backends' business (`jaxwarm.submit.backend`)."""
    assert {m for m in imported_modules(REPO / "jaxwarm" / "cli" / "main.py")
            if within(m, ("jaxwarm.submit.local",
                          "jaxwarm.submit.slurm"))} == set()


def package_sources() -> list[Path]:
    return sorted((REPO / "jaxwarm").rglob("*.py"))


def used_twice(names: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: places for name, places in names.items() if len(places) > 1}


def test_no_module_name_is_used_twice() -> None:
    """A module's name says what it is wherever it is read (`from ... import guard` told
    nothing about which guard): one module per name in the package (packages aside)."""
    modules: dict[str, list[str]] = defaultdict(list)
    for path in package_sources():
        if path.name not in ("__init__.py", "__main__.py"):
            modules[path.stem].append(str(path.relative_to(REPO)))
    assert used_twice(modules) == {}


def test_no_class_name_is_used_twice() -> None:
    """Likewise a class: one class per name in the package (`Target`, `CompileTarget` and
    `Targets` were three things)."""
    classes: dict[str, list[str]] = defaultdict(list)
    for path in package_sources():
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name].append(str(path.relative_to(REPO)))
    assert used_twice(classes) == {}


def test_the_in_job_start_is_documented_in_its_order() -> None:
    """docs/architecture.md names the in-job start's steps in the order they run."""
    from jaxwarm.job.start.books import BOUND, INIT_OVER
    from jaxwarm.job.start.hook import INSTALL

    text = re.sub(r" \([^()]*\)", "", " ".join(
        (REPO / "docs" / "architecture.md").read_text().split()))
    for sequence in (INSTALL, BOUND, INIT_OVER):
        names = [f"`{step.__name__}`" for step in sequence]
        assert " -> ".join(names) in text, names


def test_every_module_is_named_in_the_architecture_doc() -> None:
    """docs/architecture.md names each module by its path under `jaxwarm/` (`core/config.py`),
    so a reader finds every room, and a new one is described before it lands."""
    text = (REPO / "docs" / "architecture.md").read_text()
    unnamed = [str(path.relative_to(REPO / "jaxwarm")) for path in package_sources()
               if path.name not in ("__init__.py", "__main__.py")
               and path.parent.name != "bootstrap"
               and f"`{path.relative_to(REPO / 'jaxwarm')}`" not in text]
    assert unnamed == []


# Rooms with one job: what outgrows these has become two jobs (submitit's pylint allows a
# function 6 arguments; a record or a small context object passes more).
MODULE_LINES, FUNCTION_LINES, PARAMETERS = 600, 80, 8


def oversized(path: Path) -> list[str]:
    """What in a module passes the limits: the module's lines, each function's lines (its
    `def` to its last line, nested functions within it included), each function's
    parameters (positional and keyword; `self`, `cls`, `*args` and `**kwargs` aside)."""
    text = path.read_text()
    found = []
    if (lines := len(text.splitlines())) > MODULE_LINES:
        found.append(f"{lines} lines")
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if (length := (node.end_lineno or node.lineno) - node.lineno + 1) > FUNCTION_LINES:
            found.append(f"{node.name}:{node.lineno} is {length} lines")
        args = node.args
        named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
                 if a.arg not in ("self", "cls")]
        if len(named) > PARAMETERS:
            found.append(f"{node.name}:{node.lineno} takes {len(named)} parameters")
    return found


def test_the_size_reader_counts_lines_and_parameters(tmp_path: Path) -> None:
    source = tmp_path / "big.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    source.write_text(f"def long():\n{body}\n"
                      "class C:\n"
                      "    def method(self, a, b, c, d, e, f, g, h, *rest, **named): pass\n"
                      "    def wide(self, a, b, c, d, e, /, f, g, *, h, i): pass\n")
    assert oversized(source) == [f"long:1 is {FUNCTION_LINES + 1} lines",
                                 f"wide:{FUNCTION_LINES + 5} takes 9 parameters"]


def test_no_module_or_function_outgrows_its_room() -> None:
    """No module over 600 lines, no function over 80 lines or with more than 8 parameters,
    in the whole package."""
    found = {str(path.relative_to(REPO)): oversized(path) for path in package_sources()}
    assert {place: what for place, what in found.items() if what} == {}


# The public API of jaxwarm 0.2.0: what a user's code imports, the console scripts, and every
# CLI command with its options. A change here is a change users see: it needs a CHANGELOG
# entry (and, for a name that goes, a version bump and the one-line hint of core/moved.py).
EXPORTED = ["CompileTarget", "Config", "StepBundle", "build_mesh", "build_step",
            "config_from_env", "enable_cache", "initialize", "load_config", "seed_spec",
            "sharded_specs", "step_args", "trainer_argv", "warn_risky_inputs"]
CONSOLE_SCRIPTS = {"jaxwarm": "jaxwarm.cli.main:main",
                   "jaxwarm-train": "jaxwarm.workload.trainer:main"}
CLI = {
    "": ["--verbose", "--version", "-v"],
    "cache": [],
    "cache export": ["--all", "--output", "-o"],
    "cache import": ["--max-bytes"],
    "cache ls": ["--json"],
    "cache prune": ["--include-pinned", "--max-size", "--older-than"],
    "cache stats": ["--json"],
    "cache verify": [],
    "doctor": [],
    "launch": ["--local", "--no-check-cache", "--no-prewarm", "--prewarm", "--slurm", "--wait"],
    "prewarm": ["--local", "--no-check-cache", "--slurm", "--wait"],
    "render": ["--job"],
    "report": ["--all", "--json", "--plot"],
    "status": [],
    "verify": ["--local", "--no-check-cache", "--slurm", "--trainer", "--until-all-looked-up"],
}


def cli_options(parser: argparse.ArgumentParser, command: str = "") -> dict[str, list[str]]:
    """Every command of the CLI (`cache ls`: a subcommand) -> its options, sorted."""
    found = {command: sorted(option for action in parser._actions
                             for option in action.option_strings
                             if option not in ("-h", "--help"))}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(cli_options(sub, f"{command} {name}".strip()))
    return found


def test_the_public_api_stays_as_released() -> None:
    """House moves keep what users write working: `from jaxwarm import ...`, the console
    scripts `pip install` makes, and every CLI command and flag (the layout moved every
    module in 0.2.0; none of these changed)."""
    import jaxwarm
    from jaxwarm.cli.main import build_parser

    assert jaxwarm.__all__ == EXPORTED
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"] == \
        CONSOLE_SCRIPTS
    assert cli_options(build_parser()) == CLI

"""The house's one-way imports, read from the source (no import is executed), and what the
user protocol loads (run in a fresh interpreter).

`jaxwarm/launcher/` is the ground floor every side shares (config, environment, JAX adapter,
store, in-job hook): nothing under it may import `jaxwarm.prewarm`, which builds on it. Code
that runs inside a job (`jaxwarm/launcher/injob/`, `jaxwarm/prewarm/`) never imports the submit
side. The tests and the benchmarks share their helpers through `testing/`, not through each
other. `import jaxwarm` imports no jax; its exports are imported on first use.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUBMIT_SIDE = ("jaxwarm.launcher.submit", "jaxwarm.launcher.flow", "jaxwarm.launcher.cli")


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
    source = ("import jaxwarm.launcher.cli\n"
              "from jaxwarm.launcher import flow\n"
              "from jaxwarm.launcher.submit import local as backend\n"
              "def later():\n"
              "    from . import ranks\n"
              "    from ..store import entries\n"
              "    importlib.import_module('jaxwarm.launcher.submit.slurm')\n"
              "    __import__('jaxwarm.prewarm.job')\n")
    found = _imports(ast.parse(source), "jaxwarm.launcher.injob")
    assert found >= {"jaxwarm.launcher.cli", "jaxwarm.launcher.flow",
                     "jaxwarm.launcher.submit.local", "jaxwarm.launcher.injob.ranks",
                     "jaxwarm.launcher.store.entries", "jaxwarm.launcher.submit.slurm",
                     "jaxwarm.prewarm.job"}


def within(module: str, packages: tuple[str, ...]) -> bool:
    """Is `module` one of `packages` or inside one (`jaxwarm.launcher.cli` is not inside
    `jaxwarm.launcher.c`)?"""
    return any(module == p or module.startswith(f"{p}.") for p in packages)


def offenders(folders: list[str], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {str(path.relative_to(REPO)): sorted(m for m in imported_modules(path)
                                                 if within(m, forbidden))
             for folder in folders for path in sorted((REPO / folder).rglob("*.py"))}
    return {k: v for k, v in found.items() if v}


def test_launcher_imports_nothing_from_prewarm() -> None:
    assert offenders(["jaxwarm/launcher"], ("jaxwarm.prewarm",)) == {}


def test_in_job_code_never_imports_the_submit_side() -> None:
    assert offenders(["jaxwarm/launcher/injob", "jaxwarm/prewarm"], SUBMIT_SIDE) == {}


def test_tests_and_bench_share_helpers_through_testing_alone() -> None:
    """No tests <-> bench cycle: the benchmarks import nothing of the tests, and what both
    use (`testing/`) imports neither."""
    assert offenders(["bench"], ("tests",)) == {}
    assert offenders(["testing"], ("tests", "bench")) == {}


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
    assert [name for name in ours if within(name, ("jaxwarm.launcher.store",
                                                   "jaxwarm.launcher.injob",
                                                   "jaxwarm.launcher.submit"))] == []
    assert "jaxwarm.prewarm.step" in ours


def test_import_jaxwarm_and_the_cli_import_no_jax() -> None:
    """The package's exports are imported on first use: `import jaxwarm` and the CLI's start
    (`jaxwarm --help` answers in a fraction of a second) import no jax; every export is
    there when asked for."""
    loaded = loaded_by("import jaxwarm, jaxwarm.launcher.cli")
    assert [name for name in loaded if within(name, ("jax", "jaxlib"))] == []
    exports = subprocess.run(
        [sys.executable, "-c", "import jaxwarm\n"
                               "print(sorted(n for n in jaxwarm.__all__ if getattr(jaxwarm, n) "
                               "is None))"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120)
    assert exports.stdout.strip() == "[]"


def test_the_cli_knows_no_backend() -> None:
    """`cli.py` parses arguments and maps errors to exit codes; which backend does what is
    the flow's and the backends' business (`jaxwarm.launcher.submit.backend`)."""
    assert {m for m in imported_modules(REPO / "jaxwarm" / "launcher" / "cli.py")
            if within(m, ("jaxwarm.launcher.submit.local",
                          "jaxwarm.launcher.submit.slurm"))} == set()


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
    from jaxwarm.launcher.injob.books import BOUND, INIT_OVER
    from jaxwarm.launcher.injob.hook import INSTALL

    text = re.sub(r" \([^()]*\)", "", " ".join(
        (REPO / "docs" / "architecture.md").read_text().split()))
    for sequence in (INSTALL, BOUND, INIT_OVER):
        names = [f"`{step.__name__}`" for step in sequence]
        assert " -> ".join(names) in text, names

"""The house's one-way imports, read from the source (no import is executed), and what the
user protocol loads (run in a fresh interpreter).

`launcher/` is the ground floor every side shares (config, environment, JAX adapter, store,
in-job hook): nothing under it may import `prewarm`, which builds on it. Code that runs
inside a job (`launcher/injob/`, `prewarm/`) never imports the submit side. The tests and
the benchmarks share their helpers through `testing/`, not through each other.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUBMIT_SIDE = ("launcher.submit", "launcher.flow", "launcher.cli")


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
    source = ("import launcher.cli\n"
              "from launcher import flow\n"
              "from launcher.submit import local as backend\n"
              "def later():\n"
              "    from . import ranks\n"
              "    from ..store import entries\n"
              "    importlib.import_module('launcher.submit.slurm')\n"
              "    __import__('prewarm.job')\n")
    found = _imports(ast.parse(source), "launcher.injob")
    assert found >= {"launcher.cli", "launcher.flow", "launcher.submit.local",
                     "launcher.injob.ranks", "launcher.store.entries",
                     "launcher.submit.slurm", "prewarm.job"}


def offenders(folders: list[str], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {str(path.relative_to(REPO)): sorted(m for m in imported_modules(path)
                                                 if m.startswith(forbidden))
             for folder in folders for path in sorted((REPO / folder).rglob("*.py"))}
    return {k: v for k, v in found.items() if v}


def test_launcher_imports_nothing_from_prewarm() -> None:
    assert offenders(["launcher"], ("prewarm",)) == {}


def test_in_job_code_never_imports_the_submit_side() -> None:
    assert offenders(["launcher/injob", "prewarm"], SUBMIT_SIDE) == {}


def test_tests_and_bench_share_helpers_through_testing_alone() -> None:
    """No tests <-> bench cycle: the benchmarks import nothing of the tests, and what both
    use (`testing/`) imports neither."""
    assert offenders(["bench"], ("tests",)) == {}
    assert offenders(["testing"], ("tests", "bench")) == {}


def test_the_user_protocol_loads_no_store_and_no_hook() -> None:
    """`from prewarm.step import StepBundle`, the line a user's adapter writes, loads the
    protocol and the config only; the job bootstrap (hook, recorder, store) is elsewhere."""
    loaded = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys; import prewarm.step; "
                               "print(json.dumps(sorted(sys.modules)))"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120).stdout)
    ours = [name for name in loaded if name.split(".")[0] in ("launcher", "prewarm")]
    assert [name for name in ours if name.startswith(("launcher.store", "launcher.injob",
                                                      "launcher.submit"))] == []
    assert "prewarm.step" in ours


def test_the_cli_knows_no_backend() -> None:
    """`cli.py` parses arguments and maps errors to exit codes; which backend does what is
    the flow's and the backends' business (`launcher.submit.backend`)."""
    assert {m for m in imported_modules(REPO / "launcher" / "cli.py")
            if m.startswith(("launcher.submit.local", "launcher.submit.slurm"))} == set()

"""The house's one-way imports, read from the source (no import is executed).

`launcher/` is the ground floor every side shares (config, environment, JAX adapter, store,
in-job hook): nothing under it may import `prewarm`, which builds on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports, at any depth (functions included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_launcher_imports_nothing_from_prewarm() -> None:
    offenders = {str(path.relative_to(REPO)): sorted(m for m in imported_modules(path)
                                                     if m.split(".")[0] == "prewarm")
                 for path in sorted((REPO / "launcher").rglob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}

"""Where the modules of earlier layouts are now, so that an import of one names the new import.

An adapter, a step factory (`step.factory`) or an entrypoint written against an earlier
layout (0.1.0's top-level `prewarm` and `launcher`, or the `jaxwarm.prewarm` and
`jaxwarm.launcher` between) fails to import with Python's `No module named 'prewarm'`,
which says nothing of where the module went. `MOVED` is the one table of those moves
(CHANGELOG.md tells them); `moved_import` turns such a failure into one line that names the
new import.
"""

from __future__ import annotations

import ast
import importlib.util
import linecache
import textwrap
import traceback
from pathlib import Path

import jaxwarm

_L, _P = "jaxwarm.launcher", "jaxwarm.prewarm"
# An old module (or package: its modules moved with it) -> the module it is now. 0.1.0's
# `launcher.X` and `prewarm.X` are looked up as `jaxwarm.launcher.X` and `jaxwarm.prewarm.X`
# (0.2.0 moved them whole into the one package, then onto its floors).
MOVED: dict[str, str] = {
    # The two packages themselves: what they exported, `jaxwarm` exports.
    _L: "jaxwarm",
    _P: "jaxwarm",
    # The ground floor.
    **{f"{_L}.{m}": f"jaxwarm.core.{m}" for m in (
        "config", "decode", "records", "files", "errors", "rundir", "words", "environment",
        "childwait", "contents", "entryargv", "gputarget")},
    f"{_L}.jaxkey": "jaxwarm.jaxkey",
    f"{_L}.jaxkey.guard": "jaxwarm.jaxkey.versionguard",
    f"{_L}.jaxkey.prefetch": "jaxwarm.jaxkey.entryload",
    f"{_L}.doctor": "jaxwarm.jaxkey.doctor",
    f"{_L}.selfcheck": "jaxwarm.jaxkey.doctor",
    f"{_L}.store": "jaxwarm.store",
    f"{_L}.store.commands": "jaxwarm.cli.cache",
    f"{_L}.submit": "jaxwarm.submit",
    f"{_L}.flow": "jaxwarm.submit.flow",
    f"{_L}.cli": "jaxwarm.cli.main",
    f"{_L}.report": "jaxwarm.report.render",
    f"{_L}.plot": "jaxwarm.report.plot",
    f"{_L}.mlperf": "jaxwarm.job.record.mlperf",
    # Inside a job.
    **{f"{_L}.injob.{m}": f"jaxwarm.job.start.{m}" for m in (
        "hook", "books", "jaximport", "place", "distributed", "gpu", "call", "task",
        "cacheguard")},
    f"{_L}.injob.boot": "jaxwarm.job.start.jaximport",
    f"{_L}.injob.guard": "jaxwarm.job.start.cacheguard",
    **{f"{_L}.injob.{m}": f"jaxwarm.job.record.{m}" for m in (
        "recorder", "phases", "ledger", "reads")},
    **{f"{_L}.injob.{m}": f"jaxwarm.job.{m}" for m in (
        "ranks", "prefetch", "stage", "warm", "trainerverify")},
    f"{_P}.bootstrap": "jaxwarm.job.start.jobstart",
    f"{_P}.jobstart": "jaxwarm.job.start.jobstart",
    f"{_P}.job": "jaxwarm.job.prewarm",
    **{f"{_P}.{m}": f"jaxwarm.job.{m}" for m in ("progress", "verify")},
    f"{_P}.judge": "jaxwarm.job.warm",  # the one warm decision
    # What an adapter imports.
    f"{_P}.step": "jaxwarm.step",
    f"{_P}.specs": "jaxwarm.specs",
    f"{_P}.workload": "jaxwarm.workload",
}
# Packages whose modules did not all move to one place: only the package itself maps.
WHOLE_ONLY = (_L, _P)
RELEASE = "0.2.0"


def new_module(old: str) -> str | None:
    """The module `old` is now, or None when it is no module of an earlier layout (a package
    of the user's own named `launcher` or `prewarm` included)."""
    root = old.partition(".")[0]
    if root in ("launcher", "prewarm"):
        if importlib.util.find_spec(root) is not None:
            return None
        old = f"jaxwarm.{old}"
    for prefix in sorted(MOVED, key=len, reverse=True):
        if old == prefix or (old.startswith(f"{prefix}.") and prefix not in WHOLE_ONLY):
            return MOVED[prefix] + old[len(prefix):]
    return None


def moved_module(module: str) -> str | None:
    """For a module path (`step.factory`, `entrypoint.module`) of an earlier layout, which
    the caller has named: which it is now, in words; None for any other module."""
    new = new_module(module)
    return None if new is None else f"it is {new!r} since jaxwarm {RELEASE} (CHANGELOG.md)"


def moved_import(exc: ImportError) -> str | None:
    """For an import statement of an earlier layout that failed (`from prewarm.step import
    StepBundle`): where it is, what it imported, and the import to write instead (`from
    jaxwarm import StepBundle`, what jaxwarm exports coming from jaxwarm itself). None for
    any other import error, a module of the user's that happens to share an old name
    included (that one is found, so its import does not fail for being missing)."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name is None or \
            new_module(exc.name) is None:
        return None
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if not frame.filename.startswith("<frozen ")]
    old, names, alias = (imported(frames[-1]) if frames else None) or ("", [], None)
    new = new_module(old) if f"{old}.".startswith(f"{exc.name}.") else None
    if new is None:  # the statement cannot be read, or names a module that is gone
        return f"{exc}: {moved_module(exc.name)}"
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"
    if names and (new == "jaxwarm" or all(name in jaxwarm.EXPORTS for name in names)):
        fix = f"from jaxwarm import {', '.join(names)}"
    elif names:
        fix = f"from {new} import {', '.join(names)}"
    else:
        fix = f"import {new}" + (f" as {alias}" if alias else "")
    return f"{where} imports {old!r}, which is {new!r} since jaxwarm {RELEASE} " \
           f"(CHANGELOG.md): {fix}"


def imported(frame: traceback.FrameSummary) -> tuple[str, list[str], str | None] | None:
    """The module a failed import statement named, the names it imported from it (none for
    `import a.b`) and its alias, read from the statement's source lines."""
    lines = [linecache.getline(frame.filename, number)
             for number in range(frame.lineno or 0, (frame.end_lineno or frame.lineno or 0) + 1)]
    try:
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            return node.module, [alias.name for alias in node.names], None
        if isinstance(node, ast.Import):
            for alias in node.names:
                if new_module(alias.name) is not None:
                    return alias.name, [], alias.asname
    return None

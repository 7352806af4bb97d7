"""examples/jsp_trainer as a user who pip-installed it runs it: its `jsp-train` console
script, for the tests of a trainer jaxwarm does not control and the ledger's benchmark."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "jsp_trainer"


def install(site: Path) -> str:
    """Make `site` hold jsp-train as installed: the dist-info an installer writes (its entry
    points from the example's pyproject), so that jaxwarm finds the console script's entry
    point. The PYTHONPATH to run it with: `site`, then the example (the package and its
    adapter)."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    info = site / f"jsp_trainer-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    scripts = "".join(f"{name} = {value}\n" for name, value in project["scripts"].items())
    (info / "entry_points.txt").write_text(f"[console_scripts]\n{scripts}")
    return os.pathsep.join([str(site), str(EXAMPLE)])

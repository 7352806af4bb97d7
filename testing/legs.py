"""The jax versions `make test` checks beyond the main venv's, one venv each under `.venvs/`,
and the venv of a real third-party trainer (MaxText), built the same way.

    python -m testing.legs build           # what `make legs` (so `make test`) runs: make (or
                                         # reuse) every leg's venv and MaxText's, side by side
    python -m testing.legs build maxtext   # what `make maxtext` runs first: .venvs/maxtext

A leg pins jax == jaxlib to one tested release and installs jaxwarm (editable) with its
own dependencies, plus the leg's pinned requirements file if it has one, into a venv of
the first Python found among its `pythons` (PyPI has jax 0.11+ only for Python 3.12+),
made and filled by .venv's uv (the Makefile installs it). A
leg with none of them installed is skipped, and its tests (`tests/test_jax_versions.py`,
`tests/test_maxtext.py`) report the skip with the reason. jax 0.10.2 is the main venv's.
Importing this module does not import jax.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENVS = REPO / ".venvs"
PYENV_ROOT = Path.home() / ".pyenv"
# What makes each leg's venv and installs its packages (the Makefile puts it into .venv).
UV = REPO / ".venv" / "bin" / "uv"
# Prints the interpreter's (major, minor) and its real executable (a pyenv shim names another
# file depending on the caller's PATH).
VERSION = "import os, sys; print(sys.version_info[:2]); print(os.path.realpath(sys.executable))"


@dataclass(frozen=True)
class Leg:
    jax: str
    pythons: tuple[str, ...]  # Python minor versions that pip offers this jax to, preferred first
    name: str = ""  # the venv's name under .venvs/; "" is jax-<version>
    requirements: Path | None = None  # pinned packages installed beside jaxwarm

    @property
    def venv(self) -> Path:
        return VENVS / (self.name or f"jax-{self.jax}")

    @property
    def label(self) -> str:
        return self.name or f"jax {self.jax}"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def pins(self) -> list[str]:
        pins = [f"jax=={self.jax}", f"jaxlib=={self.jax}"]
        return pins if self.requirements is None else [*pins, "-r", str(self.requirements)]

    @property
    def stamp(self) -> Path:
        return self.venv / ".installed"


LEGS: tuple[Leg, ...] = (
    Leg("0.8.3", ("3.11", "3.12", "3.13")),
    Leg("0.11.2", ("3.12", "3.13")),
    Leg("0.12.0.1", ("3.13", "3.12")),
)
# MaxText (examples/maxtext), unchanged from PyPI, with the CPU set of packages it needs
# (it declares none without an extra); built by `make legs` (so `make test`) too.
MAXTEXT = Leg("0.12.0.1", ("3.12", "3.13"), name="maxtext",
              requirements=REPO / "examples" / "maxtext" / "requirements.txt")
EXTRA = {MAXTEXT.name: MAXTEXT}


def find_python(minor: str) -> Path | None:
    """An interpreter of this minor version: on PATH, or installed by pyenv; its real path, so
    the leg's stamp names the same file whoever asks. Each candidate is run once, since a
    pyenv shim on PATH exists whether or not its version does."""
    candidates = [shutil.which(f"python{minor}"),
                  *sorted(map(str, PYENV_ROOT.glob(f"versions/{minor}.*/bin/python{minor}"))),
                  f"/usr/bin/python{minor}", f"/usr/local/bin/python{minor}"]
    wanted = str(tuple(map(int, minor.split("."))))
    for candidate in filter(None, candidates):
        try:
            found = subprocess.run([candidate, "-c", VERSION], capture_output=True,
                                   text=True, timeout=30)
        except OSError:
            continue
        version, _, executable = found.stdout.strip().partition("\n")
        if found.returncode == 0 and version == wanted:
            return Path(executable)
    return None


def leg_python(leg: Leg) -> tuple[Path | None, str]:
    """(the Python to build the leg with, why none) for a leg."""
    for minor in leg.pythons:
        if (python := find_python(minor)) is not None:
            return python, ""
    return None, (f"no Python {' or '.join(leg.pythons)} on this machine (looked for "
                  f"python3.X on PATH and under {PYENV_ROOT}/versions): {leg.label} is "
                  f"untested here")


def install_inputs() -> str:
    """What of pyproject.toml a leg's `pip install -e .` reads: the build system, the project
    without its extras (a leg installs none), the package finding and data. Lint, type and
    test settings, and the extras, change nothing in a leg, so changing them rebuilds none."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = {k: v for k, v in data["project"].items() if k != "optional-dependencies"}
    setuptools = data.get("tool", {}).get("setuptools", {})
    return json.dumps({"build-system": data.get("build-system"), "project": project,
                       "setuptools": setuptools}, sort_keys=True, indent=1)


def stamp_text(leg: Leg, python: Path) -> str:
    """What the venv was built from; a different text rebuilds it."""
    pinned = leg.requirements.read_text() if leg.requirements is not None else ""
    return "\n".join([str(python), *leg.pins, install_inputs(), pinned])


def ready(leg: Leg) -> bool:
    python, _ = leg_python(leg)
    return (python is not None and leg.stamp.is_file()
            and leg.stamp.read_text() == stamp_text(leg, python))


def build(leg: Leg) -> str:
    """Make the leg's venv unless it is up to date; one line saying what happened."""
    python, why = leg_python(leg)
    if python is None:
        return f"skipped: {why}"
    if ready(leg):
        return f"{leg.venv.relative_to(REPO)} up to date ({python})"
    if not UV.is_file():
        raise OSError(f"{UV} is missing: `make legs` installs it first")
    start = time.monotonic()
    shutil.rmtree(leg.venv, ignore_errors=True)
    subprocess.run([str(UV), "venv", "--quiet", "--python", str(python), str(leg.venv)],
                   check=True)
    subprocess.run([str(UV), "pip", "install", "--quiet", "--system-certs",
                    "--python", str(leg.python), "-e", str(REPO), *leg.pins], check=True)
    leg.stamp.write_text(stamp_text(leg, python))
    return (f"built {leg.venv.relative_to(REPO)} with {python} in "
            f"{time.monotonic() - start:.0f} s")


def build_or_say(leg: Leg) -> bool:
    """Build one leg and print what happened; False when it could not be built."""
    try:
        print(f"legs: {leg.label}: {build(leg)}", flush=True)
        return True
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"legs: {leg.label}: could not build {leg.venv}: {exc}", file=sys.stderr)
        return False


def main(argv: list[str]) -> int:
    if argv[1:2] != ["build"] or len(argv) > 3 or not set(argv[2:]) <= set(EXTRA):
        print(f"usage: python -m testing.legs build [{' | '.join(EXTRA)}]", file=sys.stderr)
        return 2
    if argv[2:]:
        return 0 if build_or_say(EXTRA[argv[2]]) else 1
    # Side by side: an install is mostly linking from uv's cache, waiting on disk, so the
    # legs together take less than one after the other. No bytecode is compiled here: the
    # Makefile's processes write that of what they import (`unexport PYTHONDONTWRITEBYTECODE`).
    every = [*LEGS, MAXTEXT]
    with ThreadPoolExecutor(max_workers=len(every)) as pool:
        built = list(pool.map(build_or_say, every))
    return 0 if all(built) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

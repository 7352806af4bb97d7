"""The wheel: one top-level package, `jaxwarm`, that works installed (not editable) away
from the checkout, beside a user's own package named `launcher`.

The wheel is built offline (.venv's uv, its build backend from uv's cache) from a copy of the
working tree (what git tracks or does not ignore: no stale `build/` of an earlier layout
can slip into it). It goes into a fresh venv without pip, without its dependencies: a `.pth`
line gives the venv .venv's site-packages for those, and since a `.pth` file in a folder
added that way is not run, .venv's editable jaxwarm stays out of it (asserted: jaxwarm is
imported from the fresh venv). From a temp dir, not the repo: `jaxwarm doctor`, `jaxwarm
render`, and a one-process demo launch (prewarm, then train: a HIT) whose config puts a
user's folder on PYTHONPATH: its step factory module, and packages `launcher` and `prewarm`
that raise when imported (what a user's `launcher` folder did to the prewarm job when
jaxwarm's packages had those names)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from jaxwarm.core.rundir import report_path
from testing.legs import UV
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# A user's packages under names jaxwarm once used at the top level.
SHADOWS = ("launcher", "prewarm")
# The wheel's dist-info carries the one version, pyproject.toml's.
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def source_tree(dest: Path) -> Path:
    """The working tree as a fresh clone would have it (tracked and not-ignored files)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=REPO, capture_output=True, check=True,
                           text=True).stdout.split("\0")
    for name in filter(None, names):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(source.read_bytes())
    return dest


def build_wheel(tmp: Path) -> Path:
    source = source_tree(tmp / "src")
    run(UV, "build", "--wheel", "--offline", "--quiet", "-o", tmp / "dist", source, cwd=tmp)
    return next((tmp / "dist").glob("jaxwarm-*.whl"))


def install(wheel: Path, venv: Path) -> Path:
    """The wheel alone into a fresh venv, its dependencies seen through .venv's
    site-packages; the venv's python."""
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv.parent)
    python = venv / "bin" / "python"
    run(UV, "pip", "install", "--offline", "--quiet", "--no-deps", "--python", python, wheel,
        cwd=venv.parent)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                    cwd=venv.parent).stdout.strip())
    dependencies = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "dependencies.pth").write_text("".join(f"{d}\n" for d in sorted(dependencies)))
    return python


def user_folder(root: Path) -> Path:
    """The demo's step factory under the user's own module name, beside the shadows."""
    root.mkdir()
    (root / "mystep.py").write_text(
        "from jaxwarm.workload.chunkwise import make_train_step  # noqa: F401\n")
    for name in SHADOWS:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(
            f"raise ImportError('the user\\'s own {name} package was imported')\n")
    return root


def test_the_wheel_is_one_package_that_runs_installed_beside_a_users_launcher(
        tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"jaxwarm", f"jaxwarm-{VERSION}.dist-info"}
    assert {"jaxwarm/slurm_templates/train.sbatch", "jaxwarm/slurm_templates/prewarm.sbatch",
            "jaxwarm/job/start/bootstrap/sitecustomize.py", "jaxwarm/__main__.py"} \
        <= set(names)

    venv = tmp_path / "venv"
    python = install(wheel, venv)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run(python, "-c", "import jaxwarm; print(jaxwarm.__file__)", cwd=elsewhere)
    assert Path(where.stdout.strip()).is_relative_to(venv)
    # .venv's pip, through the .pth line, reads the venv's own jaxwarm.
    shown = run(python, "-m", "pip", "show", "-f", "jaxwarm", cwd=elsewhere).stdout
    location = Path(shown.split("Location: ", 1)[1].splitlines()[0])
    assert location.is_relative_to(venv)
    files = shown.split("Files:", 1)[1].split()
    assert {f.split("/")[0] for f in files if not f.startswith("..")} \
        == {"jaxwarm", f"jaxwarm-{VERSION}.dist-info"}

    jaxwarm = venv / "bin" / "jaxwarm"
    assert run(jaxwarm, "--version", cwd=elsewhere).stdout == f"jaxwarm {VERSION}\n"
    doctor = run(jaxwarm, "doctor", cwd=elsewhere)
    assert "key prediction exact" in doctor.stdout
    rendered = run(jaxwarm, "render", DEMO, "--job", "train", "run.out_dir=runs", cwd=elsewhere)
    assert rendered.stdout.startswith("#!/bin/bash") and "jaxwarm-train" in rendered.stdout

    user = user_folder(tmp_path / "userlib")
    demo = run(jaxwarm, "launch", DEMO, "--local", "train.steps=1", *ONE_PROCESS, *FAST_STEP,
               "run.out_dir=runs", "cache.dir=cache", f"env.PYTHONPATH={user}",
               "step.factory=mystep:make_train_step", cwd=elsewhere)
    assert "jit_train_step: HIT on process 0" in demo.stdout
    report = json.loads(report_path(elsewhere / "runs" / "demo", "train", 0, 0).read_text())
    assert report["hits"] >= 1

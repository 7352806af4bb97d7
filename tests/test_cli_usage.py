"""The command line's usage errors name what is missing and nothing more: the overrides
(`KEY.SUB=VALUE ...`) are optional everywhere, so argparse never lists them as required
(`jaxwarm cache ls` alone said `target, KEY.SUB=VALUE` were); `--version` is the installed
package's, pyproject.toml's; and every subcommand answers bad input (real files of every
kind) with one line and exit 2, never a traceback, writing nothing. In this process, no
JAX."""

from __future__ import annotations

import os
import tomllib
import zlib
from pathlib import Path

import pytest

from jaxwarm.cli.main import main
from jaxwarm.core.rundir import pinned_config, submitted_jobs_path
from jaxwarm.store.store import LocalStore
from tests.conftest import DEMO, REPO, Cli
from tests.hostile import assert_refused, snapshot


@pytest.mark.parametrize(("argv", "missing"), [
    (["cache", "ls"], "target"),
    (["cache", "stats"], "target"),
    (["cache", "verify"], "target"),
    (["cache", "prune"], "target"),
    (["cache", "export", "-o", "b.tar"], "target"),
    (["cache", "import"], "bundle, target"),
    (["launch"], "config"),
    (["prewarm"], "config"),
    (["verify"], "config"),
    (["render", "--job", "train"], "config"),
])
def test_a_missing_argument_is_named_alone(argv: list[str], missing: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(f"error: the following arguments are required: "
                                         f"{missing}"), err
    assert "[KEY.SUB=VALUE ...]" in err  # the usage line still shows them, as optional


def test_the_version_is_the_project_s(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"jaxwarm {project['version']}\n"


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """Bad inputs of every kind, as files on disk."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    LocalStore(cache).manifest_file.write_text("{not json")
    LocalStore(cache).entry_path(f"jit_f-{'a' * 64}").write_bytes(zlib.compress(bytes(100)))
    run_dir = tmp_path / "runs" / "demo"
    run_dir.mkdir(parents=True)
    pinned_config(run_dir).write_bytes(b"run: {name: \xff}\n")
    submitted_jobs_path(run_dir).parent.mkdir()
    submitted_jobs_path(run_dir).write_text("[1, 2")
    fifo = tmp_path / "bundle.fifo"
    os.mkfifo(fifo)
    (tmp_path / "latin1.yaml").write_bytes(b"run:\n  name: d\xe9mo\n")
    (tmp_path / "garbage.tar").write_bytes(b"\0garbage" * 100)
    return {"tmp": tmp_path, "cache": cache, "run_dir": run_dir, "fifo": fifo,
            "latin1": tmp_path / "latin1.yaml", "garbage": tmp_path / "garbage.tar"}


def cases(w: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    """Subcommand -> (argv, a fragment of the one error line)."""
    out = [f"run.out_dir={w['tmp'] / 'out'}", f"cache.dir={w['tmp'] / 'c2'}"]
    on_cache = [str(DEMO), *out[:1], f"cache.dir={w['cache']}"]
    manifest = str(LocalStore(w["cache"]).manifest_file)
    return {
        "launch non-utf8": (["launch", str(w["latin1"]), "--local"], "not UTF-8 text"),
        "launch dir as config": (["launch", str(w["tmp"]), "--local"], "cannot read config"),
        "launch missing factory function": (
            ["launch", str(DEMO), "--local", *out, "step.factory=jaxwarm.step:no_such"],
            "defines no 'no_such'"),
        "prewarm nan": (["prewarm", str(DEMO), "--local", *out, "init_budget_s=.nan"],
                        "init_budget_s: expected a finite number"),
        "verify missing module": (["verify", str(DEMO), "--local", *out,
                                   "step.factory=no_such_module:f"], "was not found"),
        "render bad name": (["render", str(DEMO), *out, "run.name=..", "--job", "train"],
                            "run.name: expected one path component"),
        "report no run dir": (["report", str(w["tmp"] / "nope")], "no such run dir"),
        "report garbage pinned config": (["report", str(w["run_dir"])], "not UTF-8 text"),
        "status garbage jobs": (["status", str(w["run_dir"])],
                                str(submitted_jobs_path(w["run_dir"]))),
        "cache ls broken manifest": (["cache", "ls", str(w["cache"])], manifest),
        "cache stats broken manifest": (["cache", "stats", *on_cache], manifest),
        "cache verify broken manifest": (["cache", "verify", str(w["cache"])], manifest),
        "cache prune broken manifest": (["cache", "prune", str(w["cache"]), "--max-size", "1K"],
                                        manifest),
        "cache export nowhere": (["cache", "export", *on_cache, "--all",
                                  "-o", str(w["tmp"] / "no" / "dir" / "b.tar")], manifest),
        "cache import fifo": (["cache", "import", str(w["fifo"]), *on_cache],
                              "not a regular file"),
        "cache import garbage": (["cache", "import", str(w["garbage"]), *on_cache],
                                 "cannot read bundle"),
    }


@pytest.mark.hostile
def test_every_subcommand_answers_bad_input_with_one_line(world: dict[str, Path],
                                                          cli: Cli) -> None:
    all_cases = cases(world)
    commands = {argv[0] if argv[0] != "cache" else f"cache {argv[1]}"
                for argv, _ in all_cases.values()}
    assert commands == {"launch", "prewarm", "verify", "render", "report", "status",
                        *(f"cache {c}" for c in ("ls", "stats", "verify", "prune", "export",
                                                 "import"))}
    before = snapshot(world["tmp"])
    for name, (argv, fragment) in all_cases.items():
        result = cli(*argv)
        try:
            assert_refused(result, fragment)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert snapshot(world["tmp"]) == before

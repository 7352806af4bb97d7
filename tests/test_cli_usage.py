"""The command line's usage errors name what is missing and nothing more: the overrides
(`KEY.SUB=VALUE ...`) are optional everywhere, so argparse never lists them as required
(`jaxwarm cache ls` alone said `target, KEY.SUB=VALUE` were); `--version` is the installed
package's, pyproject.toml's. In this process, no JAX."""

from __future__ import annotations

import tomllib

import pytest

from jaxwarm.cli.main import main
from tests.conftest import REPO


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

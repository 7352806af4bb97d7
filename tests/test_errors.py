"""The one way jaxwarm ends on bad input: one line, the exit code of its kind; and a closed
stdout ends the CLI quietly."""

from __future__ import annotations

import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from jaxwarm.core.errors import EXIT_ERROR, EXIT_INTERRUPTED, ConfigError, run_main
from jaxwarm.core.files import LockTimeout
from jaxwarm.store.store import LocalStore
from tests.conftest import REPO
from tests.hostile import key


def raising(exc: BaseException):
    def main() -> int:
        raise exc
    return main


def test_user_errors_end_with_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for exc, line in [
        (LockTimeout("manifest lock of /c: held by pid 7 on n1\nfor 600 s"),
         "jaxwarm: error: manifest lock of /c: held by pid 7 on n1 for 600 s"),
        (ConfigError("a.yaml: train.steps: expected an integer"),
         "jaxwarm: error: a.yaml: train.steps: expected an integer"),
        (PermissionError(13, "Permission denied", "/c/x"),
         "jaxwarm: error: /c/x: Permission denied"),
    ]:
        assert run_main(raising(exc)) == EXIT_ERROR
        assert capsys.readouterr().err == line + "\n"


def test_a_bug_keeps_its_traceback_unless_the_cli_asks_for_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KeyError):
        run_main(raising(KeyError("functions")))
    assert run_main(raising(KeyError("functions")), bugs_as_one_line=True) == EXIT_ERROR
    assert "a jaxwarm bug" in capsys.readouterr().err
    assert run_main(raising(KeyboardInterrupt())) == EXIT_INTERRUPTED
    with pytest.raises(BrokenPipeError):  # a closed stdout: the CLI ends quietly
        run_main(raising(BrokenPipeError(32, "Broken pipe")))


def test_the_reference_trainer_ends_through_the_same_formatter(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jaxwarm.workload import trainer

    saved = {signum: signal.getsignal(signum) for signum in trainer.STOP_SIGNALS}
    try:
        assert trainer.main([str(tmp_path / "missing.yaml")]) == EXIT_ERROR
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    err = capsys.readouterr().err
    assert err.startswith("jaxwarm: error: ") and "missing.yaml" in err
    assert len(err.splitlines()) == 1


def in_shell(*args: str, stdout_to: str = "") -> subprocess.CompletedProcess[str]:
    command = f'"$0" -m jaxwarm "$@" {stdout_to}'
    return subprocess.run(["bash", "-o", "pipefail", "-c", command, sys.executable, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    entry = zlib.compress(bytes(4) + b"x" * 64)
    for n in range(3000):  # far more output than a pipe holds
        LocalStore(cache).entry_path(key(n)).write_bytes(entry)
    for extra in ([], ["--json"]):
        result = in_shell("cache", "ls", str(cache), *extra, stdout_to="| head -1")
        assert result.stderr == "", result.stderr[-2000:]
        assert len(result.stdout.splitlines()) == 1
        assert result.returncode == 141

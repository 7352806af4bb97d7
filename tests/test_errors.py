"""The one way jaxwarm ends on bad input: one line, the exit code of its kind."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from jaxwarm.core.errors import EXIT_ERROR, EXIT_INTERRUPTED, ConfigError, run_main
from jaxwarm.core.files import LockTimeout


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

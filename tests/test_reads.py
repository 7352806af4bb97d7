"""The files a step factory reads while it builds the step (`jaxwarm.job.record.reads`): what
the prewarm records for `--prewarm auto`, with real files and a real import."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

from jaxwarm.core.contents import content_hash
from jaxwarm.job.record.reads import FactoryReads
from jaxwarm.submit.fingerprint import changed_reads


def test_what_the_factory_reads_is_recorded_by_content(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = tmp_path / "sizes.json"
    sizes.write_text('{"d_ff": 32}')
    log = tmp_path / "factory.log"
    jaxwarms = tmp_path / "run"
    jaxwarms.mkdir()
    (jaxwarms / "config.yaml").write_text("x: 1\n")
    module = tmp_path / "lazymodel.py"
    module.write_text("SIZE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("lazymodel")  # compiled once: the factory loads its bytecode
    sys.modules.pop("lazymodel")
    with FactoryReads([jaxwarms]) as reads:
        json.loads(sizes.read_text())
        log.write_text("written, not read\n")
        (jaxwarms / "config.yaml").read_text()  # jaxwarm's own dir
        os.close(os.open(os.__file__, os.O_RDONLY))  # the standard library
        importlib.import_module("lazymodel")
    json.loads(sizes.read_text())  # after the call: not the factory's
    assert reads.files == {str(sizes.resolve()): content_hash(sizes),
                           str(module.resolve()): content_hash(module)}
    assert changed_reads(reads.files) == []
    sizes.write_text('{"d_ff": 64}')
    module.unlink()
    assert changed_reads(reads.files) == sorted([str(sizes.resolve()), str(module.resolve())])


def test_a_fifo_in_place_of_a_file_the_factory_read_is_a_change_not_a_hang(
        tmp_path: Path) -> None:
    sizes = tmp_path / "sizes.json"
    sizes.write_text("{}")
    recorded = {str(sizes): content_hash(sizes)}
    sizes.unlink()
    os.mkfifo(sizes)
    assert changed_reads(recorded) == [str(sizes)]

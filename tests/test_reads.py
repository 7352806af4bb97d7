"""The files a step factory reads while it builds the step (`jaxwarm.job.record.reads`): what
the prewarm records for `--prewarm auto`, with real files and a real import."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxwarm.core.contents import FULL_HASH_BYTES, LINK, file_signature
from jaxwarm.job.record.reads import CHANGED, FactoryReads
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
    assert reads.files == {str(sizes.resolve()): file_signature(sizes),
                           str(module.resolve()): file_signature(module)}
    assert changed_reads(reads.files) == []
    sizes.write_text('{"d_ff": 64}')
    module.unlink()
    assert changed_reads(reads.files) == sorted([str(sizes.resolve()), str(module.resolve())])


def test_a_fifo_in_place_of_a_file_the_factory_read_is_a_change_not_a_hang(
        tmp_path: Path) -> None:
    sizes = tmp_path / "sizes.json"
    sizes.write_text("{}")
    recorded = {str(sizes): file_signature(sizes)}
    sizes.unlink()
    os.mkfifo(sizes)
    assert changed_reads(recorded) == [str(sizes)]


def test_a_big_file_costs_one_stat_whatever_its_size(tmp_path: Path) -> None:
    """An 8 GiB file the factory reads the first KB of (sparse: `truncate -s 8G`) is signed
    by size, times and inode, not read: hashing it cost a launch 15 s (at 100 MB/s here,
    80 s). A file at the limit is still signed by its content. Rewritten, either is a
    change."""
    data, small = tmp_path / "dataset.bin", tmp_path / "vocab.bin"
    subprocess.run(["truncate", "-s", "8G", str(data)], check=True)
    small.write_bytes(b"v" * FULL_HASH_BYTES)
    with FactoryReads([]) as reads:
        with data.open("rb") as source:
            source.read(1024)
        small.read_bytes()
    big = reads.files[str(data.resolve())]
    assert big.startswith("stat:8589934592:"), big
    assert reads.files[str(small.resolve())] == file_signature(small) and \
        not file_signature(small).startswith("stat:")
    assert changed_reads(reads.files) == []
    with data.open("r+b") as target:  # one byte, in place, size kept
        target.write(b"x")
    small.write_bytes(b"w" * FULL_HASH_BYTES)
    assert changed_reads(reads.files) == sorted([str(data.resolve()), str(small.resolve())])


def test_a_file_read_through_a_symlink_is_recorded_by_the_link_too(tmp_path: Path) -> None:
    """Retargeting the link is a change, even to a file of the same bytes."""
    first, second, link = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "sizes.json"
    first.write_text("{}")
    second.write_text("{}")
    link.symlink_to(first)
    with FactoryReads([]) as reads:
        link.read_text()
    assert reads.files == {str(first): file_signature(first), str(link): f"{LINK}{first}"}
    assert changed_reads(reads.files) == []
    link.unlink()
    link.symlink_to(second)
    assert changed_reads(reads.files) == [str(link)]


def test_a_file_changed_while_the_factory_ran_is_recorded_as_changed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What the factory read is not what is there after its call: no signature of it is
    right, so the next launch prewarms again, and the prewarm's log says why."""
    sizes = tmp_path / "sizes.json"
    sizes.write_text('{"d_ff": 32}')
    with FactoryReads([]) as reads:
        json.loads(sizes.read_text())
        sizes.write_text('{"d_ff": 64}')  # another writer, while the factory builds
    assert reads.files == {str(sizes): CHANGED}
    assert changed_reads(reads.files) == [str(sizes)]
    assert f"the step factory read {sizes}, which changed while it ran" in caplog.text

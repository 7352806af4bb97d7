"""bench/README.md's figures come from bench/results/*.json: the committed README is what
`python -m bench.tables` makes of it, every table in it is one the command renders, and every
committed result JSON has a table there. Reading and rendering the JSON starts nothing and
imports no JAX, so these are pure tests."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import tables


def test_the_committed_readme_is_what_the_command_generates() -> None:
    text = tables.README.read_text()
    assert tables.render(text) == text, "bench/README.md is stale: run python -m bench.tables"


def test_every_table_in_the_readme_is_generated() -> None:
    outside = tables.BLOCK.sub("", tables.README.read_text())
    assert [line for line in outside.splitlines() if re.match(r"\s*\|", line)] == []


def test_every_result_has_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    read: set[str] = set()
    real = tables.result

    def recording(name: str) -> Any:
        read.add(f"{name}.json")
        return real(name)

    monkeypatch.setattr(tables, "result", recording)
    tables.render(tables.README.read_text())
    assert sorted(committed_results() - read) == []


def committed_results() -> set[str]:
    """The result JSONs git tracks: a benchmark run here writes beside them (`python -m
    bench.run --quick`, the README's, writes the ignored bench/results/latest.json), and what
    a user ran before is no result of the README's."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", "*.json"], cwd=tables.RESULTS,
                            capture_output=True, text=True, check=True).stdout
    return {Path(name).name for name in listed.split("\0") if name}


def test_an_unknown_table_is_one_line() -> None:
    with pytest.raises(tables.UnknownTable, match="no table named 'nope'"):
        tables.render("<!-- table: nope -->\n<!-- end table -->\n")

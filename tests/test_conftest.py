"""How `make test` spreads the suite (tests/conftest.py) does what it says under xdist: a
module-scoped fixture is set up once per parameter, not once per worker that happens to get
one of its tests, and a SLURM lane's tests run on one worker. A small suite of its own, run
by a real `pytest -n 3 --dist loadgroup` with the suite's grouping hook, records what ran
where. (pytest 9.2 with xdist 3.8 grouped nothing, silently: every shared launch of the
suite ran up to four times.)"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.conftest import REPO

SUITE = {
    "pytest.ini": """\
[pytest]
markers =
    slurm: as in the suite
""",
    "conftest.py": "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n",
    "record.py": """\
import os
from pathlib import Path

def record(what):
    with open(Path(__file__).parent / "record.txt", "a") as out:
        out.write(f"{what} {os.environ['PYTEST_XDIST_WORKER']}\\n")
""",
    "test_shared.py": """\
import pytest
from record import record

@pytest.fixture(scope="module", params=["a", "b"])
def launched(request):
    record(f"setup-{request.param}")
    return request.param

@pytest.mark.parametrize("i", range(4))
def test_uses_the_launch(launched, i):
    record(f"test-{launched}")
""",
    "test_lanes.py": """\
import pytest
from record import record

@pytest.mark.slurm
@pytest.mark.parametrize("i", range(3))
def test_lane_one(i):
    record("lane-1")

@pytest.mark.slurm(lane=2)
@pytest.mark.parametrize("i", range(3))
def test_lane_two(i):
    record("lane-2")
""",
    "test_pure.py": """\
import pytest

@pytest.mark.parametrize("i", range(8))
def test_pure(i):
    pass
""",
}


def test_shared_fixtures_and_slurm_lanes_each_run_on_one_worker(tmp_path: Path) -> None:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist",
                          "loadgroup", "-p", "no:cacheprovider"], cwd=tmp_path,
                         env={"PYTHONPATH": str(REPO), "PATH": ""}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [line.split() for line in (tmp_path / "record.txt").read_text().splitlines()]
    assert Counter(what for what, _ in lines) == {
        "setup-a": 1, "setup-b": 1, "test-a": 4, "test-b": 4, "lane-1": 3, "lane-2": 3}
    workers = {what: {worker for w, worker in lines if w == what} for what, _ in lines}
    for what in ("lane-1", "lane-2"):
        assert len(workers[what]) == 1, f"{what} ran on workers {workers[what]}"
    for param in "ab":
        assert workers[f"test-{param}"] == workers[f"setup-{param}"]

"""The init ledger: the phase "other" by what the trainer's main thread was doing.

Who a stack works for (`ledger.owner`) is checked on real frames of real modules: a
library's frame under the plumbing every stack passes through, a script, an import in
progress. Then the reference trainer (the demo) runs as a user launches it, and its report
splits "other" by owner, says what sampling cost, and the split adds up.
"""

from __future__ import annotations

import gc
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.job.record.ledger import (
    INTERVAL_S,
    MAX_INTERVAL_S,
    Ledger,
    frames_of,
    owner,
    package_of,
    spacing,
)
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, run_cli


def module(name: str, source: str) -> types.ModuleType:
    """A real module named `name`, running `source`."""
    made = types.ModuleType(name)
    exec(compile(source, f"/site-packages/{name.replace('.', '/')}.py", "exec"),  # noqa: S102
         made.__dict__)
    return made


def test_a_librarys_frame_under_the_plumbing_names_the_library() -> None:
    library = module("orbax.checkpoint._src.restore",
                     "import sys, json\n"
                     "def restore():\n"
                     "    return json.loads('1', parse_int=lambda _: sys._getframe(1))\n")
    frame = library.restore()  # json (stdlib) called back into the library's frame's caller
    assert owner(frames_of(frame)) == "orbax.checkpoint"


def test_the_main_thread_samples_itself_where_it_runs_for_the_ledger() -> None:
    """The ledger's thread asks, the main thread takes each sample between two of its
    bytecodes (no other thread walks its frames): while it runs a library's Python, the
    spans name that library, and the sampling's cost is counted."""
    library = module("orbax.checkpoint._src.spin",
                     "def spin(ledger, samples):\n"
                     "    while ledger.sampling().samples < samples:\n"
                     "        for _ in range(10000):\n"
                     "            pass\n")
    ledger = Ledger(interval_s=0.001).start()
    library.spin(ledger, 20)
    ledger.stop()
    owners = {name for _, _, name in ledger.spans()}
    assert "orbax.checkpoint" in owners, ledger.spans()
    assert ledger.sampling().cost_s > 0


def test_the_first_sample_is_taken_at_once_and_collection_stays_on() -> None:
    """The start's first instants are named too (the first sample does not wait an
    interval: with one of 1000 s, a sample still comes), and the sample's walk leaves the
    garbage collector as it found it (it is paused only for the walk, whose few allocations
    must not set off the collection the trainer's next ones would)."""
    ledger = Ledger(interval_s=1000.0).start()
    for _ in range(100_000_000):
        if ledger.sampling().samples:
            break
    ledger.stop()
    assert ledger.sampling().samples == 1
    assert gc.isenabled()


def test_samples_come_further_apart_as_a_start_goes_on() -> None:
    """50 a second for the first 4 s, then 0.5% of the time so far, at most 0.5 s apart: a
    45 s start at 32 ranks on 2 cores takes some hundreds of samples per rank, not 2,250."""
    assert spacing(INTERVAL_S, 0.0) == INTERVAL_S
    assert spacing(INTERVAL_S, 4.0) == pytest.approx(INTERVAL_S)
    assert spacing(INTERVAL_S, 40.0) == pytest.approx(0.2)
    assert spacing(INTERVAL_S, 3600.0) == MAX_INTERVAL_S
    waits, elapsed = 0, 0.0
    while elapsed < 45.0:
        elapsed += spacing(INTERVAL_S, elapsed)
        waits += 1
    assert 300 < waits < 800


def test_a_script_is_named_by_its_file_and_a_private_module_by_its_package() -> None:
    assert package_of("__main__", "/home/u/train.py") == "train.py"
    assert package_of("flax._src.linen", "x.py") == "flax"
    assert package_of("maxtext.input_pipeline.grain", "x.py") == "maxtext.input_pipeline"
    assert package_of("jaxwarm.job.start.hook", "x.py") == "jaxwarm"
    assert package_of("jaxwarm.workload.trainer", "x.py") == "jaxwarm.workload"


def test_an_import_in_progress_is_named_by_the_package_imported(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    package = tmp_path / "slowpkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("from slowpkg import inner\n")
    (package / "inner" / "__init__.py").write_text(
        "import sys\nfrom jaxwarm.job.record.ledger import frames_of, owner\n"
        "SEEN = owner(frames_of(sys._getframe()))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import slowpkg  # type: ignore[import-not-found]
    assert slowpkg.inner.SEEN == "import slowpkg"
    sys.modules.pop("slowpkg.inner")
    sys.modules.pop("slowpkg")


@pytest.mark.e2e
def test_the_reference_trainers_other_is_split_by_owner(tmp_path: Path) -> None:
    result = run_cli("launch", str(DEMO), "--local", "--no-prewarm", "train.steps=1",
                     f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}",
                     *FAST_STEP, *ONE_PROCESS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "runs" / "demo"
    listed = json.loads(run_cli("report", str(run), "--json").stdout)
    reports: list[dict[str, Any]] = listed["reports"] if isinstance(listed, dict) else listed
    train = next(r for r in reports if r["job"] == "train" and r["process_index"] == 0)
    other = [p for p in train["phases"] if p["phase"] == "other"]
    owners = {p["function"]: p["seconds"] for p in other if p["function"]}
    assert owners, other
    # The phases still add up to the time to first step, "other" split or not.
    assert sum(p["seconds"] for p in train["phases"]) == \
        pytest.approx(train["time_to_first_step_s"], abs=1e-3)
    sampling = train["sampling"]
    assert sampling["samples"] > 0 and sampling["cost_s"] >= 0
    assert sampling["interval_s"] == INTERVAL_S
    table = run_cli("report", str(run)).stdout
    assert "train   r0 p0  init ledger: " in table and "of CPU)" in table

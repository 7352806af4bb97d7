"""Progress with an ETA on the prewarm: each target's line says how long the same function
took last time on this layout (from the manifest) and when it should be done. The demo
prewarm run twice, the second on an emptied cache whose manifest is kept, shows the ETA, and
`jaxwarm status` from another shell shows the local job RUNNING with that line."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxwarm.core.files import locked
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import PrewarmProgress
from jaxwarm.core.rundir import prewarm_progress_path
from jaxwarm.core.words import duration
from jaxwarm.job.progress import last_compile, progress_line
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore, open_store
from testing.procs import wait_until
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, REPO, Cli, run_cli


def entry(key: str, compile_s: float, created: float, process_count: int = 2,
          signature: str | None = "abc") -> ManifestEntry:
    return ManifestEntry(function="jit_train_step", key=key, run="demo", config="c.yaml",
                         compile_s=compile_s, lower_s=0.1, written=True, jax_version="0.10.2",
                         process_count=process_count, created=created, signature=signature)


def test_the_eta_comes_from_the_last_compile_of_the_same_function_on_this_layout() -> None:
    manifest = {"a": entry("a", 1390.0, 10.0), "b": entry("b", 600.0, 20.0, process_count=8),
                "c": entry("c", 700.0, 30.0, signature="other"), "d": entry("d", 0.0, 40.0)}
    assert last_compile(manifest, "jit_train_step", "abc", 2).key == "a"
    assert last_compile(manifest, "jit_eval_step", "abc", 2) is None
    started = time.mktime((2026, 11, 25, 11, 19, 0, 0, 0, -1))
    line = progress_line(PrewarmProgress("jit_train_step", 1, 2, started, 1390.0))
    assert line == ("compiling jit_train_step (1 of 2; last time 23 min 10 s on this layout; "
                    "ETA 11:42:10)")
    assert progress_line(PrewarmProgress("jit_train_step", 1, 2, started, 1390.0),
                         now=started + 200).endswith(", 3 min 20 s elapsed")
    assert progress_line(PrewarmProgress("jit_init_state", 2, 2, started)) == \
        "compiling jit_init_state (2 of 2; no earlier compile of it on this layout)"
    assert duration(4000) == "1 h 6 min" and duration(2.34) == "2.3 s"


@pytest.mark.e2e
def test_a_second_prewarm_of_the_same_function_shows_its_eta(tmp_path: Path, cli: Cli) -> None:
    # On one process, the step tiny: what the line says does not depend on either.
    args = ("prewarm", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", *ONE_PROCESS, *FAST_STEP)
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "compiling jit_train_step (1 of 2; no earlier compile of it on this layout)" \
        in first.stderr
    cache, run_dir = tmp_path / "cache", tmp_path / "runs" / "demo"
    manifest = open_store(str(cache)).manifest()
    step = next(key for key, e in manifest.items() if e.function == "jit_train_step")
    for entry_file in cache.glob("*-cache"):  # the manifest stays
        entry_file.unlink()
    eta = (r"compiling jit_train_step \(1 of 2; last time [0-9.]+ s on this layout; "
           r"ETA \d\d:\d\d:\d\d\)")
    seen = ""

    def shows_progress() -> bool:
        nonlocal seen
        seen = cli("status", str(run_dir)).stdout
        return bool(re.search(eta + r", [0-9.]+ s elapsed", seen))

    # Holding the step's writer lock keeps the second prewarm at its compile (it waits for
    # the writer, as for another prewarm compiling the same key) while status looks.
    with locked(LocalStore(cache).writer_lock_path(step), "the test, holding the compile"):
        second = subprocess.Popen([sys.executable, "-m", "jaxwarm", *args], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert wait_until(shows_progress, 600), seen
        except BaseException:
            second.kill()
            raise
        finally:
            lines = seen.splitlines()
    assert re.fullmatch(r"prewarm +local +RUNNING +1 process\(es\), since \d\d:\d\d:\d\d "
                        r"\(.+\)  log .*/logs/prewarm-p0\.log", lines[0]), seen
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    assert re.search(eta, err), err[-3000:]
    assert re.search(r"compiling jit_init_state \(2 of 2; last time", err)
    done = read_record(PrewarmProgress, prewarm_progress_path(run_dir))
    assert done is not None and done.done
    after = cli("status", str(run_dir)).stdout
    assert re.match(r"prewarm +local +COMPLETED +1 process\(es\), exit 0 after", after), after
    assert "compiling" not in after

"""jaxwarm's state files read back (the readers of jaxwarm.core.jsonio, on the bounded reads
of jaxwarm.core.files) against hostile files (class 1 of issue 28): every state file jaxwarm
reads back is read within a bound. Each kind (init reports, the prewarm decision, the
first-step log, MLPerf logs, the submitted jobs, the pinned config in a run dir; the
manifest, the usage log and atime files in a cache; the prewarm records, verify's result and
a lock's holder note) planted as a link to /dev/zero, a FIFO, a directory, a (sparse) file
one byte over its cap, and JSON nested 100,000 deep: the command ends, names the file and
why in one line, goes on with the rest where the file is one among many, and changes
nothing.

The commands start no job and import no JAX, so they run in this process (conftest's `cli`:
the exit code and lines a user sees, the log lines as the CLI writes them), each inside
`guarded`: a regression that opened a FIFO fails the test instead of hanging the run, and one
that read /dev/zero meets a bound on this process's memory instead of taking the machine's.
The launch runs as a user runs it, in processes of its own under the same memory bound. The
timeout is a guard against a hang, not a measure of speed."""

from __future__ import annotations

import hashlib
import logging
import os
import resource
import shutil
import stat
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.core.files import HOLDER_CAP, RefusedFile, describe_holder
from jaxwarm.core.jsonio import JSON_MAX_DEPTH, RECORD_CAP
from jaxwarm.core.records import TRAIN
from jaxwarm.core.rundir import (
    first_steps_path,
    mlperf_log_path,
    pinned_config,
    prewarm_decision_path,
    report_path,
    reports_dir,
    submitted_jobs_path,
    verify_result_path,
)
from jaxwarm.core.yamlio import CONFIG_CAP
from jaxwarm.job.record.mlperf import MLPERF_LOG_CAP
from jaxwarm.report.read import FIRST_STEPS_CAP, load_verdicts
from jaxwarm.store.entries import ATIME_CAP
from jaxwarm.store.manifest import MANIFEST_CAP
from jaxwarm.store.prewarms import PREWARMS_CAP
from jaxwarm.store.store import LocalStore
from jaxwarm.store.usage import USAGE_CAP
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, REPO, Cli, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.hostile]

FIXTURES = Path(__file__).parent / "fixtures"
# Far longer than any of these commands takes; reached only by a command that hangs.
HANG_GUARD_S = 120
# A command that read /dev/zero into memory would fail here, not take the machine's memory.
MEMORY_GUARD = 4 << 30
DEEP = "[" * 100_000 + "]" * 100_000
KEY = f"jit_f1-{hashlib.sha256(b'1').hexdigest()}"
ATTACKS = ("/dev/zero link", "FIFO", "directory", "oversize", "deep nesting")
Ran = subprocess.CompletedProcess[str]


def plant(path: Path, attack: str, cap: int, deep: str) -> str:
    """Put the attack at `path`; returns what the one line must say of it."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if attack == "/dev/zero link":
        path.symlink_to("/dev/zero")
        return "not a regular file (a symlink)"
    if attack == "FIFO":
        os.mkfifo(path)
        return "not a regular file (a FIFO)"
    if attack == "directory":
        path.mkdir()
        return "not a regular file (a directory)"
    if attack == "oversize":
        with path.open("wb") as sparse:  # holes: no disk used
            sparse.truncate(cap + 1)
        return f"{cap + 1} bytes, more than"
    path.write_text(deep)
    return f"nested more than {JSON_MAX_DEPTH} levels deep"


def state(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under `root` by kind, size and mtime, read with lstat (nothing planted is
    opened); lock files and their holder notes, which any reader may leave, are left out,
    and so are the mtimes of dirs (a lock file created in one changes it)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.name.endswith((".lock", ".lockfile", ".holder")):
            continue
        info = path.lstat()
        kind = stat.S_IFMT(info.st_mode)
        found[str(path.relative_to(root))] = (
            kind, info.st_size if kind != stat.S_IFDIR else 0,
            info.st_mtime_ns if kind != stat.S_IFDIR else 0)
    return found


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_GUARD, MEMORY_GUARD))


def guarded(call: Callable[[], Any]) -> Any:
    """`call()` in a thread that may not take longer than HANG_GUARD_S, while this process may
    map no more than MEMORY_GUARD beyond what it maps now: a reader that blocked on a FIFO
    fails the test instead of hanging the run, and one that read /dev/zero into memory ends
    in a MemoryError instead of taking the machine's memory."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    mapped = int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                      if line.startswith("VmSize:")).split()[1]) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    bound = mapped + MEMORY_GUARD
    resource.setrlimit(resource.RLIMIT_AS,
                       (bound if hard == resource.RLIM_INFINITY else min(bound, hard), hard))
    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(HANG_GUARD_S)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert not thread.is_alive(), f"still reading after {HANG_GUARD_S} s"
    if "error" in result:
        raise result["error"]
    return result.get("value")


@pytest.fixture
def jaxwarm(cli: Cli, caplog: pytest.LogCaptureFixture) -> Callable[..., Ran]:
    """`jaxwarm ARGS...` in this process, `guarded`, its stderr as a user sees it: the error
    lines, then the log lines the CLI writes there (INFO and up, `jaxwarm: MESSAGE`)."""

    def call(*args: str) -> Ran:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            result: Ran = guarded(lambda: cli(*args))
        logged = "".join(f"jaxwarm: {record.getMessage()}\n" for record in caplog.records)
        result.stderr += logged
        return result

    return call


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir (its pinned config pins report.mlperf and the cache below) with the init
    reports of tests/fixtures, and a cache with one entry and the fixtures' manifest."""
    root = tmp_path_factory.mktemp("state")
    result = run_cli("render", str(DEMO), f"run.out_dir={root / 'runs'}",
                     f"cache.dir={root / 'cache'}", "report.mlperf=true", "--job", "train")
    assert result.returncode == 0, result.stderr
    shutil.copytree(reports_dir(FIXTURES / "run"), reports_dir(root / "runs" / "demo"))
    cache = LocalStore(root / "cache")
    shutil.copy(LocalStore(FIXTURES / "cache").manifest_file, cache.manifest_file)
    cache.entry_path(KEY).write_bytes(zlib.compress(bytes(4) + bytes(200)))
    return root


@pytest.fixture
def tree(template: Path, tmp_path: Path) -> Path:
    """A copy of the template, its pinned config pointing at the copy."""
    shutil.copytree(template, tmp_path / "t", symlinks=True)
    pinned = pinned_config(tmp_path / "t" / "runs" / "demo")
    pinned.write_text(pinned.read_text().replace(str(template), str(tmp_path / "t")))
    return tmp_path / "t"


# name -> (where the file is, of the run dir and the cache, cap, the text nested 100,000
# deep, the command, whether the command goes on (exit 0 with a `skipping` or `reading it as
# empty` line) or refuses (exit 2 with one error line: the file is the one it answers from),
# what it still shows).
RUN, CACHE = "{run}", "{cache}"
KINDS: dict[str, tuple[Callable[[Path, LocalStore], Path], int, str, list[str], bool, str]] = {
    "init report": (lambda run, _: report_path(run, TRAIN, 0, 0), RECORD_CAP, DEEP,
                    ["report", RUN], True, "prewarm  0        0-1"),
    "prewarm decision": (lambda run, _: prewarm_decision_path(run), RECORD_CAP, DEEP,
                         ["report", RUN], True, "train    0        1"),
    "first-step log": (lambda run, _: first_steps_path(run), FIRST_STEPS_CAP, DEEP,
                       ["report", RUN], True, "train    0        1"),
    "MLPerf log": (lambda run, _: mlperf_log_path(run, 0), MLPERF_LOG_CAP, ":::MLLOG " + DEEP,
                   ["report", RUN], True, "train    0        1"),
    "manifest, in a report": (lambda _, cache: cache.manifest_file, MANIFEST_CAP, DEEP,
                              ["report", RUN], True, "train    0        1"),
    "manifest, in cache ls": (lambda _, cache: cache.manifest_file, MANIFEST_CAP, DEEP,
                              ["cache", "ls", CACHE], False, ""),
    "usage log": (lambda _, cache: cache.usage_file, USAGE_CAP, DEEP,
                  ["cache", "ls", CACHE], True, "jit_f1"),
    "submitted jobs": (lambda run, _: submitted_jobs_path(run), RECORD_CAP, DEEP,
                       ["status", RUN], False, ""),
    "pinned config": (lambda run, _: pinned_config(run), CONFIG_CAP, "x: " + DEEP,
                      ["report", RUN], False, ""),
}


def absolute(tree: Path, text: str) -> str:
    return text.format(run=tree / "runs" / "demo", cache=tree / "cache")


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_state_file_is_named_in_one_line_and_the_command_goes_on(
        tree: Path, kind: str, attack: str, jaxwarm: Callable[..., Ran]) -> None:
    where, cap, deep, argv, goes_on, still_shown = KINDS[kind]
    path = where(tree / "runs" / "demo", LocalStore(tree / "cache"))
    why = plant(path, attack, cap, deep)
    before = state(tree)
    result = jaxwarm(*(absolute(tree, arg) for arg in argv))
    out = result.stdout + result.stderr
    assert "Traceback" not in out and "jaxwarm bug" not in out, out[-3000:]
    named = [line for line in out.splitlines() if str(path) in line]
    if kind == "pinned config" and attack == "/dev/zero link":
        why = "not a regular file (a character device)"  # a config may be a link: followed
    assert len(named) == 1 and why in named[0], (why, out[-3000:])
    if goes_on:
        assert result.returncode == 0, out[-3000:]
        assert still_shown in result.stdout, result.stdout[-3000:]
    else:
        assert result.returncode == 2, out[-3000:]
        assert named[0].startswith("jaxwarm: error:"), named
    assert state(tree) == before


@pytest.mark.parametrize("attack", ("/dev/zero link", "FIFO", "directory", "oversize"))
def test_a_hostile_atime_file_is_skipped_with_one_line(tree: Path, attack: str,
                                                       jaxwarm: Callable[..., Ran]) -> None:
    path = LocalStore(tree / "cache").atime_path(KEY)
    why = plant(path, attack, ATIME_CAP, "")
    before = state(tree)
    result = jaxwarm("cache", "ls", str(tree / "cache"))
    assert result.returncode == 0, result.stderr
    assert "jit_f1" in result.stdout
    named = [line for line in result.stderr.splitlines() if str(path) in line]
    assert len(named) == 1 and why in named[0], result.stderr
    assert state(tree) == before


@pytest.mark.parametrize("attack", ("link to your file", "FIFO", "directory"))
def test_a_planted_usage_log_is_never_appended_to_and_prune_goes_on(
        tree: Path, attack: str, jaxwarm: Callable[..., Ran]) -> None:
    """Prune records what it removed in the usage log: planted as a link to a file of
    yours, that file is not written through; as a FIFO or a dir, nothing waits on it."""
    path = LocalStore(tree / "cache").usage_file
    yours = tree / "yours.txt"
    yours.write_text("precious\n")
    if attack == "link to your file":
        path.symlink_to(yours)
        why = "not a regular file (a symlink)"
    else:
        why = plant(path, attack, USAGE_CAP, "")
    result = jaxwarm("cache", "prune", str(tree / "cache"), "--max-size", "0")
    assert result.returncode == 0, result.stderr
    assert "pruned 1 entry" in result.stdout
    named = [line for line in result.stderr.splitlines() if str(path) in line]
    assert named == [f"jaxwarm: skipping {path}: {why}"], result.stderr
    assert yours.read_text() == "precious\n"
    assert not LocalStore(tree / "cache").entry_path(KEY).exists()


@pytest.mark.parametrize("attack", ATTACKS)
def test_hostile_prewarm_records_make_the_launch_prewarm_with_one_line(
        tree: Path, attack: str, caplog: pytest.LogCaptureFixture) -> None:
    """`--prewarm auto` reads the records of completed prewarms: refused, it prewarms."""
    store = LocalStore(tree / "cache")
    path = store.prewarms_file
    why = plant(path, attack, PREWARMS_CAP, DEEP)
    with caplog.at_level(logging.WARNING, "jaxwarm"):
        assert guarded(store.prewarms) == {}
    named = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(named) == 1 and why in named[0], caplog.text


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_hostile_verify_result_is_one_line_naming_it(tree: Path, attack: str) -> None:
    path = verify_result_path(tree / "runs" / "demo")
    why = plant(path, attack, RECORD_CAP, DEEP)
    with pytest.raises((RefusedFile, ValueError)) as raised:
        guarded(lambda: load_verdicts(tree / "runs" / "demo", ""))
    assert str(path) in str(raised.value) and why in str(raised.value)


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_hostile_holder_note_names_nobody(tree: Path, attack: str) -> None:
    lock = Path(f"{LocalStore(tree / 'cache').manifest_file}.lock")
    plant(lock.with_name(lock.name + ".holder"), attack, HOLDER_CAP, DEEP)
    assert "did not record itself" in guarded(lambda: describe_holder(lock))


def test_a_launch_goes_on_past_hostile_state_files_in_its_cache(tmp_path: Path) -> None:
    """A real launch (`--prewarm auto`, prewarm and training) on a cache where the prewarm
    records are a FIFO, the manifest a link to /dev/zero and the usage log a link to a file
    of yours: it prewarms (no record can say it need not), trains, hits, and never writes
    through the links."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    yours = tmp_path / "yours.txt"
    yours.write_text("precious\n")
    store = LocalStore(cache)
    os.mkfifo(store.prewarms_file)
    store.manifest_file.symlink_to("/dev/zero")
    store.usage_file.symlink_to(yours)
    result = subprocess.run(
        [sys.executable, "-m", "jaxwarm", "launch", str(DEMO), "--local",
         f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={cache}", "train.steps=1",
         *ONE_PROCESS, *FAST_STEP], cwd=REPO, capture_output=True, text=True,
        timeout=600, preexec_fn=_limits)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "Traceback" not in out and "jaxwarm bug" not in out, out[-3000:]
    for line in (f"{store.prewarms_file}: not a regular file (a FIFO); every "
                 f"launch runs its prewarm",
                 f"skipping {store.usage_file}: not a regular file (a symlink)",
                 f"{store.manifest_file}: not a regular file (a symlink); reading "
                 f"it as empty"):
        # Once from the launcher (each job's processes say it once more in their logs).
        assert result.stderr.count(f"jaxwarm: {line}\n") == 1, (line, result.stderr[-3000:])
    assert "prewarm job runs (auto): no completed prewarm" in result.stderr
    assert "jit_train_step: HIT on process 0" in result.stdout, result.stdout[-3000:]
    assert yours.read_text() == "precious\n"

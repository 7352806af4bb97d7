"""`jaxwarm verify --trainer` against what a real launch then observes: one prewarm of the CLI
test trainer (tests/cli_trainer), then per case of a change matrix (the trainer's flags, an
XLA flag, the device count, each alone) a verify --trainer (and one per way of the adapter's
own copy of the flags, which the launch of the trainer does not read) and a launch without
prewarm, on the prewarmed cache (the same dir: before jax 0.11 its path is part of the key),
with a compile-time threshold no compile here reaches, so that no case's launch writes an
entry another case could hit (the threshold is no part of the key). For every prewarmed
function, WARM must be the launch's HIT and COLD its MISS. verify --trainer writes nothing
into the cache dir, and says what it cost."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from jaxwarm.core.rundir import pinned_config, report_path, verify_config
from testing.procs import alive
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, Cli, run_cli
from tests.test_cli_trainer import FLAGS, RUN, TRAINER, cli_args
from tests.test_verify_writes_nothing import snapshot

pytestmark = pytest.mark.e2e

XLA_FLAGS = "xla_flags=[--xla_backend_optimization_level=0, --xla_cpu_use_fusion_emitters=false"

# name -> (trainer flags, overrides, the expected HIT of (jit_init, jit_train_step)). Each
# change alone: verify --trainer answers from the keys of the trainer's own lookups, which
# changes together reach the way one does (a case of two would be a launch more, telling
# nothing a case of one does not).
CASES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[bool, bool]]] = {
    "unchanged": (FLAGS, (), (True, True)),
    "steps (not in the program)": (("--d-model", "16", "--batch", "4", "--steps", "2"), (),
                                   (True, True)),
    "width": (("--d-model", "24", "--batch", "4"), (), (False, False)),
    "batch": (("--d-model", "16", "--batch", "8"), (), (True, False)),
    "dtype": (("--d-model", "16", "--batch", "4", "--dtype", "bfloat16"), (), (False, False)),
    "donation": ((*FLAGS, "--no-donate"), (), (True, False)),
    "an XLA flag in the config": (FLAGS, (f"{XLA_FLAGS}, --xla_cpu_enable_fast_math=true]",),
                                  (False, False)),
    "the device count": (FLAGS, ("topology.devices_per_process=4",), (False, False)),
}
# More verify --trainer runs of a case's trainer, each with these overrides as well, that
# the case's one launch answers too (the launch runs the trainer, whatever the factory): the
# adapter that keeps its own copy in step.args, the copy unchanged or changed like the
# trainer's flag; verify --trainer asks the trainer, not the copy.
ALSO_VERIFIED: dict[str, tuple[tuple[str, ...], ...]] = {
    "width": (("step.factory=adapter:from_args",),
              ("step.factory=adapter:from_args", "step.args={d_model: 24}")),
}


@pytest.fixture(scope="module")
def prewarmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache one prewarm of the config's flags left."""
    root = tmp_path_factory.mktemp("prewarmed")
    done = run_cli("prewarm", *cli_args(root))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return root / "cache"


def hits(tmp_path: Path) -> tuple[bool, bool]:
    report = json.loads(report_path(tmp_path / "runs" / RUN, "train", 0, 0).read_text())
    found = {fn["name"]: fn["hit"] for fn in report["functions"]}
    return found["jit_init"], found["jit_train_step"]


def verify_answers(prewarmed: Path, args: list[str], expected: tuple[bool, bool]
                   ) -> tuple[bool, bool]:
    """verify --trainer's answers for (jit_init, jit_train_step), WARM as True; it wrote
    nothing into the prewarmed cache and said what it cost."""
    before = snapshot(prewarmed)
    verified = run_cli("verify", "--trainer", *args)
    assert verified.returncode == (0 if all(expected) else 1), \
        verified.stdout + verified.stderr[-3000:]
    assert snapshot(prewarmed) == before
    answered = {}
    for line in verified.stdout.splitlines():
        if line.startswith(("WARM  ", "COLD  ")):
            answered[line.split()[1]] = line.startswith("WARM")
    assert "verify --trainer: " in verified.stdout and "last prewarmed function's lookup" \
        in verified.stdout, verified.stdout
    return answered["jit_init"], answered["jit_train_step"]


@pytest.mark.parametrize("case", list(CASES))
def test_verify_trainer_agrees_with_the_launch(tmp_path: Path, prewarmed: Path,
                                               case: str) -> None:
    flags, overrides, expected = CASES[case]
    args = [*cli_args(tmp_path, *flags), f"cache.dir={prewarmed}",
            "cache.min_compile_time_secs=1000", *overrides]
    answers = [verify_answers(prewarmed, [*args, *more], expected)
               for more in [(), *ALSO_VERIFIED.get(case, ())]]

    launched = run_cli("launch", "--no-prewarm", *args)
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    observed = hits(tmp_path)
    assert all(answered == observed == expected for answered in answers), answers


# Where a trainer blocks -> its command, the time limit, and the one line that ends it. The
# limit counts from the trainer's start: after its jax import, the trainer's watch says
# what it had not heard (the limit leaves the import a wide margin on a busy machine);
# before it, the trainer's start (jaxwarm's call or bootstrap) ends it; before Python, the
# wrapper kills it stop_grace_s later.
BLOCKED = {
    "after importing jax": (
        "import time\nimport jax\ntime.sleep(600)\n", 15,
        "verify --trainer: stopped at the time limit (init_budget_s 15 s): the trainer had "
        "not looked up jit_init, jit_train_step; their answer is unknown"),
    "before importing jax": (
        "import time\ntime.sleep(600)\nimport jax\n", 1,
        "verify --trainer: stopped at the time limit (init_budget_s 1 s from the trainer's "
        "start): the trainer had not imported jax; the answer is unknown"),
    "before reaching Python": (
        None, 1,
        "verify --trainer: stopped at the time limit (init_budget_s 1 s from the trainer's "
        "start, and stop_grace_s 1 s more): /usr/bin/sh had not reached Python with "
        "jaxwarm's recorder; killed it; the answer is unknown"),
}


@pytest.mark.parametrize("blocked", list(BLOCKED))
def test_a_time_limit_ends_it_with_one_line(tmp_path: Path, prewarmed: Path,
                                            blocked: str) -> None:
    """A trainer that never reaches its step within init_budget_s of its start is ended
    there, wherever it blocks, in one line: what it had not looked up is unknown."""
    source, budget, line = BLOCKED[blocked]
    slow = tmp_path / "slow.py"
    slow.write_text(source or "")
    command = f"[{sys.executable}, {slow}]" if source else "[/usr/bin/sh, -c, 'sleep 600']"
    stopped = run_cli("verify", "--trainer", *cli_args(tmp_path), f"cache.dir={prewarmed}",
                      f"init_budget_s={budget}", "stop_grace_s=1",
                      f"entrypoint.command={command}", "entrypoint.args=[]")
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr[-3000:]
    assert line in stopped.stderr, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr


# The test trainer, after it started a helper in a session of its own (a data-loader
# service, a daemon) and wrote the helper's pid to PIDS.
WITH_HELPER = """
import runpy, subprocess, sys
helper = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"],
                          start_new_session=True)
with open({pids!r}, "a") as out:
    out.write(f"{{helper.pid}}\\n")
sys.argv[0] = {train!r}
runpy.run_path({train!r}, run_name="__main__")
"""


def test_a_helper_that_left_the_trainers_session_is_ended(tmp_path: Path,
                                                          prewarmed: Path) -> None:
    """verify --trainer ends the trainer at its answer (os._exit): the helper it started
    in a session of its own (parent pid 1 without a subreaper) is ended too."""
    pids = tmp_path / "pids"
    script = tmp_path / "with_helper.py"
    script.write_text(WITH_HELPER.format(pids=str(pids), train=str(TRAINER / "train.py")))
    try:
        verified = run_cli("verify", "--trainer", *cli_args(tmp_path), f"cache.dir={prewarmed}",
                           f"entrypoint.command=[{sys.executable}, {script}]")
        assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
        assert "WARM  jit_init  " in verified.stdout and "WARM  jit_train_step  " in \
            verified.stdout, verified.stdout
        helpers = [int(pid) for pid in pids.read_text().split()]
        assert len(helpers) == 1 and not alive(helpers[0])
    finally:
        for pid in [int(pid) for pid in pids.read_text().split()] if pids.exists() else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


RUN_SH = '#!/bin/sh\nexec "{python}" "{script}" "$@"\n'


@pytest.mark.parametrize("form", ["module", "function", "shell script"])
def test_every_launch_form_is_asked(tmp_path: Path, prewarmed: Path, form: str) -> None:
    """The same trainer and flags as the prewarm, started as `python -m train`, as the
    function `train:main`, and by a shell script that execs Python (jaxwarm's bootstrap
    installs the recorder there): each reads the same argv, and both functions are WARM."""
    entry = {"module": ["entrypoint.command=null", "entrypoint.module=train"],
             "function": ["entrypoint.command=null", "entrypoint.function=train:main"]}
    if form == "shell script":
        script = tmp_path / "run.sh"
        script.write_text(RUN_SH.format(python=sys.executable,
                                        script=TRAINER / "train.py"))
        script.chmod(0o755)
        entry[form] = [f"entrypoint.command=[{script}]"]
    verified = run_cli("verify", "--trainer", *cli_args(tmp_path), f"cache.dir={prewarmed}",
                       *entry[form])
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
    assert "WARM  jit_init  " in verified.stdout and "WARM  jit_train_step  " in \
        verified.stdout, verified.stdout


def test_a_trainer_that_ends_first_leaves_the_rest_cold(tmp_path: Path,
                                                       prewarmed: Path) -> None:
    """`--steps 0`: the trainer runs its init and ends without a step; the step it never
    looked up is COLD, and said why."""
    verified = run_cli("verify", "--trainer", *cli_args(tmp_path, *FLAGS, "--steps", "0"),
                       f"cache.dir={prewarmed}")
    assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
    assert "WARM  jit_init  " in verified.stdout
    assert "COLD  jit_train_step  -" in verified.stdout
    assert "why: the trainer never looked it up: it ended first" in verified.stdout
    assert "verify --trainer: the trainer ended " in verified.stdout and \
        "s after its start, before it looked up jit_train_step" in verified.stdout


def test_an_answer_is_only_ever_this_verifys_own(tmp_path: Path, prewarmed: Path) -> None:
    """A verify --trainer that answered WARM, then one whose trainer ends without a word
    (`os._exit(0)` once jax is imported, before its first jit; or before it imports jax):
    never the previous answer, left in the run dir, but COLD, saying why."""
    args = [*cli_args(tmp_path), f"cache.dir={prewarmed}"]
    warm = run_cli("verify", "--trainer", *args)
    assert warm.returncode == 0 and "WARM  jit_train_step  " in warm.stdout, \
        warm.stdout + warm.stderr[-3000:]
    for name, code in [("quits.py", "import os\nimport jax\nos._exit(0)\n"),
                       ("early.py", "import os\nos._exit(0)\n")]:
        quits = tmp_path / name
        quits.write_text(code)
        verified = run_cli("verify", "--trainer", *args,
                           f"entrypoint.command=[{sys.executable}, {quits}]", "entrypoint.args=[]")
        assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
        assert "WARM" not in verified.stdout, verified.stdout
        for function in ("jit_init", "jit_train_step"):
            assert f"COLD  {function}  -\n      why: the trainer ended before it looked it up, " \
                   f"and before it wrote any answer" in verified.stdout, verified.stdout
        assert "Traceback" not in verified.stderr


@pytest.fixture(scope="module")
def finished_demo(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The demo launched (one process, the tiny step, one training step): a run that has
    done its steps, as after `make demo`. Its arguments."""
    root = tmp_path_factory.mktemp("finished-demo")
    args = [str(DEMO), "--local", f"run.out_dir={root / 'runs'}", f"cache.dir={root / 'cache'}",
            "train.steps=1", *ONE_PROCESS, *FAST_STEP]
    launched = run_cli("launch", *args)
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    return args


def test_a_finished_run_is_said_as_that(finished_demo: list[str]) -> None:
    """After `make demo`, `verify --trainer` of the same run: the reference trainer resumes
    its last checkpoint, at the last step, and ends before any lookup. Both functions are
    COLD as never looked up, and the answer says why: the run is done."""
    verified = run_cli("verify", "--trainer", *finished_demo)
    assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
    assert "COLD  jit_train_step  -\n      why: the trainer never looked it up: it ended " \
           "first" in verified.stdout
    assert "verify --trainer: run demo has done its 1 steps (its metrics reach step 1): a " \
           "trainer that resumes it has nothing left to run; ask for a new run.name or more " \
           "train.steps" in verified.stdout, verified.stdout
    assert "nothing to train: the run's checkpoint is at step 1 of its train.steps 1" in \
        verified.stderr


def test_status_shows_the_launch_after_a_verify(finished_demo: list[str], cli: Cli) -> None:
    """`jaxwarm status` is about the run's latest launch: a local verify after it (the
    README's next step) leaves its jobs in the record, and its overrides out of the run's
    pinned config (which status and report read: more train.steps there would have them
    call the finished run unfinished)."""
    run_dir = Path(finished_demo[2].split("=", 1)[1]) / "demo"
    pinned = pinned_config(run_dir).read_bytes()
    verified = run_cli("verify", *finished_demo, "train.steps=3")
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
    assert pinned_config(run_dir).read_bytes() == pinned
    assert "steps: 3" in verify_config(run_dir).read_text()
    report = cli("report", str(run_dir))
    assert report.returncode == 0 and "unfinished" not in report.stdout, report.stdout
    status = cli("status", str(run_dir))
    assert status.returncode == 0 and "unfinished" not in status.stdout, status.stdout
    jobs = [line.split()[:3] for line in status.stdout.splitlines() if " local " in line]
    assert jobs == [["prewarm", "local", "COMPLETED"], ["train", "local", "COMPLETED"]], \
        status.stdout


def test_two_processes_answer_for_process_0(tmp_path: Path) -> None:
    """Two processes of one device each (the trainer joins jax.distributed itself): process
    0's answers are the run's, and both processes end (process 0, which runs the
    coordination service, last). Another batch: one WARM answer and one COLD, each the
    launch's."""
    layout = ("topology.processes_per_node=2", "topology.devices_per_process=1",
              "cache.min_compile_time_secs=1000")
    prewarmed = run_cli("prewarm", *cli_args(tmp_path), "topology.processes_per_node=2",
                        "topology.devices_per_process=1")
    assert prewarmed.returncode == 0, prewarmed.stdout + prewarmed.stderr[-3000:]
    args = [*cli_args(tmp_path, "--batch", "8"), *layout]
    verified = run_cli("verify", "--trainer", *args)
    assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
    launched = run_cli("launch", "--no-prewarm", *args)
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    answered = tuple(f"WARM  {name}  " in verified.stdout
                     for name in ("jit_init", "jit_train_step"))
    assert answered == hits(tmp_path) == (True, False), verified.stdout


def test_it_stops_before_the_first_step(tmp_path: Path) -> None:
    """A trainer that checkpoints every step and first calls its third prewarmed function
    (`jit_eval_step`) after step 5: verify --trainer answers what it looked up before its
    first step and stops there, with no step run and nothing written but jaxwarm's own
    verify files (its answer, its log); the eval step is UNKNOWN. With
    --until-all-looked-up the trainer trains up to it and it is answered, WARM."""
    checkpoints = tmp_path / "checkpoints"
    flags = ("--d-model", "16", "--batch", "4", "--steps", "6", "--eval-at", "5",
             "--checkpoint-dir", str(checkpoints))
    args = cli_args(tmp_path, *flags)
    prewarmed = run_cli("prewarm", *args)
    assert prewarmed.returncode == 0, prewarmed.stdout + prewarmed.stderr[-3000:]
    before = {path for path in tmp_path.rglob("*") if path.is_file()}

    verified = run_cli("verify", "--trainer", *args)
    assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
    assert "WARM  jit_init  " in verified.stdout and "WARM  jit_train_step  " in \
        verified.stdout, verified.stdout
    assert "UNKNOWN  jit_eval_step  -\n      why: first called after the first step " \
           "(jit_train_step), which verify --trainer stops before; " in verified.stdout
    assert "stopped before its first step ran (no step, none of its outputs)" in \
        verified.stdout
    assert "[verify p0] step 1" not in verified.stderr, verified.stderr
    run_dir = tmp_path / "runs" / RUN
    written = {path for path in tmp_path.rglob("*") if path.is_file()} - before
    assert written and all(path.parent == run_dir / "verify" or
                           path == run_dir / "logs" / "verify-p0.log" for path in written), \
        sorted(written)

    onward = run_cli("verify", "--trainer", "--until-all-looked-up", *args)
    assert onward.returncode == 0, onward.stdout + onward.stderr[-3000:]
    assert "WARM  jit_eval_step  jit_eval_step-" in onward.stdout, onward.stdout
    assert sorted(path.name for path in checkpoints.iterdir()) == \
        [f"step-{step}.npz" for step in range(1, 6)]

"""The local backend (jaxwarm/submit/local.py) and the supervisor of each of its processes
(jaxwarm/submit/supervise.py) against hostile trainers (class 5 of issue 17): every process
ends. A trainer that never reaches its first step is stopped (train.first_step_timeout_s);
one that ignores SIGTERM/SIGINT is killed after the grace period; a trainer behind a shell
wrapper that does not `exec` is signalled with the wrapper, and a SIGKILLed launcher leaves
no orphan; a training job that exits 0 before its configured steps is reported unfinished
with the step reached; a supervisor sleeps while its command runs (no wake-ups a second per
rank) and still sees it end. No JAX: the trainers here are small Python loops behind
`sh -c`, run by the real launcher and supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxwarm.core.records import TRAIN
from jaxwarm.core.rundir import local_jobs_path, log_path, metrics_path
from testing.procs import alive, run_processes, wait_until
from tests.conftest import DEMO, ONE_PROCESS, REPO, Cli
from tests.hostile import snapshot

pytestmark = [pytest.mark.e2e, pytest.mark.hostile]

# Writes its pid, then loops; with IGNORE it ignores SIGTERM and SIGINT.
SLEEPER = r'''
import os, signal, sys, time
if sys.argv[2] == "IGNORE":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
with open(sys.argv[1], "a") as out:
    out.write(f"{os.getpid()}\n")
while True:
    time.sleep(0.2)
'''


# Starts a helper in a session of its own (it leaves the trainer's process group and
# session, as a daemon or a data-loader service does), writes its pid, and exits; with
# IGNORE the helper ignores SIGTERM.
DETACHER = r'''
import subprocess, sys
helper = subprocess.Popen(
    [sys.executable, "-c", "import signal, sys, time\n"
     "if sys.argv[1] == 'IGNORE': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
     "print('helper up', flush=True)\n"
     "while True: time.sleep(0.2)", sys.argv[2]],
    start_new_session=True, stdout=subprocess.PIPE, text=True)
assert helper.stdout.readline() == "helper up\n"  # its SIGTERM handling is set
with open(sys.argv[1], "a") as out:
    out.write(f"{helper.pid}\n")
'''


def detacher(tmp_path: Path, mode: str = "OBEY") -> list[str]:
    script = tmp_path / "detacher.py"
    script.write_text(DETACHER)
    return [sys.executable, str(script), str(tmp_path / "pids"), mode]


def session_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[3])


def pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def wrapped(pid_file: Path, mode: str = "OBEY") -> str:
    """A shell wrapper without `exec`: the trainer is the shell's child, not the job's."""
    script = pid_file.with_name("sleeper.py")
    script.write_text(SLEEPER)
    return f"{sys.executable} {script} {pid_file} {mode}; echo wrapper done"


def launch_args(tmp_path: Path, command: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jaxwarm", "launch", str(DEMO), "--local", "--no-prewarm",
            "--no-check-cache", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}",
            f"entrypoint.command=[sh, -c, {json.dumps(command)}]", *extra]


def test_a_trainer_without_a_first_step_is_stopped_with_one_line(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    result = subprocess.run(launch_args(tmp_path, wrapped(pid_file), "train.first_step_timeout_s=2",
                                        "stop_grace_s=2"),
                            cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "train: no first step within 2 s (train.first_step_timeout_s); stopped the job" \
        in result.stderr
    assert len(pids(pid_file)) == 2 and not any(alive(p) for p in pids(pid_file))


def test_a_trainer_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    launcher = subprocess.Popen(launch_args(tmp_path, wrapped(pid_file, "IGNORE"),
                                            "stop_grace_s=1"),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        assert wait_until(lambda: len(pids(pid_file)) == 2)
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert "processes it started did not stop within 1 s of SIGTERM; killed them" in err
    assert launcher.returncode == 128 + signal.SIGTERM, err[-3000:]
    # This trainer keeps no checkpoint in the run dir: no promise of a resume.
    assert "relaunch the same command to run it again (no checkpoint in the run dir" in err
    assert "resume from its last checkpoint" not in err
    assert not any(alive(p) for p in pids(pid_file))


def test_a_killed_launcher_leaves_no_orphan_behind_a_shell_wrapper(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    launcher = subprocess.Popen(launch_args(tmp_path, wrapped(pid_file), "stop_grace_s=1"),
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: len(pids(pid_file)) == 2)
        launcher.kill()
        launcher.wait()
        assert wait_until(lambda: not any(alive(p) for p in pids(pid_file)))
    finally:
        for pid in pids(pid_file):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_killed_launcher_leaves_no_orphan_that_ignores_sigterm(tmp_path: Path) -> None:
    """The supervisor of process 0 writes to the dead launcher's pipe when the grace runs
    out; it must SIGKILL the group all the same (issue 28, class 4)."""
    pid_file = tmp_path / "pids"
    run_dir = tmp_path / "runs" / "demo"
    launcher = subprocess.Popen(launch_args(tmp_path, wrapped(pid_file, "IGNORE"),
                                            "stop_grace_s=1"),
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: len(pids(pid_file)) == 2)
        assert run_processes(run_dir)
        launcher.kill()
        launcher.wait()
        assert wait_until(lambda: not run_processes(run_dir)), run_processes(run_dir)
    finally:
        for pid in [*pids(pid_file), *run_processes(run_dir)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_trainer_that_stops_early_is_reported_unfinished(tmp_path: Path, cli: Cli) -> None:
    """Exit 0 at step 3 of 10 (what a trainer does after its requeues ran out)."""
    metrics = metrics_path(tmp_path / "runs" / "demo")
    command = f"echo '{{\"step\": 3, \"loss\": 1.0}}' >> {metrics}"
    before = snapshot(REPO / "configs")
    result = subprocess.run(launch_args(tmp_path, command, "train.steps=10"), cwd=REPO,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "train: training is unfinished: it stopped at step 3 of 10" in result.stderr
    assert snapshot(REPO / "configs") == before
    # `jaxwarm report`, which cannot tell whether a job still runs, says what was logged.
    report = cli("report", str(metrics.parent))
    assert report.returncode == 0, report.stderr[-3000:]
    assert "train: training is unfinished: its last logged step is 3 of 10" in report.stdout
    status = cli("status", str(metrics.parent))
    assert status.returncode == 0, status.stderr[-3000:]
    assert "train: training is unfinished: it stopped at step 3 of 10" in status.stdout


def context_switches(pid: int) -> int:
    """How often a process's threads have been switched out so far (voluntary or not)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if "ctxt_switches" in line:
                total += int(line.split()[1])
    return total


def test_a_supervisor_sleeps_while_its_command_runs_and_wakes_when_it_ends() -> None:
    """One supervisor per rank lives as long as the job: it must not wake while its command
    runs (20 wake-ups a second each were 27,000 context switches at 32 ranks on 2 cores,
    bench.wakeups), and must still see the command end at once. Over a second of its
    command's life it is switched out a few times at most (a busier machine can only lower
    the count); then the command ends and so does the supervisor, with its status."""
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "jaxwarm.submit.supervise", "5", "--", sys.executable,
         "-c", "import sys; print('ready', flush=True); sys.exit(len(sys.stdin.read()))"],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert supervisor.stdin is not None and supervisor.stdout is not None
    try:
        assert supervisor.stdout.readline() == "ready\n"  # the command runs
        before = context_switches(supervisor.pid)
        time.sleep(1.0)
        assert context_switches(supervisor.pid) - before <= 3
        supervisor.stdin.write("ab")
        supervisor.stdin.close()
        assert supervisor.wait(timeout=60) == 2
    finally:
        supervisor.kill()


WRAPPERS = ["the local supervisor", "the SLURM task wrapper"]


def wrapper(kind: str, init_budget_s: float | None = None) -> list[str]:
    """The argv prefix that runs a command under one of the two wrappers, with a grace of
    1 s (and verify --trainer's time limit)."""
    if kind == "the local supervisor":
        limit = [] if init_budget_s is None else ["--init-budget", str(init_budget_s)]
        return [sys.executable, "-m", "jaxwarm.submit.supervise", "1", *limit, "--"]
    return [sys.executable, "-c", "import sys\nfrom jaxwarm.job.start.task import "
            f"TaskCommand\nsys.exit(TaskCommand(sys.argv[1:], grace_s=1, "
            f"init_budget_s={init_budget_s!r})())"]


@pytest.mark.parametrize("kind", WRAPPERS)
def test_a_helper_in_a_session_of_its_own_is_ended_by_the_wrapper(tmp_path: Path,
                                                                kind: str) -> None:
    """The command exits at once, leaving a helper that left its session and ignores
    SIGTERM: the wrapper, its subreaper, SIGKILLs it after the grace, says so in one line,
    and reaps it before it ends itself."""
    try:  # a helper left running would hold the output pipe open: the run's timeout
        done = subprocess.run([*wrapper(kind), *detacher(tmp_path, "IGNORE")], cwd=REPO,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "processes it started did not stop within 1 s of SIGTERM; killed them" \
            in done.stderr
        assert len(pids(tmp_path / "pids")) == 1
        assert not any(alive(pid) for pid in pids(tmp_path / "pids"))
    finally:
        for pid in pids(tmp_path / "pids"):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_launch_leaves_no_helper_that_left_the_trainers_session(tmp_path: Path) -> None:
    """`launch --local`: each process's helper in a session of its own (parent pid 1 once
    the trainer exited, without a subreaper) is ended before the launch returns."""
    command = " ".join(detacher(tmp_path))
    launched = subprocess.run(launch_args(tmp_path, command, "stop_grace_s=5"), cwd=REPO,
                              capture_output=True, text=True, timeout=300, check=False)
    helpers = pids(tmp_path / "pids")
    try:
        assert len(helpers) == 2, launched.stderr[-3000:]
        assert "Traceback" not in launched.stderr
        assert not any(alive(pid) for pid in helpers), \
            [(pid, session_of(pid)) for pid in helpers if alive(pid)]
    finally:
        for pid in helpers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("kind", WRAPPERS)
def test_a_command_past_verifys_time_limit_is_killed_by_the_wrapper(tmp_path: Path,
                                                                    kind: str) -> None:
    """verify --trainer's time limit (init_budget_s) counts from the command's start: a
    command that has not ended (nor answered) stop_grace_s after it, here a shell still
    running a loop that ignores SIGTERM, is killed, with its group, in one line."""
    pid_file = tmp_path / "pids"
    try:
        done = subprocess.run([*wrapper(kind, 1.0), "sh", "-c", wrapped(pid_file, "IGNORE")],
                              cwd=REPO, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode != 0
        assert "jaxwarm: error: verify --trainer: stopped at the time limit (init_budget_s 1 s " \
               "from the trainer's start, and stop_grace_s 1 s more): sh had not reached " \
               "Python with jaxwarm's recorder; killed it; the answer is unknown" \
            in done.stderr, done.stderr[-3000:]
        assert len(pids(pid_file)) == 1 and not alive(pids(pid_file)[0])
    finally:
        for pid in pids(pid_file):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# Writes its pid, waits for GO to exist, then exits 0.
WAITER = r'''
import os, sys, time
with open(sys.argv[1], "a") as out:
    out.write(f"{os.getpid()}\n")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.1)
'''


def test_a_stopped_supervisor_is_taken_over_once_its_command_ended(tmp_path: Path) -> None:
    """Two processes; rank 1's supervisor is SIGSTOPped, then both commands end well. The
    stopped supervisor can neither see its command end nor end it: the launch sees the
    command's end itself (its status, read in /proc), kills the supervisor after
    stop_grace_s, says so in one line, and leaves nothing running."""
    pid_file, go = tmp_path / "pids", tmp_path / "go"
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    run_dir = tmp_path / "runs" / "demo"
    launcher = subprocess.Popen(
        launch_args(tmp_path, f"{sys.executable} {script} {pid_file} {go}", "stop_grace_s=1",
                    "topology.processes_per_node=2"),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: len(pids(pid_file)) == 2)
        [supervisor] = [pid for pid, (rank, line) in run_processes(run_dir).items()
                        if rank == 1 and "jaxwarm.submit.supervise" in line]
        os.kill(supervisor, signal.SIGSTOP)
        go.touch()
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
        for pid in run_processes(run_dir):
            os.kill(pid, signal.SIGKILL)
    assert f"jaxwarm: train: process 1's supervisor (pid {supervisor}) was stopped (SIGSTOP?) " \
           f"after its command ended; killed it and what it started after 1 s " \
           f"(stop_grace_s); process 1 exited with 0" in err, err[-3000:]
    assert "Traceback" not in err
    assert run_processes(run_dir) == {}


# Prints 2 MB of lines, then "done".
CHATTY = r'''
for i in range(40000):
    print(f"line {i:06d} " + "x" * 40)
print("done", flush=True)
'''


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB file system (tmpfs), as a full disk under the run dir; skipped where this
    user cannot mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_full_disk_under_the_run_dir_is_one_line_and_the_output_still_drains(
        tmp_path: Path, small_disk: Path) -> None:
    """Process 0's 2 MB of output fill the run dir's disk: the echo goes on (the trainer
    prints to its end, "done", never blocked on a pipe nobody reads), counts what its log
    did not get and says so once, and the job's end is recorded (not RUNNING) although a
    new copy of the record no longer fits."""
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    before = snapshot(REPO / "configs")
    args = launch_args(tmp_path, f"{sys.executable} {script}", *ONE_PROCESS)
    args[args.index(f"run.out_dir={tmp_path / 'runs'}")] = f"run.out_dir={small_disk}"
    launched = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300,
                              check=False)
    assert "[train p0] done\n" in launched.stderr, launched.stderr[-3000:]
    assert "Traceback" not in launched.stderr
    [dropped] = [line for line in launched.stderr.splitlines() if "could not be written" in line]
    assert dropped.startswith("jaxwarm: train: ") and dropped.endswith(
        f"of process 0's output could not be written to its log "
        f"{log_path(small_disk / 'demo', TRAIN, 0)}: No space left on device; they were echoed "
        f"here only"), dropped
    assert f"jaxwarm: {local_jobs_path(small_disk / 'demo')}: No space left on device while " \
           f"writing the local launch's job states (how train ended); rewrote it in place" \
        in launched.stderr, launched.stderr[-3000:]
    record = json.loads(local_jobs_path(small_disk / "demo").read_text())
    assert [job["state"] for job in record["jobs"]] == ["COMPLETED"], record
    assert snapshot(REPO / "configs") == before

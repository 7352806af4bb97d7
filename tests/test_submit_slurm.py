"""jaxwarm on a real SLURM cluster (4 slurmd on this machine, started by
scripts/slurm-dev-cluster): prewarm -> train HIT, requeue on the time-limit warning and from
outside with the same environment, a failing prewarm cancelling training, and the rendered
sbatch templates giving tasks the same environment as the submitit path."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jaxwarm.core.files import locked
from jaxwarm.core.rundir import (
    checkpoints_dir,
    metrics_path,
    pinned_config,
    report_path,
    step_reached,
    traceback_path,
)
from jaxwarm.store.store import LocalStore, open_store
from jaxwarm.submit.slurm import job_states, read_jobs
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, REPO, Cli, run_cli
from tests.slurm_cluster import (
    ensure_cluster,
    job_field,
    job_fields,
    wait_for,
    wait_for_step_lookup,
    wait_job,
)

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

# Ignored when comparing task environments: per job, per step, per node (the two jobs may
# land on different nodes), or set by the shell itself.
VOLATILE_PREFIXES = ("SLURM_", "SUBMITIT_", "SRUN_", "SLURMD_")
VOLATILE = {"_", "SHLVL", "OLDPWD", "PWD", "ENVIRONMENT", "TMPDIR", "SBATCH_OPEN_MODE",
            "HOSTNAME",
            "COLUMNS", "LINES"}  # terminal size: differs between submitting shells


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    ensure_cluster()


def args_for(tmp_path: Path, *extra: str, cache: Path | None = None) -> list[str]:
    """The demo's processes on SLURM, on conftest's FAST_STEP: what is tested is the jobs'
    life on SLURM (chains, signals, requeues, environments), not the step they compile.
    The runs under TMP_PATH, the cache too unless CACHE is given."""
    return [str(DEMO), "--slurm", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={cache or tmp_path / 'cache'}", *FAST_STEP, *extra]


def report(run_dir: Path, restart: int, job: str = "train") -> dict:
    return json.loads(report_path(run_dir, job, restart, 0).read_text())


def step_hit(report: dict) -> bool:
    return [fn["hit"] for fn in report["functions"] if fn["name"] == "jit_train_step"][-1]


# A training job that runs until a signal stops it. A step of the demo's 2 processes costs
# CPU (their collectives spin); a pause after each step (train.step_pause_s)
# keeps the job from holding both cores for the minutes it waits. Every 2 steps (under 10 s)
# its processes agree whether to stop, well inside SLURM's KillWait of 30 s.
UNTIL_STOPPED = ("train.steps=1000000", "train.step_pause_s=3", "train.log_every=2")
# A training job that only holds its place in the queue: no JAX, no CPU, until scancel.
SLEEPING = ("--no-prewarm", "entrypoint.command=[sleep, '600']")


# The demo's 2 processes on 2 nodes, one each.
TWO_NODES = ("topology.nodes=2", "topology.processes_per_node=1")


# The launch of the two_nodes fixture: the dir args_for was given (the run and the cache are
# under it), and what the launch said.
Launched = tuple[Path, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """The demo launched on 2 nodes (prewarm, then train; --wait), once per module: the
    launch the two-node test checks, and a cache prewarmed under the fingerprint of that
    layout, from which the time-limit test's launch starts with its training job alone."""
    root = tmp_path_factory.mktemp("two-nodes")
    result = run_cli("launch", *args_for(root, "--wait", *TWO_NODES, "train.steps=2"))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return root, result


@pytest.mark.slurm(lane=2)
def test_two_nodes_prewarm_then_train_hits(two_nodes: Launched, cli: Cli) -> None:
    """Prewarm then train on 2 nodes: the step a HIT, the environments the same. (A relaunch
    on the warm cache, --prewarm auto, is the time-limit test's launch.)"""
    tmp_path, result = two_nodes
    run_dir = tmp_path / "runs" / "demo"
    jobs = read_jobs(run_dir)
    assert [j.name for j in jobs] == ["prewarm", "train"]
    assert f"train: SLURM job {jobs[1].job_id}" in result.stdout
    assert {s.state for s in job_states([j.job_id for j in jobs]).values()} == {"COMPLETED"}
    assert step_hit(report(run_dir, 0))
    assert report(run_dir, 0)["environment"] == report(run_dir, 0, "prewarm")["environment"]
    assert "jit_train_step: HIT on process 0" in result.stdout
    status = cli("status", str(run_dir))
    assert status.returncode == 0 and "COMPLETED" in status.stdout
    assert "attempt r0: warm; 2 hit(s)" in status.stdout

    # --prewarm always keeps the chain; the prewarm job verifies, finds every function WARM,
    # and ends without compiling them. (A changed fingerprint chains the prewarm again like
    # the first launch: tests/test_prewarm_auto.py, the same flow on the local runner.) Its
    # training job starts no JAX (`true`): the step's HIT is the first launch's.
    always = run_cli("launch", *args_for(tmp_path, "--wait", *TWO_NODES, "run.name=always",
                                         "entrypoint.command=['true']", "--prewarm", "always"))
    assert always.returncode == 0, always.stdout + always.stderr[-3000:]
    always_dir = tmp_path / "runs" / "always"
    prewarm_job, _ = read_jobs(always_dir)
    assert "every function is WARM: nothing to compile" in prewarm_job.log_path().read_text()
    prewarmed = report(always_dir, 0, "prewarm")["functions"]
    assert not [fn for fn in prewarmed if fn["name"] in ("jit_train_step", "jit_init_state")]


@pytest.mark.slurm(lane=2)
def test_status_shows_what_a_running_prewarm_compiles_with_its_eta(tmp_path: Path,
                                                                  cli: Cli) -> None:
    first = run_cli("prewarm", *args_for(tmp_path, "--wait", *ONE_PROCESS))
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    cache = tmp_path / "cache"
    manifest = open_store(str(cache)).manifest()
    step = next(key for key, e in manifest.items() if e.function == "jit_train_step")
    for entry_file in cache.glob("*-cache"):  # an emptied cache; the manifest stays
        entry_file.unlink()
    # Holding the step's writer lock keeps the second prewarm at its compile (it waits for
    # the writer, as for another prewarm compiling the same key) for as long as we look.
    with locked(LocalStore(cache).writer_lock_path(step), "the test, holding the compile"):
        second = run_cli("prewarm", *args_for(tmp_path, *ONE_PROCESS))
        assert second.returncode == 0, second.stdout + second.stderr[-3000:]
        run_dir = tmp_path / "runs" / "demo"
        pattern = re.compile(r"compiling jit_train_step \(1 of 2; last time [0-9.]+ s on this "
                             r"layout; ETA \d\d:\d\d:\d\d\), [0-9.]+ s elapsed")
        seen = ""

        def shows_progress() -> bool:
            nonlocal seen
            seen = cli("status", str(run_dir)).stdout
            return bool(pattern.search(seen))

        wait_for(shows_progress, 900, "jaxwarm status to show the prewarm's progress")
    assert wait_job(read_jobs(run_dir)[-1].job_id, timeout=900) == "COMPLETED"
    assert "compiling" not in cli("status", str(run_dir)).stdout


@pytest.mark.slurm(lane=2)
def test_a_second_launch_while_the_runs_jobs_are_queued_is_refused(tmp_path: Path,
                                                                 cli: Cli) -> None:
    first = run_cli("launch", *args_for(tmp_path, *SLEEPING))
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "runs" / "demo"
    train = read_jobs(run_dir)[-1]
    try:  # refused before any job or JAX would start: in this process (conftest's `cli`)
        second = cli("launch", *args_for(tmp_path, "--no-prewarm", "train.steps=3"))
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"still has SLURM jobs queued or running: train job {train.job_id}" \
            in second.stderr
        assert len(read_jobs(run_dir)) == 1  # nothing more was submitted
    finally:
        subprocess.run(["scancel", train.job_id], check=True)


def logged_in_attempt(run_dir: Path, restart: int) -> bool:
    """Whether that attempt of the training job has logged a step in the run's metrics."""
    metrics = metrics_path(run_dir)
    return metrics.exists() and any(json.loads(line).get("restart") == restart
                                    for line in metrics.read_text().splitlines())


@pytest.mark.slurm(lane=2)
def test_time_limit_warning_requeues_the_restart_hits_and_then_training_is_unfinished(
        two_nodes: Launched, tmp_path: Path, cli: Cli) -> None:
    """The demo on 2 nodes again, on the first launch's warm cache (the two_nodes fixture's)
    under the same fingerprint (--prewarm auto): one job, the training job alone, which
    loads the step. SLURM's own time-limit warning checkpoints it and requeues it
    (max_requeues=1); the restart resumes from the checkpoint, its step a HIT, with the same
    environment. Warned again, it finds the requeues spent and ends at its checkpoint with
    exit 0, which SLURM calls COMPLETED: the launch that waited for it, `status` and
    `report` say that training is unfinished, and at which step.

    SLURM rounds the limit up to whole minutes (3), so its warning is due 90 s after start;
    it looks at limits every 30 s and sends a warning at the first look less than 30 s before
    it is due (slurmctld's send_job_warn_signal), so it comes 60-90 s in: a shorter limit
    would warn 30-60 s in, which a trainer started on a loaded 2-core machine may not have
    reached its first step by. The restart's warning is sent by hand (`scancel --signal`, to
    the job's tasks as SLURM sends its own) once it has logged a step: the same path as the
    first, without 90 s more of waiting."""
    run_dir = tmp_path / "runs" / "demo"
    launch = subprocess.Popen(
        [sys.executable, "-m", "jaxwarm", "launch",
         *args_for(tmp_path, "--wait", *TWO_NODES, "slurm.time=00:02:30",
                   "slurm.signal_lead_s=90", "slurm.max_requeues=1", *UNTIL_STOPPED,
                   cache=two_nodes[0] / "cache")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(job.name == "train" for job in read_jobs(run_dir))
                 or launch.poll() is not None, 300, "the training job's submission")
        train = read_jobs(run_dir)[-1]
        wait_for(lambda: logged_in_attempt(run_dir, 1), 600,
                 "the restart's first logged step", train)
        subprocess.run(["scancel", "--signal=USR2", train.job_id], check=True)
        _, err = launch.communicate(timeout=600)
    finally:
        launch.kill()
    assert [job.name for job in read_jobs(run_dir)] == ["train"]
    assert job_states([train.job_id])[train.job_id].state == "COMPLETED"
    first, restart = report(run_dir, 0), report(run_dir, 1)
    assert step_hit(first) and step_hit(restart)
    assert restart["restart_count"] == 1 and restart["environment"] == first["environment"]
    log = train.log_path().read_text()
    assert "got SIGUSR2, forwarding SIGUSR1" in log and "requeueing job" in log
    assert "resumed from checkpoint at step" in log
    assert "not requeueing job" in log
    metrics = [json.loads(line) for line in metrics_path(run_dir).read_text().splitlines()]
    assert {m["restart"] for m in metrics} == {0, 1}
    checkpoints = sorted(checkpoints_dir(run_dir).glob("*/meta/metadata"))
    assert checkpoints

    reached = step_reached(run_dir)
    assert reached is not None and 0 < reached < 1000000
    assert launch.returncode == 1, err[-3000:]
    assert f"train: training is unfinished: it stopped at step {reached} of 1000000" in err
    status = cli("status", str(run_dir))
    assert re.search(rf"train +job {train.job_id} +COMPLETED +restarts 1 ", status.stdout)
    assert f"train: training is unfinished: it stopped at step {reached} of 1000000" \
        in status.stdout
    shown = cli("report", str(run_dir))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "prewarm job: skipped (--prewarm auto): the fingerprint" in shown.stdout
    assert f"train: training is unfinished: its last logged step is {reached} of 1000000" \
        in shown.stdout


def test_scontrol_requeue_from_outside_restarts_with_the_same_environment(
        tmp_path: Path) -> None:
    result = run_cli("launch", *args_for(tmp_path, "--no-prewarm", *ONE_PROCESS,
                                         *UNTIL_STOPPED))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "demo"
    train = read_jobs(run_dir)[-1]
    job_id = train.job_id
    wait_for(lambda: logged_in_attempt(run_dir, 0), 600, "the first training steps", train)
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    wait_for_step_lookup(run_dir, 1, train)
    subprocess.run(["scancel", job_id], check=True)
    first, restart = report(run_dir, 0), report(run_dir, 1)
    assert restart["environment"] == first["environment"]
    assert restart["cache_dir"] == first["cache_dir"]
    assert step_hit(restart)
    log = read_jobs(run_dir)[-1].log_path().read_text()
    assert "got SIGTERM: checkpointed at step" in log and "resumed from checkpoint at step" in log


def without(conf: Path, key: str) -> Path:
    """A copy of the cluster's slurm.conf whose `key` port nothing listens on: that daemon
    down, as the submitting side sees it, while the cluster goes on for the other lane.
    Without slurmctld, a client tries it again for MessageTimeout seconds before it gives
    up (9 s of the cluster's 10): the copy's is 3, nothing there could answer."""
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    text = re.sub(rf"^{key}=.*$", f"{key}={port}", conf.read_text(), flags=re.MULTILINE)
    assert f"{key}={port}" in text
    if key == "SlurmctldPort":
        text = re.sub(r"^MessageTimeout=.*$", "MessageTimeout=3", text, flags=re.MULTILINE)
        assert "MessageTimeout=3" in text
    copy = conf.with_name(f"{conf.stem}-no-{key}.conf")
    copy.write_text(text)
    return copy


@pytest.mark.slurm(lane=2)
def test_with_slurmctld_down_a_launch_says_so_in_one_line_and_status_keeps_its_restarts(
        tmp_path: Path, cli: Cli) -> None:
    run_dir = tmp_path / "runs" / "demo"
    sleeper = args_for(tmp_path, *SLEEPING)
    first = run_cli("launch", *sleeper)
    assert first.returncode == 0, first.stderr[-3000:]
    job_id = read_jobs(run_dir)[-1].job_id
    wait_for(lambda: job_field(job_id, "JobState") == "RUNNING", 300, "the job to run")
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    wait_for(lambda: job_fields(job_id).get("JobState") == "RUNNING"
             and job_fields(job_id).get("Restarts") == "1", 300, "the job to run again")
    subprocess.run(["scancel", job_id], check=True)
    assert wait_job(job_id, timeout=300) == "CANCELLED"
    restarted = re.compile(rf"train +job {job_id} +CANCELLED +restarts 1 ")
    assert restarted.search(cli("status", str(run_dir)).stdout)

    conf = tmp_path / "slurm.conf"
    conf.write_text(Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).read_text())
    no_controller = {"SLURM_CONF": str(without(conf, "SlurmctldPort"))}
    again = run_cli("launch", *sleeper, env=no_controller)
    assert again.returncode == 2, again.stdout + again.stderr[-3000:]
    assert again.stderr.splitlines()[-1] == (
        "jaxwarm: error: " + str(DEMO) + ": SLURM did not take the train job: sbatch: error: "
        "Batch job submission failed: Unable to contact slurm controller (connect failure); "
        "nothing was submitted")
    assert again.stderr.count("Unable to contact slurm controller") == 1  # not sbatch's too
    assert [job.job_id for job in read_jobs(run_dir)] == [job_id]
    # Accounting (slurmdbd) still answers: the job and its restart as before.
    status = run_cli("status", str(run_dir), env=no_controller)
    assert status.returncode == 0 and restarted.search(status.stdout), status.stderr

    # Accounting down, slurmctld up: its word (scontrol; it may still be ending the job,
    # COMPLETING, when accounting has it CANCELLED), and said so.
    no_accounting = {"SLURM_CONF": str(without(conf, "AccountingStoragePort"))}
    status = run_cli("status", str(run_dir), env=no_accounting)
    assert status.returncode == 0, status.stderr
    assert re.search(rf"train +job {job_id} +(CANCELLED|COMPLETING) +restarts 1 ",
                     status.stdout), status.stdout
    assert "SLURM accounting did not answer" in status.stderr
    # Neither answers: the restarts are unknown, not 0.
    neither = {"SLURM_CONF": str(without(Path(no_accounting["SLURM_CONF"]), "SlurmctldPort"))}
    status = run_cli("status", str(run_dir), env=neither)
    assert status.returncode == 0, status.stderr
    assert re.search(rf"train +job {job_id} +UNKNOWN +restarts \? ", status.stdout)
    assert "nor did slurmctld (scontrol): states and restarts are unknown" in status.stderr
    assert "Traceback" not in status.stderr + again.stderr


def test_failing_prewarm_cancels_training_and_says_why(tmp_path: Path) -> None:
    """The step factory raises inside the prewarm job (a parser that reads sys.argv and
    refuses a flag, `tests.dying_factory`): the training job is cancelled, and the launch
    says why in one line, the traceback kept in the run's log dir, as a local launch does
    (tests/test_factory_args.py)."""
    raising = "tests.dying_factory:make_train_step_but_refuse_a_flag"
    result = run_cli("launch", *args_for(tmp_path, "--wait", f"step.factory={raising}"))
    assert result.returncode == 1
    run_dir = tmp_path / "runs" / "demo"
    jobs = read_jobs(run_dir)
    assert f"prewarm job {jobs[0].job_id} ended FAILED" in result.stderr
    assert f"so train job {jobs[1].job_id} was cancelled" in result.stderr
    assert job_states([jobs[1].job_id])[jobs[1].job_id].state == "CANCELLED"
    # Both tasks raise; the launch names the one SLURM saw fail first, with its own log.
    failed = re.search(r"ended FAILED: task (\d+): ", result.stderr)
    assert failed, result.stderr[-3000:]
    task = int(failed[1])
    told = traceback_path(run_dir, "prewarm", task)
    line = (f"step.factory: {raising} raised UnrecognizedFlagError: Unknown command line "
            f"flag 'd_model' (its traceback: {told})")
    assert line in result.stderr, result.stderr[-3000:]
    assert line in jobs[0].log_path(task).read_text()
    assert "Traceback" not in result.stderr
    assert told.read_text().startswith("Traceback")


def task_environment(log: Path) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in log.read_text().splitlines() if "=" in line]
    env = {k: v for k, v in pairs if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)}
    return {k: v for k, v in env.items()
            if not k.startswith(VOLATILE_PREFIXES) and k not in VOLATILE}


@pytest.mark.slurm(lane=2)
def test_rendered_templates_run_the_same_job_with_the_same_environment(tmp_path: Path,
                                                                       cli: Cli) -> None:
    args = args_for(tmp_path, "train.steps=2")
    run_dir = tmp_path / "runs" / "demo"

    def submit_rendered(job: str, *extra: str, overrides: tuple[str, ...] = ()) -> str:
        rendered = cli("render", *[a for a in args if a != "--slurm"], *overrides,
                       "--job", job)
        assert rendered.returncode == 0, rendered.stderr
        script = tmp_path / f"{job}.sbatch"
        script.write_text(rendered.stdout)
        # Plain sbatch from the user's own shell environment, as the README says.
        submitted = subprocess.run(["sbatch", "--parsable", *extra, str(script)],
                                   capture_output=True, text=True, check=True)
        return submitted.stdout.strip().split(";")[0]

    prewarm = submit_rendered("prewarm")
    train = submit_rendered("train", f"--dependency=afterok:{prewarm}")
    assert wait_job(train, timeout=600) == "COMPLETED"
    assert step_hit(report(run_dir, 0))

    # The same entrypoint (`env`) through the submitit path and the rendered template, with a
    # value full of shell metacharacters that must arrive literally and run nothing.
    pwned = tmp_path / "pwned"
    nasty = f"$(touch {pwned}); `touch {pwned}` \"'; touch {pwned}"
    dump = ("entrypoint.command=[env]", f"env={{NASTY: {json.dumps(nasty)}}}")
    via_submitit = run_cli("launch", *args, *dump, "--no-prewarm", "--wait")
    assert via_submitit.returncode == 0, via_submitit.stderr[-2000:]
    rendered_job = submit_rendered("train", overrides=dump)
    assert wait_job(rendered_job, timeout=600) == "COMPLETED"
    log_dir = run_dir / "slurm" / "train"
    submitit_env = task_environment(log_dir / f"{read_jobs(run_dir)[-1].job_id}_1_log.out")
    template_env = task_environment(log_dir / f"{rendered_job}_1_log.out")
    assert submitit_env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache")
    assert submitit_env == template_env
    assert submitit_env["NASTY"] == nasty and not pwned.exists()


@pytest.mark.slurm(lane=2)
def test_several_configs_prewarm_as_one_job_array(tmp_path: Path) -> None:
    second = tmp_path / "second.yaml"  # another step: half the demo's batch
    second.write_text(DEMO.read_text().replace("name: demo", "name: second")
                      .replace("global_batch: 16", "global_batch: 8"))
    result = run_cli("prewarm", str(DEMO), str(second), "--slurm", "--wait",
                     f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}",
                     *ONE_PROCESS, *FAST_STEP)
    assert result.returncode == 0, result.stderr[-3000:]
    first_job = read_jobs(tmp_path / "runs" / "demo")[0].job_id
    second_job = read_jobs(tmp_path / "runs" / "second")[0].job_id
    assert first_job.split("_")[0] == second_job.split("_")[0]  # one array, two tasks
    manifest = open_store(str(tmp_path / "cache")).manifest()
    assert {e.run for e in manifest.values()} == {"demo", "second"}
    for run in ("demo", "second"):
        assert report(tmp_path / "runs" / run, 0, "prewarm")["environment"][
            "JAXWARM_CONFIG"] == str(pinned_config(tmp_path / "runs" / run))

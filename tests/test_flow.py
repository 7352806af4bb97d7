"""The launch flow with a fake backend (no process starts), in submitit's style: what the
flow checks, holds and writes before a backend sees the jobs, what it hands the backend,
and how outcomes become exit codes; and, as a user's `jaxwarm` command meets them (e2e), the
run dir's checks: nothing is written before every check passed, one launch per run dir,
`render` writes nothing over a run, a size cap below the run's entries is refused. Also the
SLURM job script, against a golden file and with hostile config strings in it, what a SLURM
submission hands sbatch (sbatch mocked, as submitit's own tests do), how the SLURM watcher
reads sacct (fixture output), and which task a failed SLURM job is blamed on (a real run's
log lines)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.cli import commands
from jaxwarm.core.config import Config, config_digest, load_config
from jaxwarm.core.environment import PINNED_DIGEST, job_environment
from jaxwarm.core.errors import EXIT_ERROR, EXIT_FAILED, ConfigError
from jaxwarm.core.files import LockTimeout, locked
from jaxwarm.core.records import PREWARM, TRAIN, VERIFY, LocalJobState
from jaxwarm.core.rundir import (
    checkpoints_dir,
    earlier_reports_dir,
    lock_path,
    log_path,
    metrics_path,
    pinned_config,
    report_path,
    reports_dir,
    slurm_dir,
    submitted_jobs_path,
    verify_config,
)
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore
from jaxwarm.submit import flow
from jaxwarm.submit.backend import Outcome, Run, recorded_backend
from jaxwarm.submit.jobs import JobSpec
from jaxwarm.submit.local import JobResult, LocalBackend, outcome, record_states
from jaxwarm.submit.prepare import pin_config
from jaxwarm.submit.sbatch import render
from jaxwarm.submit.slurm import SlurmBackend, read_jobs, submit_jobs, watcher
from tests.conftest import DEMO, Cli
from tests.hostile import assert_refused, key, snapshot

GOLDEN = Path(__file__).parent / "golden"


@dataclass
class FakeBackend:
    """Records what the flow asks; every job ends as `outcome` says."""

    runs_in_foreground: bool = True
    busy: str | None = None
    outcome: Outcome | None = None
    name: str = "fake"
    # The training job's state in job_lines, and the last step its trainer logs (if any).
    train_state: str = "RUNNING"
    logs_step: int | None = None
    calls: list[str] = field(default_factory=list)
    submitted: list[list[tuple[str, list[str]]]] = field(default_factory=list)

    def refuse_platform(self, config: Config) -> None:
        self.calls.append(f"refuse_platform {config.run.name}")

    def refuse_busy(self, config: Config) -> None:
        # The flow holds the run dir's lock while it asks.
        with pytest.raises(LockTimeout):
            with locked(lock_path(config.run_dir), "test", timeout_s=0):
                pass
        self.calls.append(f"refuse_busy {config.run.name}")
        if self.busy:
            raise ConfigError(self.busy)

    def submit(self, runs: list[Run]) -> list[list[str]]:
        for run in runs:  # pinned before any job is handed over, with its checksum
            assert run.pinned.is_file()
            assert all(Path(job.env["JAXWARM_CONFIG"]) == run.pinned for job in run.jobs)
            assert all(job.env[PINNED_DIGEST] == config_digest(run.pinned.read_bytes())
                       for job in run.jobs)
        self.calls.append("submit")
        for run in runs:
            if self.logs_step is not None:
                metrics_path(run.config.run_dir).write_text(f'{{"step": {self.logs_step}}}\n')
        self.submitted.append([(run.config.run.name, [job.name for job in run.jobs])
                               for run in runs])
        return [[job.name for job in run.jobs] for run in runs]  # a job's handle: its name

    def follow(self, handles: list[str]) -> list[Outcome]:
        self.calls.append(f"follow {handles}")
        return [self.outcome or Outcome(name, True) for name in handles]

    def hints(self, config: Config, handles: list[str]) -> list[str]:
        return [f"follow {config.run.name} with: fake status"]

    def job_lines(self, run_dir: Path) -> list[str]:
        return [f"train job 1 {self.train_state} in {run_dir.name}"]


def request(tmp_path: Path, command: str = "launch", *configs: Path, **options: Any):
    return flow.Request(command, [str(c) for c in configs or (DEMO,)],
                        [f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}"],
                        **options)


def test_launch_checks_holds_pins_then_submits_the_chain_and_reports(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backend = FakeBackend()
    assert flow.launch(request(tmp_path), backend) == 0
    assert backend.calls == ["refuse_platform demo", "refuse_busy demo", "submit",
                             "follow ['prewarm', 'train']"]
    assert backend.submitted == [[("demo", ["prewarm", "train"])]]
    # The report of a training job that wrote none says so.
    assert "the training job wrote no init report" in capsys.readouterr().out
    # The lock is released at the end.
    with locked(lock_path(tmp_path / "runs" / "demo"), "test", timeout_s=0):
        pass


@pytest.mark.parametrize("mode, line", [
    ("never", "prewarm job: skipped (--prewarm never): the training job compiles what is not "
              "in the cache"),
    ("always", "prewarm job: ran (--prewarm always): asked for")])
def test_the_report_says_the_prewarm_mode_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               mode: str, line: str) -> None:
    assert flow.launch(request(tmp_path, prewarm=mode), FakeBackend()) == 0
    assert line in capsys.readouterr().out.splitlines()


def test_a_busy_run_dir_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    backend = FakeBackend(busy="run dir busy")
    with pytest.raises(ConfigError, match="run dir busy"):
        flow.launch(request(tmp_path), backend)
    assert "submit" not in backend.calls
    assert not pinned_config(tmp_path / "runs" / "demo").exists()


def overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}", *extra]


def pinned_run(tmp_path: Path) -> Path:
    """A run dir as an earlier launch left it: its pinned config is what requeued jobs read."""
    config, pinned = pin_config(load_config(DEMO, overrides(tmp_path)))
    return config.run_dir


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_launch_refused_after_loading_leaves_the_pinned_config_alone(
        tmp_path: Path, cli: Cli) -> None:
    run_dir = pinned_run(tmp_path)
    before = snapshot(tmp_path)
    result = cli("launch", str(DEMO), "--local",
                 *overrides(tmp_path, "entrypoint.command=[no-such-trainer]",
                            "train.steps=99"))
    assert_refused(result, "entrypoint.command: 'no-such-trainer' was not found")
    assert snapshot(tmp_path) == before
    assert "steps: 99" not in pinned_config(run_dir).read_text()


@pytest.mark.e2e
@pytest.mark.hostile
def test_render_writes_nothing_over_a_run(tmp_path: Path, cli: Cli) -> None:
    run_dir = pinned_run(tmp_path)
    pinned = pinned_config(run_dir).read_bytes()
    before = snapshot(tmp_path)
    for job in ("prewarm", "train"):
        result = cli("render", str(DEMO), *overrides(tmp_path, "train.steps=99"),
                     "--job", job)
        assert_refused(result, "is pinned to other values")
    assert snapshot(tmp_path) == before
    # The run's own config renders, and its pinned config stays as it was.
    same = cli("render", str(DEMO), *overrides(tmp_path), "--job", "train")
    assert same.returncode == 0 and "#SBATCH" in same.stdout, same.stderr
    assert pinned_config(run_dir).read_bytes() == pinned
    # A new run dir gets what its script needs to run under plain sbatch, and no more.
    fresh = tmp_path / "fresh"
    result = cli("render", str(DEMO), f"run.out_dir={fresh}", f"cache.dir={fresh}/c",
                 "--job", "train")
    assert result.returncode == 0, result.stderr
    assert pinned_config(fresh / "demo").is_file()
    assert slurm_dir(fresh / "demo", TRAIN).is_dir()
    assert not reports_dir(fresh / "demo").exists()


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_second_launch_of_a_busy_run_dir_is_refused_naming_the_first(
        tmp_path: Path, cli: Cli) -> None:
    run_dir = pinned_run(tmp_path)
    # This test process plays the first launch: it holds the run dir's lock, as a launch does
    # for its whole life.
    with locked(lock_path(run_dir), "run dir"):
        before = snapshot(tmp_path)
        for command in ("launch", "prewarm", "verify"):
            result = cli(command, str(DEMO), "--local", *overrides(tmp_path, "train.steps=99"))
            assert_refused(result, f"run dir {run_dir} is in use by pid {os.getpid()} on ")
        assert snapshot(tmp_path) == before
    assert not checkpoints_dir(run_dir).exists()


@pytest.mark.e2e
@pytest.mark.hostile
def test_two_configs_of_one_prewarm_cannot_share_a_run_dir(tmp_path: Path, cli: Cli) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(DEMO.read_text())
    result = cli("prewarm", str(DEMO), str(other), "--local", *overrides(tmp_path))
    assert_refused(result, f"run dir {tmp_path / 'runs' / 'demo'} is also the run dir of")
    assert not (tmp_path / "runs").exists()


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_size_cap_below_the_prewarmed_entries_is_refused(tmp_path: Path, cli: Cli) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    LocalStore(cache).record_entries([
        ManifestEntry(function=f"jit_f{n}", key=key(n), run="demo", config=str(DEMO),
                      compile_s=1.0, lower_s=0.1, written=True, jax_version="0.10.2",
                      process_count=1, sha256="0" * 64, size=1000) for n in (1, 2)])
    before = snapshot(tmp_path)
    result = cli("launch", str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
                 f"cache.dir={cache}", "cache.max_size=1500")
    assert_refused(result, "cache.max_size: 1500 bytes is less than the 2000 bytes of the 2 "
                           "entries run 'demo' prewarms")
    assert snapshot(tmp_path) == before


def test_bad_input_is_refused_before_the_backend_is_asked(tmp_path: Path) -> None:
    backend = FakeBackend()
    with pytest.raises(ConfigError, match="only 'prewarm' takes several"):
        flow.launch(request(tmp_path, "launch", DEMO, DEMO), backend)
    with pytest.raises(ConfigError, match="step.factory: module 'nope' was not found"):
        flow.launch(flow.Request("launch", [str(DEMO)], ["step.factory=nope:make"]), backend)
    assert backend.calls == []


def test_a_job_that_did_not_complete_sets_the_exit_code(tmp_path: Path) -> None:
    failed = Outcome("prewarm", False, "prewarm failed: see its log", EXIT_FAILED)
    assert flow.launch(request(tmp_path), FakeBackend(outcome=failed)) == EXIT_FAILED
    interrupted = Outcome("train", False, "stopped by a signal", 128 + 15)
    assert flow.launch(request(tmp_path), FakeBackend(outcome=interrupted)) == 143


def test_a_failed_verify_job_is_an_error_not_a_cold_verdict(tmp_path: Path) -> None:
    failed = Outcome("verify", False, "verify failed", EXIT_FAILED)
    backend = FakeBackend(outcome=failed)
    assert flow.verify(request(tmp_path, "verify"), backend) == EXIT_ERROR
    assert backend.submitted == [[("demo", ["verify"])]]


def test_a_verify_leaves_the_runs_pinned_config_as_it_was(tmp_path: Path) -> None:
    """A verify asks about a would-be run: its overrides go into the config its own job
    reads (`verify_config`), never into the run's, which the run's report reads."""
    assert flow.launch(request(tmp_path), FakeBackend()) == 0
    run_dir = tmp_path / "runs" / "demo"
    before = pinned_config(run_dir).read_bytes()
    asked = request(tmp_path, "verify")
    asked = flow.Request("verify", asked.configs, [*asked.overrides, "train.steps=99"])
    failed = Outcome("verify", False, "verify failed", EXIT_FAILED)
    assert flow.verify(asked, FakeBackend(outcome=failed)) == EXIT_ERROR
    assert pinned_config(run_dir).read_bytes() == before
    assert load_config(verify_config(run_dir)).train.steps == 99
    assert load_config(pinned_config(run_dir)).train.steps != 99


def test_several_configs_of_one_prewarm_go_to_the_backend_at_once(tmp_path: Path) -> None:
    second = tmp_path / "second.yaml"
    second.write_text(DEMO.read_text().replace("name: demo", "name: second"))
    backend = FakeBackend()
    assert flow.launch(request(tmp_path, "prewarm", DEMO, second), backend) == 0
    assert backend.submitted == [[("demo", ["prewarm"]), ("second", ["prewarm"])]]
    assert backend.calls[:4] == ["refuse_platform demo", "refuse_platform second",
                                 "refuse_busy demo", "refuse_busy second"]


def test_a_queueing_backend_prints_how_to_follow_unless_asked_to_wait(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backend = FakeBackend(runs_in_foreground=False)
    assert flow.launch(request(tmp_path, "launch", prewarm="never"), backend) == 0
    assert backend.submitted == [[("demo", ["train"])]]
    assert not [call for call in backend.calls if call.startswith("follow")]
    assert "follow demo with: fake status" in capsys.readouterr().out
    waiting = FakeBackend(runs_in_foreground=False)
    assert flow.launch(request(tmp_path, "launch", wait=True), waiting) == 0
    assert waiting.calls[-1] == "follow ['prewarm', 'train']"


def test_status_asks_the_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.status(tmp_path, FakeBackend()) == 0
    assert f"train job 1 RUNNING in {tmp_path.name}" in capsys.readouterr().out


def test_status_reads_the_latest_launch_s_backend(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A local launch records its jobs as it runs them (`local-jobs.json`): status shows
    them instead of "no SLURM jobs recorded"; a job RUNNING in the record whose launch is
    gone (no one holds the run dir) is LOST; the newer of a local and a SLURM record wins."""
    run_dir = tmp_path / "runs" / "demo"
    with pytest.raises(ConfigError, match="no jobs recorded for this run dir"):
        commands.status(run_dir, recorded_backend(run_dir))
    log = str(log_path(run_dir, PREWARM, 0))
    run_dir.mkdir(parents=True)
    record_states(run_dir, [
        LocalJobState("prewarm", "COMPLETED", 2, log, 100.0, 112.5, 0),
        LocalJobState("train", "RUNNING", 2, log.replace("prewarm", "train"), 113.0)])
    backend = recorded_backend(run_dir)
    assert isinstance(backend, LocalBackend)
    with locked(lock_path(run_dir), "the test's launch"):
        running = backend.job_lines(run_dir)
    assert running[0] == f"prewarm  local        COMPLETED   2 process(es), exit 0 after " \
                         f"12.5 s  log {log}"
    assert running[1].startswith("train    local        RUNNING     2 process(es), since ")
    assert commands.status(run_dir, backend) == 0
    assert "train    local        LOST        its launch ended without recording how" \
        in capsys.readouterr().out
    submitted_jobs_path(run_dir).parent.mkdir()
    submitted_jobs_path(run_dir).write_text("[]")  # a SLURM launch after it
    assert isinstance(recorded_backend(run_dir), SlurmBackend)


def test_training_that_ended_before_its_steps_is_unfinished_for_launch_status_and_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """A job whose requeues ran out exits 0 at its checkpoint: SLURM says COMPLETED. The
    launch that waited for it fails with the step reached; `status` says so once the job
    has ended (not while it runs; as logged so far when SLURM cannot say); `report`, which
    does not ask, says what was logged."""
    completed = FakeBackend(runs_in_foreground=False, train_state="COMPLETED", logs_step=3)
    assert flow.launch(request(tmp_path, "launch", wait=True, prewarm="never"),
                       completed) == EXIT_FAILED
    run_dir = tmp_path / "runs" / "demo"
    stopped = "train: training is unfinished: it stopped at step 3 of 8"
    assert stopped in caplog.text
    assert commands.status(run_dir, completed) == 0
    assert stopped in capsys.readouterr().out
    assert commands.status(run_dir, FakeBackend(train_state="RUNNING")) == 0
    assert "unfinished" not in capsys.readouterr().out
    logged = "train: training is unfinished: its last logged step is 3 of 8"
    assert commands.status(run_dir, FakeBackend(train_state="UNKNOWN")) == 0
    assert logged in capsys.readouterr().out
    assert commands.show_report(run_dir) == 0
    assert logged in capsys.readouterr().out


def test_the_rendered_train_script_matches_the_golden_file() -> None:
    """`jaxwarm render --job train` on a fixed config: the directives, the quoted
    environment, the signal forwarding and the requeue. JAXWARM_UPDATE_GOLDEN=1 rewrites
    the file after a deliberate change (review the diff)."""
    config = load_config(DEMO, ["run.out_dir=/runs", "cache.dir=/shared/jax cache",
                                "slurm.partition=gpu", "slurm.max_requeues=2",
                                "env={WANDB_PROJECT: \"it's $HOME\"}"])
    env = job_environment(config, "/runs/demo/config.yaml")
    script = render(config, "train", ["jaxwarm-train"], env, Path("/runs/demo/slurm/train"))
    golden = GOLDEN / "train.sbatch"
    if os.environ.get("JAXWARM_UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()


@pytest.mark.e2e
@pytest.mark.hostile
def test_what_is_allowed_arrives_quoted_one_line_per_directive(tmp_path: Path, cli: Cli) -> None:
    odd = tmp_path / "my runs; $(touch pwned) 'x'"
    result = cli("render", str(DEMO), f"run.out_dir={odd}", f"cache.dir={tmp_path / 'c'}",
                 "env={SAFE: \"$(touch pwned); `id` 'q'\"}", "slurm.extra={gres: gpu:8}",
                 "--job", "train")
    assert result.returncode == 0, result.stderr
    script = result.stdout
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert all(line.startswith("#SBATCH --") for line in directives)
    output, = [line for line in directives if line.startswith("#SBATCH --output=")]
    assert output == "#SBATCH --output=" + shlex.quote(
        f"{odd / 'demo' / 'slurm' / 'train'}/%j_0_log.out")
    assert "export SAFE=" + shlex.quote("$(touch pwned); `id` 'q'") in script
    # The setup lines run in a real shell without running anything from the config.
    setup = [line for line in script.splitlines() if line.startswith("export ")]
    subprocess.run(["bash", "-c", "\n".join(setup)], cwd=tmp_path, check=True)
    assert not (tmp_path / "pwned").exists()


def test_the_slurm_watcher_reads_state_reason_and_restarts_from_one_sacct_call() -> None:
    sacct = watcher()
    info = sacct.read_info(
        "JobID|State|NodeList|Reason\n"
        "41|REQUEUED|n1|None\n41.batch|CANCELLED|n1|\n"
        "41|RUNNING|n[1-2]|None\n41.batch|RUNNING|n1|\n41.0|RUNNING|n[1-2]|\n"
        "42|PENDING|None assigned|Dependency\n")
    assert info["41"]["State"] == "RUNNING" and info["41"]["Restarts"] == "1"
    assert info["42"]["Reason"] == "Dependency" and info["42"]["Restarts"] == "0"
    sacct.register_job("41")
    command = sacct._make_command()
    assert "JobID,State,NodeList,Reason" in command
    assert "--duplicates" in command


def test_a_refused_submission_is_one_line_naming_what_slurm_took_before(
        capsys: pytest.CaptureFixture[str]) -> None:
    """sbatch refusing the training job after it took the prewarm (slurmctld gone between
    the two): submitit's error, in sbatch's words, becomes the one line, and submitit's
    echo of sbatch's stderr does not reach the terminal. (On the dev cluster, with
    nothing taken: tests/test_submit_slurm.py.)"""
    from submitit.core.utils import FailedJobError

    from jaxwarm.submit.slurm import SubmitRefused, SubmittedJob, submitting

    words = ("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
             "(connect failure)")
    with pytest.raises(SubmitRefused) as refused:
        with submitting(load_config(DEMO), "train", [SubmittedJob("prewarm", "41", "/l", 0.0)]):
            print(words, file=sys.stderr)
            raise FailedJobError(words)
    assert str(refused.value) == (f"{DEMO}: SLURM did not take the train job: {words}; it "
                                  f"took prewarm job 41 before (jaxwarm status shows it; "
                                  f"scancel drops it)")
    assert capsys.readouterr().err == ""


# Task 0's log of a 4-task job whose task 3 was SIGKILLed (a real run's lines): the batch
# script's output (srun's account) and task 0's own output share the file.
KILLED_TASK_3 = """\
submitit INFO (2026-11-26 09:37:31,358) - Starting with JobEnvironment(job_id=733_1, \
hostname=vm, local_rank=0(2), node=0(2), global_rank=0(4))
chunkwise step: 0.000B params, 1 chunks of 4 x 8 tokens, mesh {'data': 2, 'fsdp': 2}
srun: error: n2: task 3: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=733_1.0
slurmstepd-n1: error: *** STEP 733_1.0 ON n1 CANCELLED AT 2026-11-26T09:37:34 ***
srun: error: n2: task 2: Killed
srun: error: n1: tasks 0-1: Killed
srun: Force Terminated StepId=733_1.0
"""


def test_a_failed_slurm_job_names_the_task_srun_saw_end_first(tmp_path: Path) -> None:
    """SLURM ends the other tasks after the first bad exit; one that lost the coordination
    service on the way may say so before it goes, and a requeued job's log keeps the earlier
    attempts: the job's cause is still the first task srun named in the last attempt."""
    from jaxwarm.submit.slurm import SubmittedJob, why_cancelled

    job = SubmittedJob("train", "733_1", str(tmp_path), 0.0)
    earlier = KILLED_TASK_3.replace("task 3: Exited with exit code 1", "task 1: Killed")
    job.log_path(0).write_text(earlier + KILLED_TASK_3)
    job.log_path(2).write_text(
        "jaxwarm: error: the job's coordination service (run by process 0) stopped answering "
        "while this rank was waiting for the other ranks after jit_init_state: UNAVAILABLE\n")
    job.log_path(3).write_text("jaxwarm: error: python was killed by SIGKILL\n")
    said = why_cancelled([job], {"733_1": "FAILED"})
    assert said == (f"train job 733_1 ended FAILED: task 3: python was killed by SIGKILL; "
                    f"its log: {job.log_path(3)}")

    job.log_path(3).write_text("Traceback (most recent call last):\n")  # said nothing
    assert why_cancelled([job], {"733_1": "FAILED"}) == (
        f"train job 733_1 ended FAILED: task 3: srun: Exited with exit code 1; "
        f"its log: {job.log_path(3)}")

    job.log_path(0).unlink()  # no srun account: the lowest task that said why
    assert why_cancelled([job], {"733_1": "FAILED"}).startswith(
        "train job 733_1 ended FAILED: task 2: the job's coordination service")


class MockedSbatch:
    """sbatch for submitit, in the style of submitit's own `MockedSubprocess`
    (`submitit/core/test_core.py`): each call reads the job script it is given and answers
    as sbatch does, with job ids from 12 on. No cluster is needed to see what jaxwarm asks
    SLURM for; tests/test_submit_slurm.py runs the same submission on a real one."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def __call__(self, command: list[str], **_: Any) -> Any:
        assert command[0] == "sbatch", command
        self.scripts.append(Path(command[1]).read_text())
        return lambda: f"Submitted batch job {11 + len(self.scripts)}\n".encode()


def slurm_commands(where: Path, *names: str) -> str:
    """A PATH of `where` holding stand-ins of SLURM's commands `names`, each failing as a
    command that reached no controller would: SLURM need not be installed for the tests
    that mock it (a fresh machine has no srun, and submitit's executor refuses to exist
    without one)."""
    where.mkdir(exist_ok=True)
    for name in names:
        (where / name).write_text(f"#!/bin/sh\necho '{name}: no cluster here' >&2\nexit 1\n")
        (where / name).chmod(0o755)
    return str(where)


def sbatch_directives(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].partition("=")[::2] for line in script.splitlines()
                if line.startswith("#SBATCH --"))


def test_a_slurm_submission_chains_prewarm_and_train_with_the_golden_directives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `jaxwarm launch --slurm` hands sbatch (submitit's script), with sbatch mocked:
    the prewarm job, then the training job after it (afterok) with the same directives and
    environment as the rendered golden script, and both recorded for `jaxwarm status`."""
    import submitit
    import submitit.core.utils

    sbatch = MockedSbatch()
    monkeypatch.setattr(submitit.core.utils, "CommandFunction", sbatch)
    monkeypatch.setenv("PATH", slurm_commands(tmp_path / "bin", "srun") + os.pathsep +
                       os.environ["PATH"])
    golden_config = load_config(DEMO, ["run.out_dir=/runs", "cache.dir=/shared/jax cache",
                                       "slurm.partition=gpu", "slurm.max_requeues=2",
                                       "env={WANDB_PROJECT: \"it's $HOME\"}"])
    env = job_environment(golden_config, "/runs/demo/config.yaml")
    config = dataclasses.replace(golden_config, run=dataclasses.replace(golden_config.run,
                                                                        out_dir=str(tmp_path)))
    jobs = [JobSpec(PREWARM, ["python", "-m", "jaxwarm.job.prewarm"], env),
            JobSpec(TRAIN, ["jaxwarm-train"], env)]
    try:
        submitted = submit_jobs(config, jobs)
    finally:
        submitit.SlurmJob.watcher.clear()  # submitit's shared watcher forgets the fake ids

    assert [(job.name, job.job_id) for job in submitted] == [(PREWARM, "12"), (TRAIN, "13")]
    assert read_jobs(config.run_dir) == submitted
    prewarm, train = (sbatch_directives(script) for script in sbatch.scripts)
    assert prewarm["job-name"] == "jaxwarm-demo-prewarm"
    assert "dependency" not in prewarm and "requeue" not in prewarm
    assert train["dependency"] == "afterok:12" and train["kill-on-invalid-dep"] == "yes"
    golden_text = (GOLDEN / "train.sbatch").read_text()
    golden = sbatch_directives(golden_text)
    for name in ("job-name", "nodes", "ntasks-per-node", "cpus-per-task", "time", "partition",
                 "requeue"):
        assert train[name] == golden[name], name
    # The warning ahead of the time limit: the tasks get it here (each task's TaskCommand
    # requeues), the rendered script's batch shell (B:) forwards it to them.
    assert golden["signal"] == f"B:{train['signal']}" == "B:USR2@300"
    # Every task gets the golden script's environment, exported the same way.
    exports = [line for line in golden_text.splitlines() if line.startswith(("export ",
                                                                             "for _v in"))]
    for script in sbatch.scripts:
        assert all(line in script.splitlines() for line in exports)


def test_slurm_without_its_commands_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without SLURM's client commands (not a login node): `--slurm` says so in
    one line, before the run dir or the cache exists."""
    monkeypatch.setenv("PATH", slurm_commands(tmp_path / "bin", "sbatch"))
    request = flow.Request("launch", [str(DEMO)], [f"run.out_dir={tmp_path / 'runs'}",
                                                   f"cache.dir={tmp_path / 'cache'}"])
    with pytest.raises(ConfigError) as caught:
        flow.launch(request, SlurmBackend())
    assert str(caught.value) == (
        f"{DEMO}: SLURM jobs need sbatch and srun on PATH, and srun is not here (SLURM's "
        f"client commands are not installed on this machine): submit from a login node of "
        f"the cluster, or run with --local")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_a_relaunch_keeps_the_earlier_launch_s_reports(tmp_path: Path) -> None:
    """A launch's jobs write their reports under the same names as the launch before them
    (`train-r0-p0.json`): the earlier ones are moved aside first, numbered, never
    overwritten; `jaxwarm report` reads the latest launch's."""
    run_dir = tmp_path / "runs" / "demo"
    for attempt in (1, 2):
        report_path(run_dir, TRAIN, 0, 0).parent.mkdir(parents=True, exist_ok=True)
        report_path(run_dir, TRAIN, 0, 0).write_text(f"attempt {attempt}\n")
        assert flow.launch(request(tmp_path, prewarm="never"), FakeBackend()) == 0
        assert not report_path(run_dir, TRAIN, 0, 0).exists()
        assert (earlier_reports_dir(run_dir, attempt) / "train-r0-p0.json").read_text() == \
            f"attempt {attempt}\n"


@pytest.mark.parametrize("checkpointed, says", [
    (True, "train stopped after a forwarded signal; relaunch the same command to resume "
           "from its last checkpoint"),
    (False, "train stopped after a forwarded signal; relaunch the same command to run it "
            "again (no checkpoint in the run dir: it starts over unless the trainer keeps "
            "its own)")])
def test_a_stopped_job_says_resume_only_with_a_checkpoint(checkpointed: bool, says: str) -> None:
    stopped = JobResult(TRAIN, 0, signal_received=15, checkpointed=checkpointed)
    assert outcome(stopped).detail == says


def test_a_job_stopped_by_a_forwarded_signal_says_what_to_do_for_its_kind() -> None:
    """Ctrl-C forwarded to a job: only a training job resumes from a checkpoint; an
    interrupted verify said so too, and has none (nor an answer)."""
    said = {job: outcome(JobResult(job, -2, signal_received=signal.SIGINT, checkpointed=True))
            for job in (PREWARM, VERIFY, TRAIN)}
    assert {job: o.exit_code for job, o in said.items()} == dict.fromkeys(said, 130)
    assert said[VERIFY].detail == ("verify stopped after a forwarded signal; it gave no "
                                   "answer; run the verify again")
    assert "checkpoint" not in said[PREWARM].detail + said[VERIFY].detail
    assert said[TRAIN].detail.endswith("resume from its last checkpoint")

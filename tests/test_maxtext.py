"""MaxText, unchanged from PyPI, wrapped by examples/maxtext: its `jit_train_step` and its
state init (`jit__lambda`) are HITs in the training job on 2 processes
(hardware=gpu_multiprocess) on the SLURM dev cluster (2 nodes x 1 process), in the first
attempt and after a requeue by signal that resumes from MaxText's own preemption checkpoint,
warm.

It runs in MaxText's own venv (`make test` and `make maxtext` build `.venvs/maxtext`,
`testing/legs.py`; `make maxtext` runs this file alone), as a user runs it: `jaxwarm
prewarm`, `jaxwarm verify` and `jaxwarm verify --trainer` (WARM), then `jaxwarm launch`,
from a working directory of its own so that the example config's relative
paths land there. MaxText's own `jax_cache_dir` is set (as
its KEY=VALUE override, through the M_JAX_CACHE_DIR variable MaxText reads) to a dir that must
stay empty: the guard keeps jaxwarm's dir in force. One flow tells the whole story: a local
run of the same commands on 1 process told it a second time (the local launcher runs the
demo: tests/test_demo.py). Skipped, with the reason, where no Python 3.12/3.13 is
installed or the venv is not built (`make legs` builds it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.core.records import SETTING_CHANGED, TRAIN
from jaxwarm.core.rundir import report_path, report_paths
from jaxwarm.store.store import LocalStore
from jaxwarm.submit.slurm import read_jobs
from testing.legs import MAXTEXT, REPO, Leg, leg_python, ready
from tests.conftest import Cli
from tests.slurm_cluster import ensure_cluster, wait_for_step_lookup, wait_job

pytestmark = pytest.mark.e2e

CONFIG = REPO / "examples" / "maxtext" / "maxtext-cpu.yaml"
# docs/maxtext.md's SLURM launch: the README's 2-process layout (MaxText joins the processes
# itself) on 2 nodes, and a run long enough to be
# stopped by signal only: SLURM's warning (USR2) is forwarded as SIGTERM, which JAX's
# preemption notifier hears; MaxText checkpoints at the step its processes agree on
# (enable_autocheckpoint) and ends, and the requeued job restores that checkpoint. Orbax
# checkpoints into an absolute dir only.
TWO_NODES = ("--slurm", "topology.nodes=2", "topology.devices_per_process=2",
             "env.M_HARDWARE=gpu_multiprocess", 'env.M_SKIP_JAX_DISTRIBUTED_SYSTEM="false"')
UNTIL_PREEMPTED = ('env.M_STEPS="1000000"', "train.steps=1000000",
                   'env.M_ENABLE_CHECKPOINTING="true"', 'env.M_ENABLE_AUTOCHECKPOINT="true"',
                   'env.M_ASYNC_CHECKPOINTING="false"', "slurm.signal=TERM",
                   "slurm.max_requeues=1")
MODULE_FORM = ("entrypoint.module: maxtext.trainers.pre_train.train runs as python -m "
               "maxtext.trainers.pre_train.train, with jaxwarm's init recorder")


@pytest.fixture(scope="module")
def leg() -> Leg:
    python, why = leg_python(MAXTEXT)
    if python is None:
        pytest.skip(why)
    if not ready(MAXTEXT):
        pytest.skip(f"{MAXTEXT.venv} is not built (or stale): `make maxtext` builds it and "
                    f"runs this test")
    return MAXTEXT


def jaxwarm(leg: Leg, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`jaxwarm ARGS...` with MaxText's venv, as a user in `cwd` runs it."""
    env = {k: v for k, v in os.environ.items() if k != "JAXWARM_ALLOW_UNTESTED_JAX"}
    env["PATH"] = os.pathsep.join([str(leg.python.parent), env.get("PATH", "")])
    return subprocess.run([str(leg.python), "-m", "jaxwarm", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert result.returncode == code, (f"exit {result.returncode}, expected {code}:\n"
                                       f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result.stdout


def example_args(tmp: Path, *overrides: str) -> list[str]:
    """The example config with the adapter's absolute path and MaxText's own cache dir in
    `tmp` (which must stay empty)."""
    return [str(CONFIG), f"env.PYTHONPATH={REPO / 'examples' / 'maxtext'}",
            f"env.M_JAX_CACHE_DIR={tmp / 'maxtext-own-cache'}", *overrides]


def assert_prewarmed_hits(p0: dict[str, Any], tmp: Path) -> None:
    """Process 0's report of a training attempt: the step and the state init (which MaxText
    compiles, inline, before the step) HITs in jaxwarm's cache, though MaxText set its own
    jax_cache_dir: the guard put jaxwarm's back before the lookups."""
    cache = tmp / "jax-cache"
    for name in ("jit_train_step", "jit__lambda"):
        found = [fn for fn in p0["functions"] if fn["name"] == name]
        assert found and all(fn["hit"] for fn in found), (name, p0["functions"])
        assert any(LocalStore(cache).entry_path(fn["key"]).is_file() for fn in found)
    assert p0["time_to_first_step_s"] is not None and p0["time_to_first_step_s"] > 0
    assert p0["cache_dir"] == str(cache)
    own = tmp / "maxtext-own-cache"
    changed = [w["text"] for w in p0["warnings"] if w["kind"] == SETTING_CHANGED]
    assert any(f"jax_compilation_cache_dir to {str(own)!r}" in line
               and "cache.enforce is on" in line for line in changed), changed
    assert not own.exists() or not any(own.iterdir()), list(own.iterdir())


@pytest.mark.slow
@pytest.mark.slurm
def test_maxtext_on_slurm_prewarms_verifies_hits_and_resumes_warm_after_a_requeue(
        leg: Leg, tmp_path: Path, cli: Cli) -> None:
    """docs/maxtext.md's SLURM commands: the prewarm job (MaxText's mesh in its log), verify
    (both processes' view) and verify --trainer (MaxText itself, `python -m`, asked: the same
    key, WARM), then the training job, warm (--prewarm auto: the job alone), stopped by
    SLURM's warning signal once in each attempt: the first requeues, the restart resumes from
    MaxText's checkpoint, warm, and the second ends the job (max_requeues=1)."""
    ensure_cluster()
    args = example_args(tmp_path, *TWO_NODES, *UNTIL_PREEMPTED,
                        f"env.M_BASE_OUTPUT_DIRECTORY={tmp_path / 'maxtext-out'}")
    prewarm = ok(jaxwarm(leg, tmp_path, "prewarm", *args, "--wait"))
    assert "prewarm: SLURM job" in prewarm, prewarm
    run_dir = tmp_path / "runs" / "maxtext"
    prewarmed = json.loads(report_path(run_dir, "prewarm", 0, 0).read_text())["functions"]
    assert {fn["name"] for fn in prewarmed} >= {"jit_train_step", "jit__lambda"}, prewarmed
    assert "mesh {'diloco': 1, 'data': 1, 'stage': 1, 'fsdp': 4" in \
        read_jobs(run_dir)[0].log_path(0).read_text()

    verify = ok(jaxwarm(leg, tmp_path, "verify", *args))
    warm = re.search(r"^WARM  jit_train_step  (\S+)", verify, re.MULTILINE)
    assert warm and "WARM  jit__lambda" in verify, verify
    # Process 0 decides for the run; each process says so in its own task's log, with its
    # own key (on CPU each process's devices enter its key).
    verify_job = read_jobs(run_dir)[-1]
    for task in (0, 1):
        log = verify_job.log_path(task).read_text()
        assert "WARM  train_step" in log and "WARM  init_state" in log, log[-3000:]
    # Asked of MaxText itself (python -m, its own set-up): the same key, WARM.
    trainer = ok(jaxwarm(leg, tmp_path, "verify", "--trainer", *args))
    assert f"WARM  jit_train_step  {warm[1]}  (the trainer looked it up at" in trainer, trainer

    launch = jaxwarm(leg, tmp_path, "launch", *args)
    ok(launch)
    train = read_jobs(run_dir)[-1]
    try:
        assert "prewarm job skipped (auto): the fingerprint" in launch.stderr, launch.stderr
        assert MODULE_FORM in launch.stderr, launch.stderr[-3000:]
        assert [job.name for job in read_jobs(run_dir)] == \
            ["prewarm", "verify", "verify", "train"]
        for restart in (0, 1):
            wait_for_step_lookup(run_dir, restart, train, timeout=900)
            subprocess.run(["scancel", "--signal=USR2", train.job_id], check=True)
        assert wait_job(train.job_id, timeout=900) == "COMPLETED"
    finally:  # a job of a million steps: never left running
        subprocess.run(["scancel", train.job_id], check=True)

    first, restart = (json.loads(report_path(run_dir, "train", r, 0).read_text())
                      for r in (0, 1))
    assert_prewarmed_hits(first, tmp_path)
    assert_prewarmed_hits(restart, tmp_path)
    attempts = [(name.restart, name.process) for name, _ in report_paths(run_dir)
                if name.job == TRAIN]
    assert sorted(attempts) == [(0, 0), (0, 1), (1, 0), (1, 1)], attempts
    assert restart["restart_count"] == 1 and restart["environment"] == first["environment"]
    log = train.log_path().read_text()
    assert "got SIGUSR2, forwarding SIGTERM" in log
    assert "requeueing job" in log and "not requeueing job" in log
    assert log.count("Training stopped: Job received termination signal (SIGTERM)") == 2
    resumed = re.search(r"restoring from this run's directory step (\d+)", log)
    assert resumed, log[-3000:]
    assert (tmp_path / "maxtext-out" / "maxtext" / "checkpoints" / resumed[1]).is_dir()
    # status and report start no job: in this process (conftest's `cli`).
    status = ok(cli("status", str(run_dir)))
    assert re.search(rf"train +job {train.job_id} +COMPLETED +restarts 1 ", status), status
    assert "attempt r0: warm" in status and "attempt r1: warm" in status, status
    shown = ok(cli("report", str(run_dir)))
    assert "jit_train_step: HIT on process 0 (restart 1)" in shown, shown
    # The warm start's headline names MaxText's own init by what the init ledger saw: its
    # import, whether or not it is the largest phase; the phase table gives it a column.
    headline = next(line for line in shown.splitlines()
                    if line.startswith("warm start (train r1 p0)"))
    assert "the trainer's own init" in headline and "import maxtext" in headline, headline
    assert re.search(r"^processes .*the trainer's own init +other +total$", shown,
                     re.MULTILINE), shown

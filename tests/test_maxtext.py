"""MaxText, unchanged from PyPI, wrapped by examples/maxtext: its `jit_train_step` is a HIT
in the training job on 1 process (hardware=cpu) and on 2 (hardware=gpu_multiprocess).

It runs in MaxText's own venv (`make test` and `make maxtext` build `.venvs/maxtext`,
`testing/legs.py`; `make maxtext` runs this file alone), as a user runs it: `jaxwarm
prewarm`, `jaxwarm verify` and `jaxwarm verify --trainer` (WARM), then `jaxwarm launch
--no-prewarm`, from a working directory of its own so that the example config's relative
paths land there. MaxText's own `jax_cache_dir` is set (as
its KEY=VALUE override, through the M_JAX_CACHE_DIR variable MaxText reads) to a dir that must
stay empty: the guard keeps jaxwarm's dir in force. Skipped, with the reason, where no Python
3.12/3.13 is installed or the venv is not built (`make legs` builds it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.launcher.records import SETTING_CHANGED
from jaxwarm.launcher.rundir import report_path
from testing.legs import MAXTEXT, REPO, Leg, leg_python, ready

pytestmark = pytest.mark.e2e

CONFIG = REPO / "examples" / "maxtext" / "maxtext-cpu.yaml"
# The README's 2-process launch: MaxText joins the processes itself.
TWO_PROCESSES = ("topology.processes_per_node=2", "topology.devices_per_process=2",
                 "env.M_HARDWARE=gpu_multiprocess", 'env.M_SKIP_JAX_DISTRIBUTED_SYSTEM="false"')
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


def run(leg: Leg, tmp: Path, *overrides: str, verify: bool) -> dict[str, Any]:
    """prewarm, (verify,) launch --no-prewarm: the outputs, the training job's reports."""
    args = [str(CONFIG), "--local", f"env.PYTHONPATH={REPO / 'examples' / 'maxtext'}",
            f"env.M_JAX_CACHE_DIR={tmp / 'maxtext-own-cache'}", *overrides]
    done: dict[str, Any] = {"prewarm": ok(jaxwarm(leg, tmp, "prewarm", *args))}
    if verify:
        done["verify"] = ok(jaxwarm(leg, tmp, "verify", *args))
        done["verify --trainer"] = ok(jaxwarm(leg, tmp, "verify", "--trainer", *args))
    launch = jaxwarm(leg, tmp, "launch", "--no-prewarm", *args)
    done["launch"] = ok(launch)
    done["log"] = launch.stderr
    run_dir = tmp / "runs" / "maxtext"
    done["reports"] = [json.loads(path.read_text()) for path in
                       sorted(run_dir.glob("reports/train-r0-p*.json"))]
    done["p0"] = json.loads(report_path(run_dir, "train", 0, 0).read_text())
    return done


def assert_hit_in_jaxwarm_s_cache(done: dict[str, Any], tmp: Path) -> None:
    assert "jit_train_step: HIT on process 0" in done["launch"], done["launch"]
    p0 = done["p0"]
    steps = [fn for fn in p0["functions"] if fn["name"] == "jit_train_step"]
    assert steps and all(fn["hit"] for fn in steps), p0["functions"]
    assert p0["time_to_first_step_s"] is not None and p0["time_to_first_step_s"] > 0
    # MaxText set its own jax_cache_dir; the guard put jaxwarm's back before the lookup.
    cache = tmp / "jax-cache"
    assert p0["cache_dir"] == str(cache)
    assert any(f"{fn['key']}-cache" in os.listdir(cache) for fn in steps)
    own = tmp / "maxtext-own-cache"
    changed = [w["text"] for w in p0["warnings"] if w["kind"] == SETTING_CHANGED]
    assert any(f"jax_compilation_cache_dir to {str(own)!r}" in line
               and "cache.enforce is on" in line for line in changed), changed
    assert not own.exists() or not any(own.iterdir()), list(own.iterdir())
    assert MODULE_FORM in done["log"], done["log"][-3000:]


def test_maxtext_hits_on_one_process(leg: Leg, tmp_path: Path) -> None:
    done = run(leg, tmp_path, verify=True)
    assert done["verify"].startswith("WARM  jit_train_step"), done["verify"]
    # Asked of MaxText itself (python -m, its own set-up): the same key, WARM.
    key = done["verify"].split()[2]
    assert f"WARM  jit_train_step  {key}  (the trainer looked it up at" in \
        done["verify --trainer"], done["verify --trainer"]
    assert_hit_in_jaxwarm_s_cache(done, tmp_path)
    assert "mesh {'diloco': 1, 'data': 1, 'stage': 1, 'fsdp': 4" in \
        (tmp_path / "runs" / "maxtext" / "logs" / "prewarm-p0.log").read_text()


def test_maxtext_hits_on_two_processes(leg: Leg, tmp_path: Path) -> None:
    done = run(leg, tmp_path, *TWO_PROCESSES, verify=False)
    assert_hit_in_jaxwarm_s_cache(done, tmp_path)
    assert len(done["reports"]) == 2, done["reports"]

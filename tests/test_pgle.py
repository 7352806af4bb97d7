"""JAX's automatic PGLE under jaxwarm, on CPU: the config's `pgle` section reaches every job,
so the prewarm writes the key the trainer's first compile looks up and verify predicts; and
a relaunch whose cache holds the step's PGLE-optimized executable loads that one, and its
report says so.

What the CPU cannot do: JAX's profiler collects an empty trace there ("PGLE collected an
empty trace"), so after the profiled steps JAX looks the first compile up again and never
compiles with a profile. The PGLE-optimized executable is compiled here from the trainer's
own lowering with a profile given by hand, which JAX stores under the key a GPU run's
second compile is stored under (bench/profiled_compile.py). The report lines of a GPU run's
two compiles are tested from records (tests/test_report_render.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.environment import job_environment
from jaxwarm.core.records import RECOMPILED
from jaxwarm.core.rundir import report_path
from jaxwarm.store.store import LocalStore
from jaxwarm.submit.prepare import pin_config
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, REPO, run_cli

pytestmark = pytest.mark.e2e

PGLE = ("pgle.enabled=true", "pgle.profiling_runs=2", "train.steps=4")


def step_records(run_dir: Path) -> tuple[list[dict], list[dict]]:
    report = json.loads(report_path(run_dir, "train", 0, 0).read_text())
    return [fn for fn in report["functions"] if fn["name"] == "jit_train_step"], \
        report["warnings"]


def test_a_relaunch_loads_the_pgle_optimized_step(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "runs"
    overrides = (f"run.out_dir={out}", f"cache.dir={cache}", *ONE_PROCESS, *FAST_STEP, *PGLE)
    launched = run_cli("launch", str(DEMO), "--local", *overrides)
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    prewarmed, = [e for e in LocalStore(cache).manifest().values()
                  if e.function == "jit_train_step"]
    run_dir = out / "demo"
    steps, warnings = step_records(run_dir)
    # The first compile is the prewarm's; on CPU the profiled steps end in a second lookup
    # of the same key, not a compile with a profile.
    assert steps[0]["hit"] and steps[0]["key"] == prewarmed.key
    assert not any(fn["pgle_optimized"] for fn in steps)
    assert not [w for w in warnings if w["kind"] == RECOMPILED]
    assert launched.stdout.count("jit_train_step: HIT on process 0") == 1, launched.stdout
    verified = run_cli("verify", str(DEMO), "--local", *overrides)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
    assert "WARM" in verified.stdout
    # The same run without PGLE: COLD, the option named (not just `compile_options differs`).
    plain = run_cli("verify", str(DEMO), "--local",
                    *[o for o in overrides if o != "pgle.enabled=true"])
    assert plain.returncode == 1, plain.stdout + plain.stderr[-3000:]
    assert "why: jax_enable_pgle differs: prewarm True, verify False" in plain.stdout, \
        plain.stdout

    config, pinned = pin_config(load_config(DEMO, list(overrides)))
    compiled = subprocess.run([sys.executable, "-m", "bench.profiled_compile"],
                              env={**os.environ, **job_environment(config, pinned)}, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    keys = json.loads(compiled.stdout.splitlines()[-1])
    assert keys["key"] == prewarmed.key and keys["pgle_key"] not in (None, prewarmed.key)
    assert LocalStore(cache).has_entry(keys["pgle_key"])

    # A new run on the same cache (the first one's checkpoint would skip its steps).
    relaunched = run_cli("launch", str(DEMO), "--local", "--no-prewarm", *overrides,
                         "run.name=again")
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr[-3000:]
    steps, _ = step_records(out / "again")
    assert [(fn["key"], fn["hit"], fn["pgle_optimized"]) for fn in steps] == [
        (keys["pgle_key"], True, True)]
    assert "jit_train_step: HIT of PGLE's profile-guided executable on process 0 " \
           "(restart 0)" in relaunched.stdout

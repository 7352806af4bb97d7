"""Every tested jax beyond the main venv's: the key matrix, the demo, a bundle round trip.

Each leg (`testing/legs.py`, venvs made by `make legs`) runs real processes of its own
Python and jax: the probe's guards and its leaving no trace, and its two keys with PGLE on
(as in tests/test_jaxkey.py), the key-variation matrix (cases sharing process settings share
a process: 6 processes for the 19 cases), then the demo's launch and verify, on two
processes at the ends of the range and one between (launch is a HIT on process 0, verify is
WARM under the key of the file JAX wrote, and says the key prediction is exact), at the
demo's tiny size (conftest's TINY_CACHED: what depends on the jax version is the keys, not
the step's size; the demo at its own size is tests/test_demo.py's, on the main venv) and,
before jax 0.11, with the older CPU fusion emitter (conftest's `legacy_fusion`), then
`cache export` / `cache import` into a cache at another path, where verify must be WARM
(from jax 0.11), and a training job staged to node-local storage (`cache.stage`) hits what
an unstaged prewarm wrote (on 0.11.2, the first jax whose default key leaves the path out).
Before 0.11 the path is in the default key, and the import and the staging are refused; what
they do there with `cache.xla_caches: none` is jaxwarm's own, tested on the main venv's jax
of that range (tests/test_bundle.py, tests/test_stage.py). The last two start from the
demo's prewarmed cache (one launch per leg, not one per test). What does not depend on the
jax version runs on the main venv only: verify's COLD on an empty cache
(tests/test_environment.py; the matrix's misses are COLD on every leg). A leg whose Python
is not installed is skipped with the reason; one whose venv was not built fails (run `make
legs`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.core.rundir import report_path
from jaxwarm.jaxkey.versions import cache_path_in_key
from jaxwarm.store.store import LocalStore
from testing.legs import LEGS, REPO, Leg, leg_python, ready
from tests.conftest import DEMO, ONE_PROCESS, TINY_CACHED, legacy_fusion, with_xla_flag
from tests.keycase import VARIATIONS, case_dir
from tests.test_jaxkey import (
    GUARDS,
    PGLE_KEYS,
    assert_pgle_keys,
    assert_probe_guards,
    run_jax,
)
from tests.test_jaxkey_matrix import check_case, run_matrix

pytestmark = pytest.mark.e2e


DEFAULT_XLA_CACHES = "xla_gpu_per_fusion_autotune_cache_dir"


LEG_IDS = [f"jax-{leg.jax}" for leg in LEGS]


@pytest.fixture(scope="module", params=LEGS, ids=LEG_IDS)
def leg(request: pytest.FixtureRequest) -> Leg:
    leg: Leg = request.param
    python, why = leg_python(leg)
    if python is None:
        pytest.skip(why)
    assert ready(leg), f"{leg.venv} is missing or stale: run `make legs`"
    return leg


def cli(leg: Leg, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`jaxwarm ARGS...` with the leg's Python; its jaxwarm-train first on PATH."""
    env = {k: v for k, v in os.environ.items() if k != "JAXWARM_ALLOW_UNTESTED_JAX"}
    env["PATH"] = os.pathsep.join([str(leg.python.parent), env.get("PATH", "")])
    return subprocess.run([str(leg.python), "-m", "jaxwarm", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert result.returncode == code, (f"exit {result.returncode}, expected {code}:\n"
                                       f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def two_processes(leg: Leg) -> bool:
    """The oldest and the newest leg run the demo's two processes (jax.distributed and the
    ranks' meetings through its key-value store, at both ends of the supported range); a
    leg between them runs one (on CPU a second process only misses and compiles again) at
    half the CPU."""
    return leg in (LEGS[0], LEGS[-1])


def demo_args(leg: Leg, tmp: Path, cache: Path, *overrides: str) -> list[str]:
    return [str(DEMO), "--local", f"run.out_dir={tmp / 'runs'}", f"cache.dir={cache}",
            "train.steps=1", *TINY_CACHED, with_xla_flag(*legacy_fusion(leg.jax)),
            *(() if two_processes(leg) else ONE_PROCESS), *overrides]


def path_in_key(leg: Leg) -> bool:
    """Whether the demo's keys (default XLA caches) include its cache dir's path."""
    return cache_path_in_key(leg.jax, DEFAULT_XLA_CACHES)


def warm_key(stdout: str) -> str:
    match = re.search(r"WARM  jit_train_step  (\S+)", stdout)
    assert match, stdout
    return match.group(1)


def test_key_matrix(leg: Leg, tmp_path: Path) -> None:
    results = run_matrix(list(VARIATIONS), tmp_path, str(leg.python), leg.jax)
    failures = []
    for variation, (pre, run) in results.items():
        assert run["jax_version"] == leg.jax
        try:
            check_case(variation, pre, run, case_dir(tmp_path, variation) / "cache")
        except AssertionError as exc:
            failures.append(f"{variation}: {str(exc)[:800]}")
    assert not failures, f"jax {leg.jax}:\n" + "\n".join(failures)


def test_probe_guards_and_leaves_no_trace(leg: Leg, tmp_path: Path) -> None:
    assert_probe_guards(run_jax(GUARDS, devices=1, cache_dir=tmp_path, python=str(leg.python),
                                env={"JAXWARM_ALLOW_UNTESTED_JAX": ""}))


def test_with_pgle_the_prediction_is_the_first_compile_s_key(leg: Leg, tmp_path: Path) -> None:
    assert_pgle_keys(run_jax(PGLE_KEYS, devices=1, cache_dir=tmp_path, python=str(leg.python)))


@pytest.fixture(scope="module")
def demo(leg: Leg, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The demo's launch and verify, once per leg for the tests that use its cache."""
    tmp = tmp_path_factory.mktemp(f"demo-{leg.jax}")
    cache = tmp / "cache"
    launch = cli(leg, "launch", *demo_args(leg, tmp, cache))
    warm = cli(leg, "verify", *demo_args(leg, tmp, cache))
    return {"tmp": tmp, "cache": cache, "launch": launch, "warm": warm}


def test_demo_hits_then_verify_is_warm(leg: Leg, demo: dict[str, Any]) -> None:
    assert "jit_train_step: HIT on process 0" in ok(demo["launch"])
    trained = [report_path(demo["tmp"] / "runs" / "demo", "train", 0, process).is_file()
               for process in (0, 1)]
    assert trained == [True, two_processes(leg)]
    warm = ok(demo["warm"])
    key = warm_key(warm)
    assert LocalStore(demo["cache"]).entry_path(key).is_file(), \
        "verify's key is not the file JAX wrote"
    assert f"key prediction exact on jax {leg.jax}" in warm


def test_bundle_round_trip(leg: Leg, demo: dict[str, Any]) -> None:
    """From jax 0.11 the demo's bundle hits in a cache at another path, whatever the XLA
    caches. Before, the default XLA caches put the cache path in every key, so import
    refuses the bundle in one line; a round trip exported with `cache.xla_caches: none`
    there is tests/test_bundle.py's, on the main venv's jax (0.10.2, the same range), and
    that such keys leave the path out is the key matrix's `symlink_no_xla_caches`."""
    tmp, source = demo["tmp"], demo["cache"]
    ok(demo["launch"])
    bundle = tmp / "demo.tar"
    ok(cli(leg, "cache", "export", str(DEMO), f"cache.dir={source}",
           f"run.out_dir={tmp / 'runs'}", "-o", str(bundle)))
    moved = tmp / "moved-cache"
    imported = cli(leg, "cache", "import", str(bundle), str(DEMO), f"cache.dir={moved}",
                   f"run.out_dir={tmp / 'runs'}")
    if path_in_key(leg):
        assert "include the cache path" in imported.stderr and "< 0.11" in imported.stderr
        ok(imported, 2)
        return
    ok(imported)
    warm = ok(cli(leg, "verify", *demo_args(leg, tmp, moved)))
    assert LocalStore(moved).entry_path(warm_key(warm)).is_file()


# The oldest leg (the path in the key) and the first leg without it (0.11): the newer legs
# stage as 0.11 does, and their keys' leaving the path out is the key matrix's
# `cache_dir_symlink`. A prefix of LEGS, so that each case gets its leg's demo (and xdist
# group), which conftest names by the parameter's index.
@pytest.mark.parametrize("leg", LEGS[:2], ids=LEG_IDS[:2], indirect=True)
def test_a_staged_run_hits_what_an_unstaged_prewarm_wrote(leg: Leg, demo: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """Node-local staging (`cache.stage`) leaves the key as it is: from jax 0.11 a training
    job reading its node's copy hits the entries a prewarm wrote into the shared dir (a copy
    of the demo's cache). Before, the default XLA caches put the cache path in the key, so
    there a staged launch is refused in one line; a staged run with `cache.xla_caches:
    none` there is tests/test_stage.py's, on the main venv's jax (0.10.2, the same range)."""
    cache, stage = tmp_path / "cache", tmp_path / "stage"
    if path_in_key(leg):
        refused = cli(leg, "launch", *demo_args(leg, tmp_path, cache, f"cache.stage={stage}"))
        assert f"cache.stage: on jax {leg.jax} the cache dir's path string is part of " \
               f"every key" in ok(refused, 2) + refused.stderr
        assert not cache.exists() and not stage.exists()
        return
    ok(demo["launch"])
    shutil.copytree(demo["cache"], cache)
    out = ok(cli(leg, "launch", "--no-prewarm",
                 *demo_args(leg, tmp_path, cache, f"cache.stage={stage}")))
    report = json.loads(report_path(tmp_path / "runs" / "demo", "train", 0, 0).read_text())
    assert report["cache_dir"] == str(stage) and len(report["stage"]["copied"]) == 2
    assert {fn["name"] for fn in report["functions"] if fn["hit"]} == \
        {"jit_train_step", "jit_init_state"}, out[-3000:]
    for key in report["stage"]["copied"]:
        assert LocalStore(stage).entry_path(key).read_bytes() == \
            LocalStore(cache).entry_path(key).read_bytes()

"""A jax outside the tested range, as a user meets it: one line from every command, no
traceback; and `jaxwarm doctor`, the self-check a user runs to see whether the key is exact.

A directory holding only `jax-0.13.0.dist-info` (and the matching jaxlib one), put first on
PYTHONPATH, makes the package metadata say jax 0.13.0 while `import jax` still finds the
installed one: what jaxwarm reads to decide, without importing jax.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.jaxkey.selfcheck import SelfCheck
from jaxwarm.jaxkey.versions import JaxVersions, cache_path_in_key, in_range, release
from jaxwarm.store.bundle import BundleMeta
from testing.legs import Leg, leg_python
from tests.conftest import DEMO, REPO

UNTESTED = "0.13.0"
ONE_LINE = (f"jaxwarm: error: jax {UNTESTED} is outside jaxwarm's tested range, jax 0.8.x to "
            f"0.12.x (tested on 0.8.3, 0.10.2, 0.11.2, 0.12.0.1)")


@pytest.fixture
def untested_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # Function-scoped: cheap to repeat, so its tests spread over the workers (conftest.py).
    site = tmp_path_factory.mktemp("untested-jax")
    for name in ("jax", "jaxlib"):
        info = site / f"{name}-{UNTESTED}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n"
                                       f"Version: {UNTESTED}\n")
    env = {k: v for k, v in os.environ.items() if k != "JAXWARM_ALLOW_UNTESTED_JAX"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env["JAX_PLATFORMS"] = "cpu"
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def assert_one_line(result: subprocess.CompletedProcess[str]) -> None:
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output
    assert "Traceback" not in output and len(output.splitlines()) == 1, output
    assert output.startswith(ONE_LINE), output
    assert "JAXWARM_ALLOW_UNTESTED_JAX=1" in output


OVERRIDES = ("run.out_dir={tmp}", "cache.dir={tmp}/cache")


@pytest.mark.parametrize("argv", [
    ["-m", "jaxwarm", "verify", str(DEMO), "--local", *OVERRIDES],
    ["-m", "jaxwarm", "prewarm", str(DEMO), "--local", *OVERRIDES],
    ["-m", "jaxwarm", "launch", str(DEMO), "--local", *OVERRIDES],
    ["-m", "jaxwarm", "doctor"],
    ["-m", "jaxwarm.job.prewarm"],
    ["-m", "jaxwarm.job.verify"],
    ["-m", "jaxwarm.workload.trainer"],
], ids=["verify", "prewarm", "launch", "doctor", "jaxwarm.job.prewarm", "jaxwarm.job.verify",
        "trainer"])
@pytest.mark.e2e
def test_untested_jax_is_one_line(argv: list[str], untested_env: dict[str, str],
                                  tmp_path: Path) -> None:
    result = run([sys.executable, *(arg.format(tmp=tmp_path) for arg in argv)], untested_env)
    assert_one_line(result)
    assert not (tmp_path / "cache").exists(), "nothing is created before the check"


@pytest.mark.e2e
def test_allowed_untested_jax_is_tried_and_checked(untested_env: dict[str, str]) -> None:
    result = run([sys.executable, "-m", "jaxwarm", "doctor"],
                 {**untested_env, "JAXWARM_ALLOW_UNTESTED_JAX": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "key prediction exact on jax" in result.stdout


def test_version_rules() -> None:
    assert [in_range(v) for v in ("0.7.2", "0.8.0", "0.12.0.1", "0.13.0rc1")] == \
        [False, True, True, False]
    assert release("0.12.0.1") == (0, 12, 0, 1)
    assert cache_path_in_key("0.10.2", "xla_gpu_per_fusion_autotune_cache_dir")
    assert not cache_path_in_key("0.10.2", "none")
    assert not cache_path_in_key("0.11.0", "all")


def test_bundle_from_jax_0_11_imports_at_another_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bundle and config: refused on jax 0.10.2, allowed on 0.11.2."""
    config = load_config(DEMO, ["cache.dir=/b/cache"])
    for version, refused in (("0.10.2", True), ("0.11.2", False)):
        monkeypatch.setattr("jaxwarm.store.bundle.required", lambda v=version: JaxVersions(v, v))
        meta = BundleMeta(version=1, jax_version=version, jaxlib_version=version,
                          platform="cpu", cache_dir="/a/cache",
                          xla_caches="xla_gpu_per_fusion_autotune_cache_dir", created=0.0,
                          entries={})
        reason = meta.refusal(config)
        assert (reason is not None) == refused, (version, reason)
        # What `jaxwarm cache export` says of it: portable from jax 0.11 on.
        assert meta.portable is not refused
        assert dataclasses.replace(meta, cache_dir="/b/cache").refusal(config) is None


def test_a_leg_without_its_python_says_why() -> None:
    python, why = leg_python(Leg("0.12.0.1", ("3.99",)))
    assert python is None
    assert why.startswith("no Python 3.99 on this machine") and "jax 0.12.0.1 is untested" in why


@pytest.mark.e2e
def test_doctor_says_the_prediction_is_exact_here() -> None:
    result = subprocess.run([sys.executable, "-m", "jaxwarm", "doctor"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"jaxwarm: self-check: key prediction exact on jax "
                                    f"{metadata.version('jax')}")
    assert "8 of 8 components named" in result.stdout and "Traceback" not in result.stderr


def test_an_inexact_prediction_is_said_so() -> None:
    check = SelfCheck(jax="0.12.0.1", jaxlib="0.12.0.1", backend="cpu", predicted="jit_f-aa",
                      written=["jit_f-bb"], components=8, predict_ms=2.0)
    assert not check.exact
    assert "NOT exact" in check.line() and "jit_f-bb" in check.line()
    assert "`jaxwarm verify` cannot be trusted" in check.line()

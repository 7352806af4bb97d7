"""`python -m bench.gpu_check`, tested where there is no GPU: it refuses in one line, and its
dry run (the same checks on CPU) writes the JSON the GPU run writes, without a GPU figure.
Whether the checks pass on a GPU is what the script is for; here only its logic runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_check import CHECKS, output_path, slug
from bench.parallel_compile import WAYS
from jaxwarm.core.gputarget import gpus_here
from testing.users import why_no_users
from tests.conftest import REPO


def gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.gpu_check", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=900)


def strict_json(path: Path) -> dict:
    """Standard JSON only: NaN or Infinity would not load elsewhere."""
    def refuse(constant: str) -> None:
        raise ValueError(f"{path}: {constant} in the JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.e2e
@pytest.mark.skipif(bool(gpus_here()), reason="this machine has a GPU")
def test_without_a_gpu_it_refuses_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = gpu_check("--json", str(out))
    assert done.returncode == 2
    assert done.stderr.startswith("jaxwarm: error: bench.gpu_check needs a GPU and this "
                                  "machine has none"), done.stderr
    assert done.stderr.count("\n") == 1 and not out.exists()


# Issue 21's checks, issue 32's and issue 41's: one dry run of every check serves their tests.
FIRST = ("reference", "cold_vs_warm", "mock", "agreement")
ROUND_2 = ("load_profile", "warm_requeue", "pgle")
ROUND_3 = ("parallel", "mock8", "shared_group")


def test_every_check_is_tested() -> None:
    assert (*FIRST, *ROUND_2, *ROUND_3) == CHECKS


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """`--dry-run` of every check (parallel's ways once: `--repeat 1`), run once for the
    tests below: its stdout and its JSON's checks, once the JSON is seen to claim no GPU
    figure and to leave every check to a GPU run."""
    out = tmp_path_factory.mktemp("gpu-check") / "dry.json"
    done = gpu_check("--dry-run", "--repeat", "1", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    data = strict_json(out)
    assert data["dry_run"] is True and data["gpu"] is None
    assert data["measured_on"].startswith("cpu, dry run") and "no GPU figure" in data["measured_on"]
    assert data["remaining_on_gpu"] == list(CHECKS)
    assert list(data["checks"]) == list(CHECKS)
    for name in CHECKS:
        assert done.stdout.count(f"{name}: ") >= 1, done.stdout
    assert f"wrote {out}" in done.stdout
    return done.stdout, data["checks"]


@pytest.mark.e2e
def test_the_dry_run_writes_every_check_and_claims_no_gpu_figure(
        dry_run: tuple[str, dict]) -> None:
    _, checks = dry_run
    reference = checks["reference"]
    assert reference["status"] == "ran" and reference["passed"] is True
    assert reference["predicted_key"] == reference["written_key"] == reference["train_key"]
    assert (reference["verify_before"], reference["verify_after"]) == ("COLD", "WARM")
    timing = checks["cold_vs_warm"]
    for figure in ("cold_compile_s", "warm_retrieval_s", "entry_bytes", "cold_first_step_s",
                   "warm_first_step_s", "compile_with_autotune_cache_s"):
        assert isinstance(timing[figure], (int, float)) and math.isfinite(timing[figure])
        assert timing[figure] > 0, figure
    assert timing["autotune_cache_files"] == 0  # XLA's autotuning is a GPU thing
    mock = checks["mock"]
    assert mock["mocked"] is False and mock["prewarm_process_count"] == 2
    ranks = mock["ranks"]
    assert [rank["process"] for rank in ranks] == [0, 1]
    assert ranks[0]["hit"] and ranks[0]["key"] == mock["prewarm_key"] == mock["verify_key"]
    assert mock["verify"] == "WARM" and mock["verify_why"] == []  # process 0's, the run's
    # On CPU process 1 hashes its own devices: a miss, named by its component, from the
    # comparison of its real lookup with the prewarm's record.
    assert not ranks[1]["hit"] and ranks[1]["differing_components"] == ["accelerator_config"]
    assert mock["differing_components"] == ["accelerator_config"]
    agreement = checks["agreement"]
    assert agreement["status"] == "ran" and agreement["functions"] == 2
    assert set(agreement["median_s"]) == {"meet", "agree"}
    assert agreement["agree_per_function_ms"] > 0


@pytest.mark.e2e
def test_the_dry_run_of_the_load_profile_requeue_and_pgle_checks(
        dry_run: tuple[str, dict]) -> None:
    stdout, checks = dry_run
    assert all(checks[name]["status"] == "ran" for name in ROUND_2), checks
    sizes = checks["load_profile"]["sizes"]
    assert [size["layers"] for size in sizes] == [1]
    for size in sizes:
        assert size["compile_s"] > 0 and size["retrieval_s"] > 0 and size["entry_bytes"] > 0
    assert checks["load_profile"]["breakdown"] is None  # a profiler on the GPU gives it
    requeue = checks["warm_requeue"]
    assert requeue["passed"] and requeue["resumed_hit"] and requeue["every_step_logged"]
    assert requeue["cold_first_step_s"] > 0 and requeue["resumed_first_step_s"] > 0
    pgle = checks["pgle"]
    # The CPU's first run: the first compile, then its second lookup after the profiled
    # steps (no profile, no second compile); the relaunch loads the one compiled by hand.
    assert [(c["hit"], c["pgle_optimized"]) for c in pgle["first_run"]] == [
        (False, False), (True, False)]
    assert pgle["second_compile_s"] is None and pgle["profile"].startswith("by hand")
    assert pgle["restart_hit"] and pgle["restart_loaded_pgle_optimized"] and pgle["passed"]
    assert pgle["restart_key"] != pgle["first_run"][0]["key"]
    assert "pgle: second compile none; relaunch HIT of the PGLE-optimized executable" \
        in stdout


@pytest.mark.e2e
def test_the_dry_run_of_the_parallel_mock8_and_shared_group_checks(
        dry_run: tuple[str, dict]) -> None:
    _, checks = dry_run
    parallel = checks["parallel"]
    assert parallel["status"] == "ran" and parallel["targets"] == ["train_step", "init_state"]
    assert sorted(sample["way"] for sample in parallel["samples"]) == sorted(WAYS)
    assert all(sample["compile_wall_s"] > 0 and sample["cpu_s"] > 0
               for sample in parallel["samples"])
    assert parallel["medians"]["serial"]["vs_serial"] == 1.0 and parallel["fastest"] in WAYS
    mock8 = checks["mock8"]  # on CPU: the 8 x 8 mesh's logic on one process, unmocked
    assert mock8["status"] == "ran" and not mock8["mocked"] and mock8["layout"] == "1x1x8"
    assert mock8["verify"] == "WARM" and mock8["verify_key"] == mock8["prewarm_key"]
    assert mock8["key_equals_file"] and mock8["passed"]
    shared = checks["shared_group"]
    if why_no_users() is not None:
        assert shared["status"] == "not possible" and shared["why"] == why_no_users()
        return
    assert shared["status"] == "ran", shared
    assert [(c["user"], c["command"], c["exit"]) for c in shared["commands"]] == [
        ("first", "prewarm", 0), ("second", "launch", 0), ("second", "launch", 0)], shared
    assert shared["passed"] and shared["locked_out_dirs"] == []
    assert shared["xla_dirs"] == []  # XLA's autotune sub-cache is a GPU thing
    top = shared["group_mode_dirs"][0]
    assert top["dir"] == "." and top["group_writable"] and top["mode"].startswith("2")
    assert sum(d["files_of_the_second_user"] for d in shared["group_mode_dirs"]) > 0


def test_a_dry_run_never_lands_among_the_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    device = {"kind": "NVIDIA H100 80GB HBM3", "count": 1}
    assert output_path(None, device, dry_run=False) == \
        REPO / "bench" / "results" / "nvidia-h100-80gb-hbm3.json"
    assert "results" not in output_path(None, device, dry_run=True).parts
    monkeypatch.setenv("OUT", "/out")
    assert output_path(None, device, dry_run=True) == Path("/out/gpu_check.json")
    assert slug("") == "gpu"

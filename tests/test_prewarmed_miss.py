"""A training job whose step differs from the one prewarmed, as real launches: the headline
names the prewarmed function that missed, marked prewarmed, with the inputs that differ
(or, with equal inputs, that the step's code changed), and the attempt is called warm only
when every prewarmed function hit, in the table, the headline, the first-step history and
`report --json` alike.

Two ways: the reference step prewarmed on FAST_STEP, then launched with one of its
`step.args` changed and `--prewarm never` (the trainer runs a step the prewarm did not
build), in a run dir of its own under the same run name (the prewarm on record is the
run's); and tests/cli_trainer wrapped by the adapter that keeps its own copy of the
trainer's settings (`from_args`), launched with only the trainer's flags changed (width,
batch, dtype, donation): the drift no verify through the adapter can see.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from jaxwarm.core.rundir import report_path
from tests.conftest import DEMO, FAST_STEP, ONE_PROCESS, Cli, run_cli
from tests.test_cli_trainer import FLAGS, cli_args
from tests.test_cli_trainer import RUN as CLI_RUN

pytestmark = pytest.mark.e2e

ONE_STEP = (*ONE_PROCESS, *FAST_STEP, "train.steps=1")


@dataclass(frozen=True)
class Prewarmed:
    root: Path
    cache: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def prewarmed(tmp_path_factory: pytest.TempPathFactory) -> Prewarmed:
    """The reference step prewarmed and trained once (warm), on a cache of its own."""
    root = tmp_path_factory.mktemp("prewarmed")
    cache = root / "cache"
    result = run_cli("launch", str(DEMO), "--local", *ONE_STEP,
                     f"run.out_dir={root / 'warm'}", f"cache.dir={cache}")
    return Prewarmed(root, cache, result)


def relaunch(prewarmed: Prewarmed, name: str, *changes: str) -> tuple[str, Path]:
    """A launch without a prewarm job, with `changes` to the step: its output and run dir."""
    out_dir = prewarmed.root / name
    result = run_cli("launch", str(DEMO), "--local", "--prewarm", "never", *ONE_STEP,
                     *changes, f"run.out_dir={out_dir}", f"cache.dir={prewarmed.cache}")
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, out_dir / "demo"


def headline(stdout: str) -> list[str]:
    return stdout.split("\njob ")[0].splitlines()


def labels(run_dir: Path, cli: Cli) -> tuple[str, str]:
    """Process 0's label as `report --json` and the table's `start` column say it."""
    data = json.loads(report_path(run_dir, "train", 0, 0).read_text())
    shown = cli("report", str(run_dir))
    row = next(line for line in shown.stdout.splitlines()
               if line.split()[:2] == ["train", "0"])
    return data["label"], row


def test_a_warm_attempt_is_warm_everywhere(prewarmed: Prewarmed, cli: Cli) -> None:
    assert prewarmed.result.returncode == 0, prewarmed.result.stderr[-3000:]
    lines = headline(prewarmed.result.stdout)
    assert "train restart 0, process 0: warm" in lines
    label, row = labels(prewarmed.root / "warm" / "demo", cli)
    assert label == "warm" and row.split()[-2:] == ["ok", "warm"]
    history = [line for line in lines if line.startswith("time to first step on process 0")]
    assert history and ": warm " in history[0]


def test_a_wider_model_names_the_input_that_differs(prewarmed: Prewarmed, cli: Cli) -> None:
    stdout, run_dir = relaunch(prewarmed, "wide", "step.args.d_model=48")
    lines = headline(stdout)
    miss = lines.index(next(line for line in lines if line.startswith("jit_train_step: MISS")))
    assert lines[miss + 1].startswith("  why: its inputs differ from the prewarmed ones: ")
    assert "f32[32,48] vs f32[32,32] (+" in lines[miss + 1]
    assert not any("another function" in line for line in lines)
    # The init takes the same seed and builds a wider state: equal inputs, another program.
    init = lines.index(next(line for line in lines if line.startswith("jit_init_state: MISS")))
    assert lines[init + 1] == ("  why: same inputs as the prewarm: the step's code changed; "
                               "since the prewarm: step differs")
    assert not lines[init + 2].startswith("  why: ")  # one cause, said once
    assert "train restart 0, process 0: cold" in lines
    label, row = labels(run_dir, cli)
    assert label == "cold" and row.endswith(" cold")
    table = stdout.splitlines()
    assert any(line.split()[3:5] == ["jit_train_step", "MISS"] and line.endswith("prewarmed")
               for line in table)


def test_another_batch_is_partly_warm(prewarmed: Prewarmed, cli: Cli) -> None:
    stdout, run_dir = relaunch(prewarmed, "batch", "step.args.global_batch=8")
    lines = headline(stdout)
    [partly] = [line for line in lines if line.startswith("train restart 0, process 0: ")]
    assert partly.startswith("train restart 0, process 0: partly warm (1 of 2 prewarmed "
                             "functions hit: jit_train_step compiled ")
    assert any(line.startswith("jit_init_state: HIT") for line in lines)
    miss = lines.index(next(line for line in lines if line.startswith("jit_train_step: MISS")))
    assert lines[miss + 1] == ("  why: its inputs differ from the prewarmed ones: batch "
                               "i32[8,9] vs i32[16,9]")
    label, row = labels(run_dir, cli)
    assert label.startswith("partly warm (1 of 2") and row.endswith(label)
    history = next(line for line in lines if line.startswith("time to first step on process"))
    assert "attempts: partly warm (1 of 2 prewarmed functions hit" in history
    status = cli("status", str(run_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"attempt r0: {label}; " in status.stdout, status.stdout


def test_another_dtype_names_the_dtype(prewarmed: Prewarmed) -> None:
    stdout, _ = relaunch(prewarmed, "bf16", "step.args.dtype=bfloat16")
    lines = headline(stdout)
    miss = lines.index(next(line for line in lines if line.startswith("jit_train_step: MISS")))
    assert "bf16[" in lines[miss + 1] and " vs f32[" in lines[miss + 1]
    assert "train restart 0, process 0: cold" in lines


@pytest.fixture(scope="module")
def adapter_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/cli_trainer prewarmed and trained with its config's flags through the adapter
    that keeps its own copy of the settings (`adapter:from_args`, `step.args: {}`, the
    trainer's defaults): a cache the next launches change only the trainer's flags on."""
    root = tmp_path_factory.mktemp("adapter-copy")
    launched = run_cli("launch", *cli_args(root, factory="from_args"))
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    assert "train restart 0, process 0: warm" in launched.stdout, launched.stdout
    return root / "cache"


@pytest.mark.parametrize(("flag", "label", "why"), [
    (("--d-model", "24"), "cold", "state['b'] f32[24] vs f32[16] (+2 more)"),
    (("--batch", "8"), "partly warm (1 of 2 prewarmed functions hit: jit_train_step compiled",
     "batch f32[8,16] vs f32[4,16]"),
    (("--dtype", "bfloat16"), "cold", "state['b'] bf16[16] vs f32[16] (+2 more)"),
    (("--no-donate",), "partly warm (1 of 2", "state['b'] not donated vs donated (+1 more)"),
], ids=["width", "batch", "dtype", "donation"])
def test_a_trainer_flag_the_adapter_s_copy_misses_is_named(
        tmp_path: Path, adapter_copy: Path, flag: tuple[str, ...], label: str,
        why: str) -> None:
    """Only the trainer's command line changes; the adapter builds the step from its own
    copy, so the launch's prewarm (rerun: the fingerprint has the command line) finds the
    old step WARM, and the training job runs another: its headline names the prewarmed
    function that missed and the input that differs, and the attempt is not warm. Where the
    inputs are equal (the init makes a wider or other-typed state from the same seed), it
    says the program differs, and what changed since the prewarm that compiled it: the
    trainer's command line (the training job forgot the launch's own prewarm record, whose
    promise it missed)."""
    launched = run_cli("launch", *cli_args(tmp_path, *FLAGS, *flag, factory="from_args"),
                       f"cache.dir={adapter_copy}")
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    lines = headline(launched.stdout)
    assert f"train restart 0, process 0: {label}" in "\n".join(lines), launched.stdout
    miss = lines.index(next(line for line in lines if line.startswith("jit_train_step: MISS")))
    assert lines[miss + 1] == f"  why: its inputs differ from the prewarmed ones: {why}"
    init = next((i for i, line in enumerate(lines) if line.startswith("jit_init: MISS")), None)
    if init is not None:
        assert lines[init + 1] == (
            "  why: same inputs as the prewarm: the step's code changed; since the prewarm: "
            "entrypoint differs (the trainer's command line, which the step factory reads)")
    data = json.loads(report_path(tmp_path / "runs" / CLI_RUN, "train", 0, 0).read_text())
    assert data["label"].startswith(label) and data["label"] != "warm"


def test_verify_of_the_trainer_and_of_the_factory_name_the_inputs_too(
        tmp_path: Path, adapter_copy: Path) -> None:
    """The same explanation before the run: `verify --trainer` judges the trainer's own
    lowering of the wider model, and plain verify the factory's when its copy is changed
    (sizes no other test of the module launches: its launches fill the shared cache)."""
    trainer = run_cli("verify", "--trainer",
                      *cli_args(tmp_path, *FLAGS, "--d-model", "40", factory="from_args"),
                      f"cache.dir={adapter_copy}")
    assert trainer.returncode == 1, trainer.stdout + trainer.stderr[-3000:]
    assert "why: its inputs differ from the prewarmed ones: state['b'] f32[40] vs f32[16] " \
           "(+2 more)" in trainer.stdout, trainer.stdout
    factory = run_cli("verify", *cli_args(tmp_path, factory="from_args"),
                      "step.args={batch: 12}", f"cache.dir={adapter_copy}")
    assert factory.returncode == 1, factory.stdout + factory.stderr[-3000:]
    assert "why: its inputs differ from the prewarmed ones: batch f32[12,16] vs f32[4,16]" \
        in factory.stdout, factory.stdout


def test_a_miss_against_another_run_s_prewarm_is_named(tmp_path: Path,
                                                      adapter_copy: Path) -> None:
    """The README's relaunch under a new run name on a warm cache (the module's, prewarmed
    by run cli-trainer), with a wider model through the trainer's own command line only
    (read by the adapter `from_argv`) and no prewarm: the attempt compares each lookup with
    run cli-trainer's prewarm, and the headline names jit_train_step's miss, the input that
    differs and that run; verify and verify --trainer say the same before it. (A width no
    other test of the module launches.)"""
    wider = (*cli_args(tmp_path, "--d-model", "32", "--batch", "4"), f"cache.dir={adapter_copy}",
             "run.name=B")
    why = f"why: its inputs differ from the prewarmed ones (run '{CLI_RUN}'): state['b'] " \
          f"f32[32] vs f32[16] (+2 more)"
    for how in ((), ("--trainer",)):
        verified = run_cli("verify", *how, *wider)
        assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
        cold = verified.stdout.split("COLD  jit_train_step  ", 1)[1].splitlines()
        assert cold[1] == f"      {why}", verified.stdout
    launched = run_cli("launch", "--no-prewarm", *wider)
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    lines = headline(launched.stdout)
    assert "train restart 0, process 0: cold" in lines, launched.stdout
    miss = lines.index(next(line for line in lines if line.startswith("jit_train_step: MISS")))
    assert lines[miss + 1] == f"  {why}", launched.stdout

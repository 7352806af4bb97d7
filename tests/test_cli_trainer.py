"""A trainer whose settings are its own flags (tests/cli_trainer: `python train.py --d-model
16 ...`), wrapped by an adapter that reads the argv jaxwarm hands it (`trainer_argv`) with
the trainer's own parser: one source of truth. Launched, its two functions HIT; a launch
or a verify that changes only the trainer's flags sees another program."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from jaxwarm.core.rundir import report_path
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.e2e

TRAINER = REPO / "tests" / "cli_trainer"
CONFIG = TRAINER / "cli-trainer.yaml"
RUN = "cli-trainer"
# The config's trainer flags.
FLAGS = ("--d-model", "16", "--batch", "4", "--steps", "1")


def cli_args(tmp_path: Path, *flags: str, factory: str = "from_argv") -> list[str]:
    """The test trainer's config under TMP_PATH, run by this interpreter (`python` on PATH
    may be another), with FLAGS as its command line."""
    return [str(CONFIG), "--local", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", f"step.factory=adapter:{factory}",
            f"entrypoint.command=[{sys.executable}, {TRAINER / 'train.py'}]",
            f"entrypoint.args=[{', '.join(json.dumps(flag) for flag in flags or FLAGS)}]"]


def train_report(tmp_path: Path) -> dict:
    return json.loads(report_path(tmp_path / "runs" / RUN, "train", 0, 0).read_text())


def test_the_trainer_launched_with_its_flags_hits(tmp_path: Path) -> None:
    """Prewarmed with the config's flags; verify of other flags sees another program; a
    launch with other flags prewarms them (the fingerprint has the trainer's command line)
    and its trainer, launched with those flags, hits both functions."""
    prewarmed = run_cli("prewarm", *cli_args(tmp_path))
    assert prewarmed.returncode == 0, prewarmed.stdout + prewarmed.stderr[-3000:]

    # Only the trainer's flags change: verify, through the adapter, sees another program.
    # (A wider model's verify through it, with the why: tests/test_prewarmed_miss.py's
    # relaunch under another run name; the wider launch below.)
    for flags in [("--batch", "8"), ("--dtype", "bfloat16"), (*FLAGS, "--no-donate")]:
        changed = run_cli("verify", *cli_args(tmp_path, *flags))
        assert changed.returncode == 1, changed.stdout + changed.stderr[-3000:]
        cold = changed.stdout.split("COLD  jit_train_step", 1)
        assert len(cold) == 2 and "why: " in cold[1].split("\n")[1], changed.stdout

    # And the launch: its fingerprint has the trainer's command line, so --prewarm auto
    # runs the prewarm, and the step it then loads is the wider one.
    wider = run_cli("launch", *cli_args(tmp_path, "--d-model", "24"))
    assert wider.returncode == 0, wider.stdout + wider.stderr[-3000:]
    assert "entrypoint differs (the trainer's command line, which the step factory reads)" \
        in wider.stdout, wider.stdout
    assert "[train p0] step 1 loss" in wider.stderr
    hits = {fn["name"]: fn["hit"] for fn in train_report(tmp_path)["functions"]}
    assert hits == {"jit_init": True, "jit_train_step": True}, hits

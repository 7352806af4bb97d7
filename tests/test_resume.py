"""The reference trainer: SIGTERM -> checkpoint -> exit; relaunch resumes on the same loss
curve as an uninterrupted run; a changed config is refused."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import DEMO, REPO, run_cli

STEPS = 40


def losses(run_dir: Path) -> dict[int, float]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def launch_args(out: Path, cache: Path, *extra: str) -> list[str]:
    return ["launch", str(DEMO), "--local", "--no-prewarm", f"run.out_dir={out}",
            f"cache.dir={cache}", f"train.steps={STEPS}", "train.checkpoint_every=0", *extra]


def test_sigterm_checkpoints_and_resume_continues_the_same_curve(
        tmp_path: Path, shared_cache: Path) -> None:
    reference = run_cli(*launch_args(tmp_path / "ref", shared_cache))
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = losses(tmp_path / "ref" / "demo")
    assert sorted(expected) == list(range(1, STEPS + 1))

    run_dir = tmp_path / "run" / "demo"
    launcher = subprocess.Popen([sys.executable, "-m", "launcher.cli",
                                 *launch_args(tmp_path / "run", shared_cache)],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    deadline = time.monotonic() + 240
    while len(losses(run_dir)) < 3 and time.monotonic() < deadline \
            and launcher.poll() is None:
        time.sleep(0.05)
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "forwarding SIGTERM" in stderr and "checkpointed at step" in stderr
    checkpoints = sorted((run_dir / "checkpoints").glob("*/meta/metadata"))
    assert len(checkpoints) == 1
    stopped_at = json.loads(checkpoints[0].read_text())["step"]
    assert 3 <= stopped_at < STEPS

    resumed = run_cli(*launch_args(tmp_path / "run", shared_cache))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from checkpoint at step {stopped_at}" in resumed.stderr
    got = losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert abs(got[step] - expected[step]) <= 1e-5 * abs(expected[step]), step


def test_resume_under_a_changed_config_is_refused(tmp_path: Path, shared_cache: Path) -> None:
    first = run_cli(*launch_args(tmp_path, shared_cache, "train.steps=2"))
    assert first.returncode == 0, first.stderr[-3000:]
    changed = run_cli(*launch_args(tmp_path, shared_cache, "train.steps=4",
                                   "step.args.learning_rate=0.1"))
    assert changed.returncode == 2  # the trainer refuses its input: one line, exit 2
    assert "refusing to resume" in changed.stderr
    assert "step.args.learning_rate: 0.003 -> 0.1" in changed.stderr

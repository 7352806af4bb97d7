"""The run dir under the cache dir's trust rule (`core.trust.check_run_dir`): jaxwarm makes
it with safe modes; one another user owns or may write (or swap, through a parent), or that
holds a planted link, is refused in one line before anything is written, and nothing is
ever written through a link there."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.records import PREWARM, TRAIN
from jaxwarm.core.rundir import (
    checkpoints_dir,
    local_jobs_path,
    lock_path,
    log_path,
    logs_dir,
    pinned_config,
    report_path,
    reports_dir,
)
from jaxwarm.core.trust import check_run_dir
from tests.conftest import DEMO, Cli
from tests.hostile import assert_refused, snapshot
from tests.users import as_user, two_users


def args(tmp_path: Path, *extra: str) -> list[str]:
    return [f"run.out_dir={tmp_path / 'runs'}", f"cache.dir={tmp_path / 'cache'}", *extra]


def test_a_new_run_dir_and_its_dirs_are_made_private_whatever_the_umask(
        tmp_path: Path, cli: Cli) -> None:
    previous = os.umask(0o002)  # a site's default that leaves new dirs group-writable
    try:
        result = cli("render", str(DEMO), *args(tmp_path), "--job", "train")
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "runs" / "demo"
    for made in (tmp_path / "runs", run_dir, run_dir / "slurm", run_dir / "slurm" / "train"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made


@pytest.mark.parametrize("planted", [str(path) for path in (
    log_path(".", TRAIN, 0), pinned_config("."), lock_path("."), report_path(".", TRAIN, 0, 0),
    local_jobs_path("."))])
def test_a_link_planted_in_the_run_dir_is_refused_and_never_followed(
        tmp_path: Path, cli: Cli, planted: str) -> None:
    render = cli("render", str(DEMO), *args(tmp_path), "--job", "train")
    assert render.returncode == 0, render.stderr
    yours = tmp_path / "precious.txt"
    yours.write_text("precious\n")
    link = tmp_path / "runs" / "demo" / planted
    link.unlink(missing_ok=True)
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(yours)
    before = snapshot(tmp_path)
    for command in ("launch", "verify"):
        result = cli(command, str(DEMO), "--local", *args(tmp_path))
        assert_refused(result, f"run.name: {link} is a symlink (to {yours}): jaxwarm never "
                               f"writes through a link")
    assert snapshot(tmp_path) == before


def test_submitits_link_beside_its_submission_script_is_its_own(tmp_path: Path) -> None:
    """submitit names each job's submission script by a link beside it in the run's SLURM
    folder (`.submission_file_<id>.sh` -> `<job id>_submission.sh`): a link to a file in the
    same dir reaches nothing outside it, and a second launch of the run passes the check; a
    link out of the dir, or to a dir, is still refused."""
    config = load_config(DEMO, args(tmp_path))
    folder = Path(config.run_dir) / "slurm" / "train"
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(config.run_dir, 0o700)
    os.chmod(Path(config.run_dir) / "slurm", 0o700)
    (folder / "69_submission.sh").write_text("#!/bin/bash\n")
    (folder / ".submission_file_ab12.sh").symlink_to(folder / "69_submission.sh")
    check_run_dir(config)
    (folder / "out.sh").symlink_to(tmp_path / "precious.txt")
    with pytest.raises(ConfigError, match="is a symlink"):
        check_run_dir(config)


def test_the_trainers_checkpoints_may_be_a_link(tmp_path: Path, cli: Cli) -> None:
    """checkpoints/ is the trainer's (a bigger file system, linked in): not walked."""
    elsewhere = tmp_path / "scratch"
    elsewhere.mkdir()
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    checkpoints_dir(tmp_path / "runs" / "demo").symlink_to(elsewhere)
    result = cli("render", str(DEMO), *args(tmp_path), "--job", "train")
    assert result.returncode == 0, result.stderr


def test_a_run_dir_others_may_write_is_refused(tmp_path: Path, cli: Cli) -> None:
    run_dir = tmp_path / "runs" / "demo"
    logs_dir(run_dir).mkdir(parents=True)
    logs_dir(run_dir).chmod(0o777)
    before = snapshot(tmp_path)
    result = cli("launch", str(DEMO), "--local", *args(tmp_path))
    assert_refused(result, f"run.name: {logs_dir(run_dir)} is writable by every user (mode "
                           f"0777); refusing to use this run dir")
    logs_dir(run_dir).chmod(0o700)
    (tmp_path / "runs").chmod(0o777)  # a parent: whoever may rename in it swaps the run dir
    result = cli("launch", str(DEMO), "--local", *args(tmp_path))
    assert_refused(result, f"run.out_dir: parent {tmp_path / 'runs'} is writable by every "
                           f"user without the sticky bit")
    assert snapshot(tmp_path) == before


def test_a_log_is_made_afresh_never_through_a_link(tmp_path: Path) -> None:
    """What a job's log is opened with (`files.fresh_file`), should a link appear after the
    launch's check: the link is removed, the file it named is untouched."""
    from jaxwarm.core.files import fresh_file

    yours = tmp_path / "precious.txt"
    yours.write_text("precious\n")
    path = log_path(tmp_path, "train", 0)
    path.parent.mkdir()
    path.symlink_to(yours)
    with fresh_file(path, "a job's log") as sink:
        sink.write(b"a log line\n")
    assert yours.read_text() == "precious\n"
    assert not path.is_symlink() and path.read_bytes() == b"a log line\n"


@pytest.fixture
def users() -> Iterator[tuple[str, str, str, Path]]:
    with two_users() as made:
        yield made


@pytest.mark.e2e
def test_a_run_dir_another_user_prepared_is_refused_and_their_links_never_followed(
        users: tuple[str, str, str, Path]) -> None:
    """The attack: in a shared scratch dir (sticky, world-writable), another user makes
    `runs/victim/logs/` (0777) with the victim's logs as links to the victim's file, then the
    victim launches into it. Also the run dir itself made by them in the scratch dir, and a
    dir of theirs inside the victim's own run dir."""
    _, attacker, victim, base = users
    pub = base / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    home = base / f"home-{victim}"
    precious = home / "precious.txt"
    precious.write_text("precious\n")
    shutil.chown(precious, victim)
    planted = as_user(attacker, base, "-c",
                      "umask 000 && mkdir -p pub/runs/victim/logs pub/victim && "
                      "chmod 0777 pub/runs/victim/logs pub/victim && "
                      f"ln -s {precious} {log_path('pub/runs/victim', PREWARM, 0)} && "
                      f"ln -s {precious} {log_path('pub/runs/victim', TRAIN, 0)}",
                      command=("/bin/sh",))
    assert planted.returncode == 0, planted.stderr
    uid = pwd.getpwnam(attacker).pw_uid
    # The victim's own run dir, with a dir of the attacker's in it (made while it was open).
    own = home / "runs" / "victim"
    own.mkdir(parents=True)
    for made in (own.parent, own):
        shutil.chown(made, victim)
    reports_dir(own).mkdir(mode=0o755)
    shutil.chown(reports_dir(own), attacker)
    cache = f"cache.dir={home / 'cache'}"
    before = snapshot(base)
    for command in ("launch", "verify", "prewarm"):
        result = as_user(victim, base, command, str(DEMO), "--local",
                         f"run.out_dir={pub / 'runs'}", "run.name=victim", cache)
        assert_refused(result, f"run.out_dir: parent {pub / 'runs'} is owned by uid {uid}, "
                               f"not by you")
    result = as_user(victim, base, "launch", str(DEMO), "--local", f"run.out_dir={pub}",
                     "run.name=victim", cache)
    assert_refused(result, f"run.name: {pub / 'victim'} is writable by every user")
    result = as_user(victim, base, "launch", str(DEMO), "--local",
                     f"run.out_dir={home / 'runs'}", "run.name=victim", cache)
    assert_refused(result, f"run.name: {own / 'reports'} is owned by uid {uid}, not by you")
    assert precious.read_text() == "precious\n"
    assert snapshot(base) == before

"""Every CLI error path is one line and exit 2, never a traceback: each subcommand is walked
with bad input (real files, the CLI called in this process: nothing starts before the
refusal), and a job's own refusal (a real JAX process)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from tests.conftest import DEMO, Cli
from tests.hostile import assert_refused, snapshot


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """Bad inputs of every kind, as files on disk."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / "jaxwarm-manifest.json").write_text("{not json")
    (cache / f"jit_f-{'a' * 64}-cache").write_bytes(zlib.compress(bytes(100)))
    run_dir = tmp_path / "runs" / "demo"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_bytes(b"run: {name: \xff}\n")
    (run_dir / "slurm").mkdir()
    (run_dir / "slurm" / "jobs.json").write_text("[1, 2")
    fifo = tmp_path / "bundle.fifo"
    os.mkfifo(fifo)
    (tmp_path / "latin1.yaml").write_bytes(b"run:\n  name: d\xe9mo\n")
    (tmp_path / "garbage.tar").write_bytes(b"\0garbage" * 100)
    return {"tmp": tmp_path, "cache": cache, "run_dir": run_dir, "fifo": fifo,
            "latin1": tmp_path / "latin1.yaml", "garbage": tmp_path / "garbage.tar"}


def cases(w: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    """Subcommand -> (argv, a fragment of the one error line)."""
    out = [f"run.out_dir={w['tmp'] / 'out'}", f"cache.dir={w['tmp'] / 'c2'}"]
    on_cache = [str(DEMO), *out[:1], f"cache.dir={w['cache']}"]
    return {
        "launch non-utf8": (["launch", str(w["latin1"]), "--local"], "not UTF-8 text"),
        "launch dir as config": (["launch", str(w["tmp"]), "--local"], "cannot read config"),
        "launch missing factory function": (
            ["launch", str(DEMO), "--local", *out, "step.factory=jaxwarm.step:no_such"],
            "defines no 'no_such'"),
        "prewarm nan": (["prewarm", str(DEMO), "--local", *out, "init_budget_s=.nan"],
                        "init_budget_s: expected a finite number"),
        "verify missing module": (["verify", str(DEMO), "--local", *out,
                                   "step.factory=no_such_module:f"], "was not found"),
        "render bad name": (["render", str(DEMO), *out, "run.name=..", "--job", "train"],
                            "run.name: expected one path component"),
        "report no run dir": (["report", str(w["tmp"] / "nope")], "no such run dir"),
        "report garbage pinned config": (["report", str(w["run_dir"])], "not UTF-8 text"),
        "status garbage jobs": (["status", str(w["run_dir"])], "jobs.json"),
        "cache ls broken manifest": (["cache", "ls", str(w["cache"])], "jaxwarm-manifest.json"),
        "cache stats broken manifest": (["cache", "stats", *on_cache], "jaxwarm-manifest.json"),
        "cache verify broken manifest": (["cache", "verify", str(w["cache"])],
                                         "jaxwarm-manifest.json"),
        "cache prune broken manifest": (["cache", "prune", str(w["cache"]), "--max-size", "1K"],
                                        "jaxwarm-manifest.json"),
        "cache export nowhere": (["cache", "export", *on_cache, "--all",
                                  "-o", str(w["tmp"] / "no" / "dir" / "b.tar")],
                                 "jaxwarm-manifest.json"),
        "cache import fifo": (["cache", "import", str(w["fifo"]), *on_cache],
                              "not a regular file"),
        "cache import garbage": (["cache", "import", str(w["garbage"]), *on_cache],
                                 "cannot read bundle"),
    }


def test_every_subcommand_answers_bad_input_with_one_line(world: dict[str, Path],
                                                          cli: Cli) -> None:
    all_cases = cases(world)
    commands = {argv[0] if argv[0] != "cache" else f"cache {argv[1]}"
                for argv, _ in all_cases.values()}
    assert commands == {"launch", "prewarm", "verify", "render", "report", "status",
                        *(f"cache {c}" for c in ("ls", "stats", "verify", "prune", "export",
                                                 "import"))}
    before = snapshot(world["tmp"])
    for name, (argv, fragment) in all_cases.items():
        result = cli(*argv)
        try:
            assert_refused(result, fragment)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert snapshot(world["tmp"]) == before


@pytest.mark.parametrize("manifest", ["{not json", "[]", '{"version": 1, "entries": []}',
                                      '{"version": 9, "entries": {}}',
                                      '{"version": 1, "entries": {"jit_f-' + "0" * 64 +
                                      '": {"function": "jit_f", "surprise": 1}}}'])
def test_a_broken_manifest_is_one_line_naming_it_and_changes_nothing(
        tmp_path: Path, manifest: str, cli: Cli) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    path = cache / "jaxwarm-manifest.json"
    path.write_text(manifest)
    before = snapshot(tmp_path)
    for argv in (["ls"], ["stats"], ["verify"], ["prune", "--max-size", "0"]):
        assert_refused(cli("cache", argv[0], str(cache), *argv[1:]), str(path))
    assert snapshot(tmp_path) == before


def test_a_broken_manifest_is_set_aside_with_a_note_when_a_prewarm_records(
        tmp_path: Path) -> None:
    from jaxwarm.store.manifest import ManifestEntry
    from jaxwarm.store.store import LocalStore

    cache = tmp_path / "cache"
    cache.mkdir()
    store = LocalStore(cache)
    store.manifest_file.write_text("[]")
    key = "jit_f-" + "a" * 64
    store.record_entries([ManifestEntry(function="jit_f", key=key, run="r", config="c",
                                        compile_s=1.0, lower_s=0.1, written=True,
                                        jax_version="0", process_count=1)])
    assert list(store.manifest()) == [key]
    aside, = cache.glob("jaxwarm-manifest.json.broken-*[0-9]")
    assert aside.read_text() == "[]"
    note = aside.with_name(aside.name + ".why").read_text()
    assert "not a jaxwarm manifest" in note


@pytest.mark.e2e
def test_a_job_with_a_missing_factory_function_ends_with_one_line(tmp_path: Path) -> None:
    """The launcher's static check cannot see every module (no source); the job's own
    error is one line, not a traceback per process."""
    import subprocess
    import sys

    from jaxwarm.core.config import load_config
    from jaxwarm.submit.prepare import pin_config
    from testing.jaxproc import jax_env

    config, pinned = pin_config(load_config(DEMO, [
        f"run.out_dir={tmp_path}", f"cache.dir={tmp_path / 'c'}",
        "step.factory=jaxwarm.step:no_such", "topology.processes_per_node=1",
        "topology.devices_per_process=1", "mesh.axes={data: 1}"]))
    result = subprocess.run([sys.executable, "-m", "jaxwarm.job.verify"], capture_output=True,
                            text=True, timeout=120,
                            env={**jax_env(1), "JAXWARM_CONFIG": str(pinned)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "step.factory: module 'jaxwarm.step' has no function 'no_such'" in result.stderr

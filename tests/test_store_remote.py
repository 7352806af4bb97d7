"""A remote cache dir end to end: s3:// through etils.epath and s3fs (the `remote` extra),
against a real S3 API server on this machine (moto's), not a mock inside the process; and
what its store (`RemoteStore`) answers there."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs

from jaxwarm.core.rundir import report_path
from jaxwarm.store.store import open_store
from testing.jaxproc import free_port
from tests.conftest import DEMO, FAST_STEP, Cli, run_cli

pytestmark = pytest.mark.e2e


BUCKET = "jaxwarm-test"


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, "no S3 server"
            time.sleep(0.2)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        yield env
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_prewarm_into_s3_then_the_run_hits_and_verify_sees_it(
        tmp_path: Path, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        cli: Cli) -> None:
    for name, value in s3_env.items():
        monkeypatch.setenv(name, value)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(BUCKET)
    args = [str(DEMO), "--local", f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir=s3://{BUCKET}/cache", "topology.processes_per_node=1",
            "topology.devices_per_process=2", "mesh.axes={data: 1, fsdp: 2}",
            *FAST_STEP, "train.steps=2"]
    result = run_cli("launch", *args)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    train = json.loads(report_path(tmp_path / "runs" / "demo", "train", 0, 0).read_text())
    step = [f for f in train["functions"] if f["name"] == "jit_train_step"][-1]
    assert step["hit"], train["functions"]
    assert train["environment"]["JAX_COMPILATION_CACHE_DIR"] == f"s3://{BUCKET}/cache"
    assert train["environment"]["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    assert f"{BUCKET}/cache/{step['key']}-cache" in fs.ls(f"{BUCKET}/cache", refresh=True)
    # Nothing was written to a local path that merely looks like the URL.
    assert not (Path.cwd() / "s3:").exists()

    warm = run_cli("verify", *args)
    assert warm.returncode == 0, (warm.stdout + warm.stderr)[-3000:]
    assert "WARM" in warm.stdout

    # The store answers through epath what it can of the entries JAX wrote there, and keeps
    # no records; what only a local dir can do is refused in one line.
    store = open_store(f"s3://{BUCKET}/cache")
    size = fs.info(f"{BUCKET}/cache/{step['key']}-cache")["size"]
    assert store.has_entry(step["key"]) and store.entry_size(step["key"]) == size
    assert store.warm_check(step["key"]).warm and store.entry_problem(step["key"]) is None
    assert len(store.read_entry(step["key"], lambda found: found == size) or b"") == size
    assert store.read_entry(step["key"], lambda found: False) is None  # over a cap: unread
    assert not store.has_entry("jit_f-" + "0" * 64) and store.entry_size("jit_f-" + "0" * 64) \
        is None
    assert store.manifest() == {} and store.usage() == []
    listed = cli("cache", "ls", str(DEMO), f"cache.dir=s3://{BUCKET}/cache")
    assert listed.returncode == 2
    assert f"s3://{BUCKET}/cache: listing its entries needs a local or mounted cache dir" \
        in listed.stderr

"""Tests for jaxwarm.jaxkey.predict: predictions must equal the key JAX itself uses.

JAX fixes the device count at import, so every real-JAX check runs in a fresh subprocess
that prints one `RESULT <json>` line. Each subprocess compiles with the persistent cache
on and reads JAX's own key from the compiler's DEBUG log line, and JAX's own
per-component hashes from `jax._src.cache_key`'s DEBUG log lines.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from jaxwarm.jaxkey.components import COMPONENTS, explain, likely_causes
from jaxwarm.jaxkey.predict import KeyPrediction, explain_difference
from jaxwarm.jaxkey.versions import cache_path_in_key

REPO = Path(__file__).resolve().parents[1]

PRELUDE = r'''
import json, logging, os, time
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxwarm.jaxkey.predict import predict_key

jax.config.update("jax_compilation_cache_dir", os.environ["TEST_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class Capture(logging.Handler):
    """JAX's own cache lookups ("miss"/"hit", key) and per-component hashes."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.events, self.components = [], []

    def emit(self, record):
        if record.msg.startswith("PERSISTENT COMPILATION CACHE MISS"):
            self.events.append(("miss", record.args[1]))
        elif record.msg.startswith("Persistent compilation cache hit"):
            self.events.append(("hit", record.args[1]))
        elif record.msg.startswith("get_cache_key hash of serialized"):
            name, digest = record.args
            if name == "computation":
                self.components.append({})
            self.components[-1][name] = digest


CAPTURE = Capture()
for _name in ("jax._src.compiler", "jax._src.cache_key"):
    logging.getLogger(_name).setLevel(logging.DEBUG)
    logging.getLogger(_name).addHandler(CAPTURE)


def jax_lookup(run):
    """Run `run()` and return the one cache lookup JAX made during it."""
    n_events, n_components = len(CAPTURE.events), len(CAPTURE.components)
    run()
    assert len(CAPTURE.events) == n_events + 1, CAPTURE.events[n_events:]
    assert len(CAPTURE.components) == n_components + 1
    kind, key = CAPTURE.events[-1]
    return {"kind": kind, "key": key, "components": CAPTURE.components[-1]}


def check(lowered):
    """Predict, then compile; both JAX's lookup and the prediction, as plain dicts."""
    prediction = predict_key(lowered).to_json()
    return {"pred": prediction, "jax": jax_lookup(lowered.compile)}


def emit(obj):
    print("RESULT " + json.dumps(obj), flush=True)


def mlp(params, x):
    for w, b in params:
        x = jnp.tanh(x @ w + b)
    return x.sum()


def mlp_sds(layers, width, batch, x_sharding=None):
    params = [(jax.ShapeDtypeStruct((width, width), jnp.float32),
               jax.ShapeDtypeStruct((width,), jnp.float32)) for _ in range(layers)]
    return params, jax.ShapeDtypeStruct((batch, width), jnp.float32, sharding=x_sharding)
'''


def run_jax(code: str, devices: int, cache_dir: Path, timeout: float = 60,
            env: dict[str, str] | None = None, python: str = sys.executable) -> dict[str, Any]:
    """Run PRELUDE + code in a fresh CPU-only `python` with `devices` host devices."""
    full_env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONPATH": str(REPO),
        "TEST_CACHE_DIR": str(cache_dir),
        **(env or {}),
    }
    proc = subprocess.run([python, "-c", PRELUDE + code], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    return _result(proc.returncode, proc.stdout, proc.stderr)


def _result(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert returncode == 0 and lines, f"rc={returncode}\n{stdout}\n{stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def assert_matches_jax(case: dict[str, Any], kind: str = "miss") -> None:
    assert case["jax"]["kind"] == kind
    assert case["pred"]["key"] == case["jax"]["key"]
    assert case["pred"]["components"] == case["jax"]["components"]


# -- one device: AOT writer (A) and a fresh process (B) that runs with real arrays ----------

WRITER = r'''
emit(check(jax.jit(mlp).lower(*mlp_sds(layers=3, width=32, batch=8))))
'''

RUNNER = r'''
params = [(jnp.ones((32, 32), jnp.float32), jnp.zeros((32,), jnp.float32)) for _ in range(3)]
x = jnp.ones((8, 32), jnp.float32)
step = jax.jit(mlp)
prediction = predict_key(step.lower(params, x)).to_json()
emit({"pred": prediction, "jax": jax_lookup(lambda: step(params, x).block_until_ready())})
'''


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cache_dir = tmp_path_factory.mktemp("cache1")
    writer = run_jax(WRITER, devices=1, cache_dir=cache_dir)
    runner = run_jax(RUNNER, devices=1, cache_dir=cache_dir)
    return {"writer": writer, "runner": runner}


@pytest.mark.e2e
def test_mlp_one_device_matches_jax(one_device: dict[str, Any]) -> None:
    assert_matches_jax(one_device["writer"])
    assert one_device["writer"]["pred"]["module_name"] == "jit_mlp"


@pytest.mark.e2e
def test_prediction_is_the_key_a_fresh_process_hits(one_device: dict[str, Any]) -> None:
    predicted_by_writer = one_device["writer"]["pred"]["key"]
    runner = one_device["runner"]
    assert runner["pred"]["key"] == predicted_by_writer
    assert runner["jax"]["kind"] == "hit"
    assert runner["jax"]["key"] == predicted_by_writer


# -- eight host devices: shardings, donation, explicit in_shardings ------------------------
# (What a prediction costs is bench/key_cost.py's table, not a bound here.)

MESH8 = r'''
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
rows = NamedSharding(mesh, P("data", None))
cases = {}

def named(x, w):
    return jnp.tanh(x @ w).sum()

x_sds = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=rows)
w_sds = jax.ShapeDtypeStruct((32, 16), jnp.float32,
                             sharding=NamedSharding(mesh, P(None, "model")))
cases["named_sharding"] = check(jax.jit(named).lower(x_sds, w_sds))

def donated(x, y):
    return x + y

cases["donate"] = check(jax.jit(donated, donate_argnums=0).lower(x_sds, x_sds))

def explicit(x, w):
    return x @ w

plain = (jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((32, 16), jnp.float32))
cases["in_shardings"] = check(
    jax.jit(explicit, in_shardings=(rows, NamedSharding(mesh, P()))).lower(*plain))

def transformer(params, x):
    for wq, wk, wv, wo, w1, w2 in params:
        h = (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-6)
        q, k, v = (jnp.einsum("btd,dhk->bthk", h, w) for w in (wq, wk, wv))
        att = jax.nn.softmax(jnp.einsum("bthk,bshk->bhts", q, k) / 4.0, axis=-1)
        x = x + jnp.einsum("bhts,bshk,hkd->btd", att, v, wo)
        x = x + jax.nn.gelu(x @ w1) @ w2
    return (x ** 2).mean()

def transformer_sds(layers, d=64, heads=4, t=32, b=8):
    def sds(*shape, spec=P()):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
    attn = (sds(d, heads, d // heads, spec=P(None, "model")),) * 3
    layer = (*attn, sds(heads, d // heads, d, spec=P("model")),
             sds(d, 4 * d, spec=P(None, "model")), sds(4 * d, d, spec=P("model")))
    return [layer] * layers, sds(b, t, d, spec=P("data"))

cases["transformer"] = check(jax.jit(transformer).lower(*transformer_sds(layers=8)))

emit({"cases": cases})
'''


@pytest.fixture(scope="module")
def mesh8(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_jax(MESH8, devices=8, cache_dir=tmp_path_factory.mktemp("cache8"))


@pytest.mark.e2e
@pytest.mark.parametrize("case", ["named_sharding", "donate", "in_shardings", "transformer"])
def test_mesh8_matches_jax(mesh8: dict[str, Any], case: str) -> None:
    assert_matches_jax(mesh8["cases"][case])


# -- two processes x two devices with jax.distributed ---------------------------------------

DISTRIBUTED = r'''
jax.distributed.initialize(f"127.0.0.1:{os.environ['TEST_PORT']}", num_processes=2,
                           process_id=int(os.environ["TEST_PROCESS_ID"]))
mesh = Mesh(np.array(jax.devices()), ("data",))

def dist(x):
    return (x * 2).sum(axis=0)

x_sds = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P("data")))
result = check(jax.jit(dist).lower(x_sds))
result["process_index"] = jax.process_index()
result["global_devices"] = jax.device_count()
emit(result)
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    cache_dir = tmp_path_factory.mktemp("cache_dist")
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PRELUDE + DISTRIBUTED], cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
                 "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                 "TEST_CACHE_DIR": str(cache_dir), "TEST_PORT": port,
                 "TEST_PROCESS_ID": str(pid)})
        for pid in range(2)
    ]
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=600)
            results.append(_result(proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results


@pytest.mark.e2e
def test_distributed_each_process_predicts_its_own_key(
        distributed: list[dict[str, Any]]) -> None:
    assert [r["process_index"] for r in distributed] == [0, 1]
    assert all(r["global_devices"] == 4 for r in distributed)
    for result in distributed:
        assert_matches_jax(result)


@pytest.mark.e2e
def test_distributed_keys_differ_between_processes_on_cpu(
        distributed: list[dict[str, Any]]) -> None:
    """On CPU each process hashes its local topology: only process 0's key is shared."""
    first, second = (KeyPrediction.from_json(r["pred"]) for r in distributed)
    assert explain_difference(first, second) == ["accelerator_config"]


# -- cache dir through a symlink ------------------------------------------------------------

SYMLINK = r'''
def fresh_lowering():
    """Drop JAX's in-memory caches, which would otherwise skip the persistent lookup."""
    jax.clear_caches()
    return jax.jit(mlp).lower(*mlp_sds(layers=2, width=16, batch=4))

results = {"link": check(fresh_lowering())}
jax.config.update("jax_compilation_cache_dir", os.environ["TEST_REAL_DIR"])
results["real"] = check(fresh_lowering())
jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
results["real_none"] = check(fresh_lowering())
jax.config.update("jax_compilation_cache_dir", os.environ["TEST_CACHE_DIR"])
results["link_none"] = check(fresh_lowering())
emit(results)
'''


@pytest.mark.e2e
def test_symlinked_cache_dir_changes_compile_options_before_jax_0_11(tmp_path: Path) -> None:
    """Before jax 0.11 the cache path is in the compile options unless the XLA caches are
    off; from 0.11 it never is, and a symlinked cache dir gives the same key."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    results = run_jax(SYMLINK, devices=1, cache_dir=link, env={"TEST_REAL_DIR": str(real)})
    for name in ("link", "real", "real_none", "link_none"):
        assert results[name]["pred"]["key"] == results[name]["jax"]["key"], name
    pred = {name: KeyPrediction.from_json(r["pred"]) for name, r in results.items()}
    path_in_key = cache_path_in_key(metadata.version("jax"),
                                    "xla_gpu_per_fusion_autotune_cache_dir")
    differs = ["compile_options"] if path_in_key else []
    assert explain_difference(pred["link"], pred["real"]) == differs
    assert pred["real_none"].key == pred["link_none"].key
    assert explain_difference(pred["link"], pred["link_none"]) == differs


# -- versions, seam, and the probe leaving no trace (one fresh process) ----------------------

GUARDS = r'''
from jax._src import compilation_cache
from jaxwarm.jaxkey import KeyNotComputed
from jaxwarm.jaxkey import UnsupportedJaxVersion
from jaxwarm.jaxkey import versions

def tiny(x):
    return x * 3.0

def error(run):
    try:
        run()
    except (KeyNotComputed, UnsupportedJaxVersion) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

lowered = jax.jit(tiny).lower(jax.ShapeDtypeStruct((4,), jnp.float32))
cache_key_logger = logging.getLogger("jax._src.cache_key")
before = (compilation_cache.get_cache_key, compilation_cache.is_cache_used,
          cache_key_logger.level, list(cache_key_logger.filters))
out = {}
real_installed = versions.installed
versions.installed = lambda: versions.JaxVersions("9.9.9", "9.9.9")
out["untested"] = error(lambda: predict_key(lowered))
os.environ["JAXWARM_ALLOW_UNTESTED_JAX"] = "1"
out["allowed"] = predict_key(lowered).module_name
versions.installed = real_installed
saved = compilation_cache.is_cache_used
del compilation_cache.is_cache_used
out["no_seam"] = error(lambda: predict_key(lowered))
compilation_cache.is_cache_used = saved
from jax._src import compiler
compiler.get_cache_key = compilation_cache.get_cache_key  # as `from ... import` would bind it
out["bypassed"] = error(lambda: predict_key(lowered))
del compiler.get_cache_key
jax.config.update("jax_enable_compilation_cache", False)
compilation_cache.reset_cache()  # JAX decides once per process whether the cache is used
out["cache_off"] = error(lambda: predict_key(lowered))
jax.config.update("jax_enable_compilation_cache", True)
compilation_cache.reset_cache()
predicted = predict_key(lowered).key
after = (compilation_cache.get_cache_key, compilation_cache.is_cache_used,
         cache_key_logger.level, list(cache_key_logger.filters))
out["restored"] = before == after
lowered.compile()
out["written"] = sorted(p.name for p in __import__("pathlib").Path(
    os.environ["TEST_CACHE_DIR"]).glob("*-cache"))
out["predicted"] = predicted
again = jax.jit(tiny).lower(jax.ShapeDtypeStruct((4,), jnp.float32))
out["in_memory"] = error(lambda: predict_key(again))
emit(out)
'''


@pytest.fixture(scope="module")
def guards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_jax(GUARDS, devices=1, cache_dir=tmp_path_factory.mktemp("guards"),
                   env={"JAXWARM_ALLOW_UNTESTED_JAX": ""})


def assert_probe_guards(guards: dict[str, Any]) -> None:
    """What GUARDS found, as a user would check it (also run on every leg)."""
    # Untested: one line naming the version and the range; the escape hatch tries anyway.
    assert guards["untested"].startswith(
        "UnsupportedJaxVersion: jax 9.9.9 is outside jaxwarm's tested range, jax 0.8.x to 0.12.x")
    assert "JAXWARM_ALLOW_UNTESTED_JAX=1" in guards["untested"]
    assert "\n" not in guards["untested"]
    assert guards["allowed"] == "jit_tiny"
    # A missing seam, or one the compiler would bypass, is refused before anything runs.
    assert "jax._src.compilation_cache has no is_cache_used" in guards["no_seam"]
    assert "jax._src.compiler imports get_cache_key by name" in guards["bypassed"]
    # No cache: no key to predict (JAX would not look one up).
    assert guards["cache_off"].startswith("KeyNotComputed: JAX would not look this program up")
    # After probes that failed and one that succeeded, JAX's functions and logger are as
    # they were, and the real compile of the same Lowered writes the predicted entry.
    assert guards["restored"]
    assert guards["written"] == [guards["predicted"] + "-cache"]
    # Compiled earlier in this process: JAX answers from memory, and the probe says so.
    assert "in-memory cache" in guards["in_memory"]


@pytest.mark.e2e
def test_probe_guards_and_leaves_no_trace(guards: dict[str, Any]) -> None:
    assert_probe_guards(guards)


# -- pure parts ------------------------------------------------------------------------------

def _prediction(key: str, **changed: str) -> KeyPrediction:
    components = {name: f"hash-of-{name}" for name in COMPONENTS}
    components.update(changed)
    return KeyPrediction(key=key, module_name="jit_f", components=components)


# -- PGLE: two keys per compile -----------------------------------------------------------

PGLE_KEYS = r'''
from jaxwarm.jaxkey.pgle import pgle_components
from jaxwarm.jaxkey.pgle import watch_pgle_keys

jax.config.update("jax_enable_pgle", True)
watch_pgle_keys()
lowered = jax.jit(mlp).lower(*mlp_sds(layers=2, width=32, batch=8))
prediction = predict_key(lowered).to_json()
first = jax_lookup(lowered.compile)
# A compile given a profile, as PGLE's second one is: stored under the PGLE-optimized key.
profiled = jax_lookup(lambda: lowered.compile({"fdo_profile": b"a profile"}))
emit({"pred": prediction, "first": first, "profiled": profiled,
      "watched": pgle_components(prediction["pgle_key"])})
'''


def assert_pgle_keys(result: dict[str, Any]) -> None:
    """With PGLE on, the prediction is the first compile's key (components included), its
    `pgle_key` the key a compile with a profile is stored under, which the watcher knows."""
    pred, first, profiled = result["pred"], result["first"], result["profiled"]
    assert first["kind"] == "miss" and pred["key"] == first["key"]
    assert pred["components"] == first["components"]
    assert profiled["kind"] == "miss" and profiled["key"] == pred["pgle_key"] != pred["key"]
    assert result["watched"] and "compile_options" in result["watched"]


@pytest.mark.e2e
def test_with_pgle_the_prediction_is_the_first_compile_s_key(tmp_path: Path) -> None:
    assert_pgle_keys(run_jax(PGLE_KEYS, devices=1, cache_dir=tmp_path))


def test_components_in_jax_order() -> None:
    assert COMPONENTS == ("computation", "jax_lib version", "backend version", "XLA flags",
                          "compile_options", "accelerator_config", "compression",
                          "custom_hook")


def test_explain_difference_names_differing_components_in_order() -> None:
    expected = _prediction("jit_f-aaa")
    actual = _prediction("jit_f-bbb", compression="x", computation="y")
    assert explain_difference(expected, actual) == ["computation", "compression"]


def test_explain_difference_equal_keys() -> None:
    assert explain_difference(_prediction("jit_f-a"), _prediction("jit_f-a")) == []


def test_explain_difference_unknown_components_last() -> None:
    expected = _prediction("jit_f-a")
    actual = KeyPrediction("jit_f-b", "jit_f", {**expected.components, "new thing": "z"})
    assert explain_difference(expected, actual) == ["new thing"]


def test_json_round_trip() -> None:
    prediction = _prediction("jit_f-abc")
    data = json.loads(json.dumps(prediction.to_json()))
    assert KeyPrediction.from_json(data) == prediction


def test_likely_causes() -> None:
    """A few words per component, printed with a miss; the catalogue of what can change
    each one is in docs/verify.md, one row per component."""
    catalogue = (REPO / "docs" / "verify.md").read_text().split(
        "## What changes each component", 1)[1]
    for name in COMPONENTS:
        assert likely_causes(name) and "unknown" not in likely_causes(name)
        assert len(likely_causes(name)) <= 64, likely_causes(name)
        assert f"| {name} |" in catalogue, name
    assert "cache path" in likely_causes("compile_options")
    assert "sys.argv" in likely_causes("XLA flags")
    assert "device count" in likely_causes("accelerator_config")
    assert "zstandard" in likely_causes("compression")
    assert "unknown" in likely_causes("no such component")


def test_explain_names_component_and_cause() -> None:
    base = {name: "h" for name in COMPONENTS}
    lines = explain(base, {**base, "XLA flags": "other"})
    assert lines == [f"XLA flags differs: {likely_causes('XLA flags')}"]

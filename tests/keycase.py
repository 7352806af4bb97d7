"""One side of cache-key matrix cases, in a fresh process.

    python tests/keycase.py ROLE VARIATION[,VARIATION...] WORKDIR [extra argv...]

ROLE `prewarm`: lower `train_step` from ShapeDtypeStructs, predict its key, compile it with the
persistent cache on under an `InitRecorder`, and record a manifest entry with the key and components
JAX itself logged. ROLE `run`: lower the run's way (from the real arrays), call
`jaxwarm.job.warm.judge`, then call the function on real arrays under an `InitRecorder`.
Each case has its own cache, `WORKDIR/<variation>/cache`, and writes what it predicted and what JAX
did to `WORKDIR/<variation>/<role>.json`.

`VARIATIONS` is the table of (prewarm side, run side). Settings JAX reads at import or from
the process (device count, XLA_FLAGS, sys.argv) are part of a `Side` too: the test starts
the process with `side_env(side, workdir, jax)` and `side.argv` (`command`), and this
script checks it got them. Every process compiles the cheapest way (`cheapest_compile`: the
same flags on both sides, so no case differs by them). Cases whose side has the same such
settings can share one process (`batches`): between cases it points JAX at the next cache
dir and drops its in-memory caches, so each case still starts from JAX's persistent cache
alone. Importing this module does not import jax.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAST_MATH = "--xla_cpu_enable_fast_math=true"


@dataclass(frozen=True)
class Side:
    """How one process (prewarm or run) builds, lowers and calls the step."""

    devices: int = 8                      # fake host devices (the mesh always uses the first 8)
    xla_flags: tuple[str, ...] = ()       # added to XLA_FLAGS
    argv: tuple[str, ...] = ()            # extra sys.argv entries (JAX hashes --xla_* ones)
    mesh: tuple[int, int] = (8, 1)        # ("data", "model") shape
    make_mesh: bool = False               # jax.make_mesh (Explicit axes) instead of Mesh (Auto)
    jit_shardings: str = ""               # jit(in_shardings=...): "all" (n replicated) or
                                          # "arrays" (n None); "": argument shardings
    unsharded: tuple[str, ...] = ()       # prewarm only: SDS of these inputs carry no sharding
    donate: bool = False                  # donate_argnums=(0,)
    lr: float = 0.1                       # static argument
    int8_positions: bool = False          # the batch has int8 "pos"; the step returns pos + n
    precision: str | None = None          # jax_default_matmul_precision
    name: str = "train_step"              # the Python function's name (-> module name)
    python_int_n: bool = False            # run only: n as a Python int (weak type), not np.int32
    symlink: bool = False                 # reach the cache dir through a symlink
    xla_caches: str | None = None         # jax_persistent_cache_enable_xla_caches (as the
                                          # in-job hook sets cache.xla_caches); None: the default


BASE = Side()


def _case(prewarm: dict | None = None, run: dict | None = None,
          both: dict | None = None) -> tuple[Side, Side]:
    shared = replace(BASE, **(both or {}))
    return replace(shared, **(prewarm or {})), replace(shared, **(run or {}))


VARIATIONS: dict[str, tuple[Side, Side]] = {
    "baseline": _case(),
    "unsharded_dummy_batch": _case(prewarm={"unsharded": ("batch",)}),
    "jit_in_shardings_vs_arg_shardings": _case(
        prewarm={"jit_shardings": "all", "unsharded": ("params", "batch")}),
    "jit_in_shardings_same_as_args": _case(
        prewarm={"jit_shardings": "arrays", "unsharded": ("params", "batch")}),
    "jit_in_shardings_both": _case(
        both={"jit_shardings": "all"}, prewarm={"unsharded": ("params", "batch")}),
    "donate_argnums": _case(run={"donate": True}),
    "static_arg": _case(run={"lr": 0.2}),
    "xla_flags_env": _case(run={"xla_flags": (FAST_MATH,)}),
    "xla_dump_to": _case(run={"xla_flags": ("--xla_dump_to={workdir}/xla-dump",)}),
    "xla_flag_in_argv": _case(run={"argv": (FAST_MATH,)}),
    "matmul_precision": _case(run={"precision": "highest"}),
    "renamed_function": _case(run={"name": "train_step_v2"}),
    "python_int_n": _case(run={"python_int_n": True}),
    "python_int_n_meets_int8": _case(both={"int8_positions": True},
                                     run={"python_int_n": True}),
    "mesh_shape": _case(prewarm={"mesh": (8, 1)}, run={"mesh": (4, 2)}),
    "make_mesh_vs_mesh": _case(prewarm={"make_mesh": True}),
    "device_count": _case(run={"devices": 16}),
    "cache_dir_symlink": _case(run={"symlink": True}),
    "symlink_no_xla_caches": _case(both={"xla_caches": "none"}, run={"symlink": True}),
}


def xla_flags(side: Side, workdir: Path) -> list[str]:
    return [f"--xla_force_host_platform_device_count={side.devices}",
            *(flag.format(workdir=workdir) for flag in side.xla_flags)]


def cheapest_compile(jax: str) -> tuple[str, ...]:
    """The XLA flags every process of every case starts with on this jax: LLVM at -O0 and
    (conftest's `legacy_fusion`) the older CPU fusion emitter where it still is. On both
    sides alike, so no case differs by them; each case still compiles and compares a real
    entry, at a fraction of the CPU."""
    from tests.conftest import legacy_fusion

    return ("--xla_backend_optimization_level=0", *legacy_fusion(jax))


def side_env(side: Side, workdir: Path, jax: str) -> dict[str, str]:
    """The environment a process of this side must start with on this jax (JAX reads it
    at import): the side's XLA flags after `cheapest_compile`'s."""
    env = dict(os.environ)
    env.pop("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", None)
    env["XLA_FLAGS"] = " ".join([*cheapest_compile(jax), *xla_flags(side, workdir)])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def sides(variation: str) -> dict[str, Side]:
    prewarm, run = VARIATIONS[variation]
    return {"prewarm": prewarm, "run": run}


def process_settings(side: Side) -> tuple:
    """What a process must be started with (JAX reads it at import or from the process)."""
    return side.devices, side.xla_flags, side.argv


def batches(role: str, variations: list[str]) -> list[list[str]]:
    """The variations grouped so that each group's `role` side can share one process."""
    groups: dict[tuple, list[str]] = {}
    for variation in variations:
        groups.setdefault(process_settings(sides(variation)[role]), []).append(variation)
    return list(groups.values())


def case_dir(workdir: Path, variation: str) -> Path:
    return workdir / variation


def command(role: str, variations: list[str], workdir: Path,
            python: str = sys.executable) -> list[str]:
    side = sides(variations[0])[role]
    return [python, str(Path(__file__).resolve()), role, ",".join(variations), str(workdir),
            *side.argv]


def link_path(cache_dir: str) -> str:
    return str(Path(cache_dir).parent / (Path(cache_dir).name + "-link"))


# ---------------------------------------------------------------------------------------------
# Inside the process.

def _check_process(side: Side, workdir: Path) -> None:
    """Refuse to run when the test did not start this process the way `side` says."""
    import jax

    flags = os.environ.get("XLA_FLAGS", "").split()
    problems = [f"{flag} not in XLA_FLAGS" for flag in xla_flags(side, workdir)
                if flag not in flags]
    if len(jax.devices()) != side.devices:
        problems.append(f"{len(jax.devices())} devices, expected {side.devices}")
    if tuple(sys.argv[4:]) != side.argv:
        problems.append(f"extra argv {sys.argv[4:]}, expected {list(side.argv)}")
    if problems:
        raise SystemExit("keycase: process not set up as its side says: " + "; ".join(problems))


def _train_step(params, batch, n, lr):
    import jax
    import jax.numpy as jnp

    def loss_fn(p):
        h = jnp.tanh(batch["x"] @ p["w1"])
        return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    scale = lr / (1 + n)
    new_params = jax.tree.map(lambda w, g: w - scale * g, params, grads)
    if "pos" in batch:  # int8 + weak int -> int8; int8 + int32 -> int32
        return new_params, loss, batch["pos"] + n
    return new_params, loss


def _shapes(side: Side) -> dict[str, dict[str, tuple[tuple[int, ...], str]]]:
    batch = {"x": ((16, 16), "float32"), "y": ((16, 4), "float32")}
    if side.int8_positions:
        batch["pos"] = ((16,), "int8")
    return {"params": {"w1": ((16, 32), "float32"), "w2": ((32, 4), "float32")},
            "batch": batch}


def _build(side: Side):
    """(jitted step, {input: tree of NamedSharding}) built the side's way."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    axes = ("data", "model")
    if side.make_mesh:
        mesh = jax.make_mesh(side.mesh, axes, devices=jax.devices()[:8])
    else:
        mesh = Mesh(np.array(jax.devices()[:8]).reshape(side.mesh), axes)
    specs = {"params": P(), "batch": P("data")}
    shardings = {name: {leaf: NamedSharding(mesh, specs[name]) for leaf in leaves}
                 for name, leaves in _shapes(side).items()}

    def step(params, batch, n, lr):
        return _train_step(params, batch, n, lr)

    step.__name__ = step.__qualname__ = side.name
    kwargs = {"static_argnums": (3,)}
    if side.donate:
        kwargs["donate_argnums"] = (0,)
    if side.jit_shardings:
        kwargs["in_shardings"] = (shardings["params"], shardings["batch"],
                                  NamedSharding(mesh, P()) if side.jit_shardings == "all"
                                  else None)
    return jax.jit(step, **kwargs), shardings


def _recorder(workdir: Path, role: str):
    from jaxwarm.core.records import InitReport
    from jaxwarm.job.record.recorder import InitRecorder

    report = InitReport(job=role, restart_count=0, process_index=0, process_count=1,
                        cache_dir=str(workdir), init_budget_s=60.0)
    return InitRecorder(report, workdir / f"{role}-report.json").install()


def _observed(recorder, since: int, function: str) -> dict:
    """The one compile of `function` recorded since the case began (`since` records)."""
    functions = recorder.report.functions[since:]
    records = [r for r in functions if r.name == function]
    names = [r.name for r in functions]
    assert len(records) == 1, f"expected one compile of {function}, recorded {names}"
    return {**asdict(records[0]), "all_functions": names}


def _prewarm(side: Side, cache_dir: str, recorder, variation: str) -> dict:
    import jax
    import numpy as np

    from jaxwarm.jaxkey.predict import predict_key
    from jaxwarm.store.manifest import ManifestEntry
    from jaxwarm.store.store import open_store

    since = len(recorder.report.functions)
    step, shardings = _build(side)
    sds = {name: {leaf: jax.ShapeDtypeStruct(
                      shape, dtype,
                      sharding=None if name in side.unsharded else shardings[name][leaf])
                  for leaf, (shape, dtype) in leaves.items()}
           for name, leaves in _shapes(side).items()}
    start = time.perf_counter()
    lowered = step.lower(sds["params"], sds["batch"], jax.ShapeDtypeStruct((), np.int32),
                         side.lr)
    lower_s = time.perf_counter() - start
    prediction = predict_key(lowered)
    start = time.perf_counter()
    lowered.compile()
    compile_s = time.perf_counter() - start
    observed = _observed(recorder, since, prediction.module_name)
    open_store(cache_dir).record_entries([ManifestEntry(
        function=prediction.module_name, key=observed["key"], run="keycase-prewarm",
        config=variation, compile_s=compile_s, lower_s=lower_s, written=True,
        jax_version=jax.__version__, process_count=jax.process_count(),
        components=observed["components"])])
    return {"prediction": prediction.to_json(), "observed": observed}


def _run(side: Side, cache_dir: str, recorder) -> dict:
    import jax
    import numpy as np

    from jaxwarm.job.warm import judge, predicted
    from jaxwarm.store.store import open_store

    report = recorder.report
    since = (len(report.functions), report.lookups, report.hits)
    step, shardings = _build(side)
    rng = np.random.default_rng(0)
    arrays = {name: {leaf: jax.device_put(
                         (10 * rng.standard_normal(shape)).astype(dtype),
                         shardings[name][leaf])
                     for leaf, (shape, dtype) in leaves.items()}
              for name, leaves in _shapes(side).items()}
    n = 3 if side.python_int_n else np.int32(3)
    lowered = step.lower(arrays["params"], arrays["batch"], n, side.lr)

    before = (report.lookups, len(report.functions), report.backend_compile_s)
    verdict = judge(predicted("step", lowered, 0.0), open_store(cache_dir)).verdict()
    during_judge = {"lookups": report.lookups - before[0],
                    "compiles": len(report.functions) - before[1],
                    "backend_compile_s": report.backend_compile_s - before[2]}

    loss = step(arrays["params"], arrays["batch"], n, side.lr)[1]
    jax.block_until_ready(loss)
    return {"verdict": asdict(verdict), "during_judge": during_judge,
            "observed": _observed(recorder, since[0], verdict.function),
            "hits": report.hits - since[2], "lookups": report.lookups - since[1]}


def _use_cache_dir(cache_dir: str) -> None:
    """Point JAX at this case's cache, with nothing of the previous case kept in memory."""
    import jax
    from jax._src import compilation_cache

    jax.clear_caches()
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    compilation_cache.reset_cache()


def _one_case(role: str, variation: str, workdir: Path, recorder) -> None:
    import jax

    side = sides(variation)[role]
    cache_dir = str(case_dir(workdir, variation) / "cache")
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    if side.symlink:
        link = Path(link_path(cache_dir))
        if not link.exists():
            link.symlink_to(Path(cache_dir).resolve(), target_is_directory=True)
        cache_dir = str(link)
    _use_cache_dir(cache_dir)
    xla_caches = jax.config.jax_persistent_cache_enable_xla_caches
    jax.config.update("jax_default_matmul_precision", side.precision)
    if side.xla_caches is not None:
        jax.config.update("jax_persistent_cache_enable_xla_caches", side.xla_caches)
    try:
        result = (_prewarm(side, cache_dir, recorder, variation) if role == "prewarm"
                  else _run(side, cache_dir, recorder))
    finally:
        jax.config.update("jax_default_matmul_precision", None)
        jax.config.update("jax_persistent_cache_enable_xla_caches", xla_caches)
    out = case_dir(workdir, variation) / f"{role}.json"
    out.write_text(json.dumps({"role": role, "variation": variation, "cache_dir": cache_dir,
                               "jax_version": jax.__version__, **result}, indent=1) + "\n")


def main(argv: list[str]) -> int:
    role, variations, workdir = argv[1], argv[2].split(","), Path(argv[3])
    settings = {process_settings(sides(v)[role]) for v in variations}
    if len(settings) != 1:
        raise SystemExit(f"keycase: {variations} need different processes: {settings}")
    _check_process(sides(variations[0])[role], workdir)
    import jax

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    recorder = _recorder(workdir, role)
    for variation in variations:
        _one_case(role, variation, workdir, recorder)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main(sys.argv))

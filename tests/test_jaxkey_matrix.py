"""The cache-key matrix: a prewarm process and a run process that differ in one way.

For each variation of `tests/keycase.py`'s table, a fresh PREWARM process compiles the step with the
persistent cache on and records a manifest entry with the key and components JAX itself logged; a
fresh RUN process, with the variation applied, asks `jaxwarm.job.warm.judge` (prediction
only) and then really calls the step under an `InitRecorder`. Asserted per variation: the predicted
key (and each component) is the key JAX used; WARM/COLD is JAX's hit/miss; judging neither looked up
the cache nor compiled; a miss is explained by exactly the components measured below, which are
named in the explanation. The cases whose side needs the same process settings share one process
(`keycase.batches`, which starts each case from its own cache with JAX's in-memory caches dropped):
6 processes for the table, not 38.

Expectations are what jax/jaxlib 0.10.2 on CPU does; `expected` adjusts them for the
other tested versions (tests/test_jax_versions.py runs the matrix there). Where that differs
from the table in the shared notes (jax-cache-facts.md), the entry says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from jaxwarm.core.records import FunctionRecord
from jaxwarm.jaxkey.components import differing_components
from jaxwarm.jaxkey.versions import cache_path_in_key, release
from jaxwarm.store.misses import CAUSE_WIDTH
from jaxwarm.store.store import LocalStore
from tests.keycase import REPO, VARIATIONS, batches, case_dir, command, side_env, sides

# The components' initials.
C, O, F, A = "computation", "compile_options", "XLA flags", "accelerator_config"  # noqa: E741


class Expect(NamedTuple):
    hit: bool
    differing: frozenset[str] = frozenset()


EXPECTED: dict[str, Expect] = {
    "baseline": Expect(True),
    # Prewarm from an unsharded dummy batch, run with sharded arrays (no in_shardings).
    "unsharded_dummy_batch": Expect(False, frozenset({C, O})),
    # Notes: computation + compile_options. Measured: computation only. The whole difference
    # is the scalar `n`: in_shardings gives it a replicated NamedSharding while the run's
    # NumPy scalar is uncommitted (unspecified); see the next case.
    "jit_in_shardings_vs_arg_shardings": Expect(False, frozenset({C})),
    # Explicit in_shardings equal to the arguments' own (n: None) lower to the same program:
    # explicit vs argument shardings is not a miss by itself.
    "jit_in_shardings_same_as_args": Expect(True),
    "jit_in_shardings_both": Expect(True),
    "donate_argnums": Expect(False, frozenset({C})),
    "static_arg": Expect(False, frozenset({C})),
    # Notes: XLA flags. Measured: also compile_options: XLA parses XLA_FLAGS into the
    # DebugOptions inside the compile options (debug_options.xla_cpu_enable_fast_math is
    # True there). A flag only in sys.argv is hashed by JAX but never parsed by XLA (the
    # option stays False): a miss with no effect on the executable.
    "xla_flags_env": Expect(False, frozenset({F, O})),
    "xla_dump_to": Expect(True),
    "xla_flag_in_argv": Expect(False, frozenset({F})),
    "matmul_precision": Expect(False, frozenset({C})),
    # The module name differs, so verify finds no prewarm of that name; the components are
    # compared against the one manifest entry explicitly.
    "renamed_function": Expect(False, frozenset({C})),
    # Notes: miss (computation). Measured: HIT. A weak-typed Python int lowers to the same
    # i32 argument as an int32 spec; it changes the program only where weak typing changes
    # a dtype, e.g. when it meets an int8 array (next case). In this step it only meets
    # Python floats (lr / (1 + n) is weak float32 either way) and float32 arrays.
    "python_int_n": Expect(True),
    "python_int_n_meets_int8": Expect(False, frozenset({C})),
    "mesh_shape": Expect(False, frozenset({C})),
    # Notes: computation. Measured: computation + compile_options: with Explicit axes the
    # output shardings are concrete (from the types) instead of unspecified, so
    # executable_build_options.allow_spmd_sharding_propagation_to_output is False.
    "make_mesh_vs_mesh": Expect(False, frozenset({C, O})),
    "device_count": Expect(False, frozenset({A})),
    "cache_dir_symlink": Expect(False, frozenset({O})),
    "symlink_no_xla_caches": Expect(True),
}


def expected(variation: str, jax_version: str) -> Expect:
    """EXPECTED on this jax. From 0.11 the cache path (XLA's autotune dir) is not in the key,
    so reaching the cache through a symlink hits; before 0.9 `jax.make_mesh` made Auto axes
    by default (with a DeprecationWarning), like `Mesh(...)`, so the two hit."""
    if variation == "cache_dir_symlink" and not cache_path_in_key(
            jax_version, "xla_gpu_per_fusion_autotune_cache_dir"):
        return Expect(True)
    if variation == "make_mesh_vs_mesh" and release(jax_version) < (0, 9):
        return Expect(True)
    return EXPECTED[variation]


def run_sides(role: str, variations: list[str], workdir: Path, python: str,
              jax: str) -> dict[str, dict[str, Any]]:
    """Run one side of these cases in one fresh process of PYTHON (whose jax is JAX); each
    case's JSON result."""
    proc = subprocess.run(command(role, variations, workdir, python),
                          env=side_env(sides(variations[0])[role], workdir, jax), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"keycase {role} {variations} exited {proc.returncode}:\n"
                             f"{(proc.stdout + proc.stderr)[-4000:]}")
    return {v: json.loads((case_dir(workdir, v) / f"{role}.json").read_text())
            for v in variations}


def run_matrix(variations: list[str], workdir: Path, python: str,
               jax: str) -> dict[str, tuple[dict, dict]]:
    """Every case's (prewarm, run) results, each role's cases in as few processes of PYTHON
    (whose jax is JAX) as their process settings allow; every prewarm side runs before any
    run side."""
    results: dict[str, dict[str, dict]] = {"prewarm": {}, "run": {}}
    for role in ("prewarm", "run"):
        for group in batches(role, variations):
            results[role].update(run_sides(role, group, workdir, python, jax))
    return {v: (results["prewarm"][v], results["run"][v]) for v in variations}


def test_every_variation_has_an_expectation() -> None:
    assert set(EXPECTED) == set(VARIATIONS)
    assert len(VARIATIONS) >= 14


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[dict, dict]]]:
    """Every case, batched as the legs run it (`run_matrix`): a few processes for the whole
    table instead of two per case, each case still on its own cache."""
    workdir = tmp_path_factory.mktemp("matrix")
    return workdir, run_matrix(list(VARIATIONS), workdir, sys.executable, version("jax"))


@pytest.mark.e2e
@pytest.mark.parametrize("variation", list(VARIATIONS))
def test_key_matrix(variation: str, matrix: tuple[Path, dict[str, tuple[dict, dict]]]) -> None:
    workdir, results = matrix
    pre, run = results[variation]
    check_case(variation, pre, run, case_dir(workdir, variation) / "cache")


def check_case(variation: str, pre: dict[str, Any], run: dict[str, Any], cache: Path) -> None:
    """What a user relies on in one case: the prediction is JAX's key, WARM/COLD is JAX's
    hit/miss, and a miss names the components that differ."""
    expect = expected(variation, run["jax_version"])
    assert pre["prediction"]["key"] == pre["observed"]["key"]
    assert pre["prediction"]["components"] == pre["observed"]["components"]
    assert not pre["observed"]["hit"], "the prewarm's cache was not empty"
    entry = LocalStore(cache).manifest()[pre["observed"]["key"]]
    assert LocalStore(cache).entry_path(entry.key).is_file()

    verdict, observed = run["verdict"], run["observed"]
    # Judging lowered and predicted only: no cache lookup, no backend compile.
    assert run["during_judge"] == {"lookups": 0, "compiles": 0, "backend_compile_s": 0.0}
    # 1. The prediction is the key (and every component hash) JAX used at run time.
    assert verdict["key"] == observed["key"]
    assert verdict["components"] == observed["components"]
    # 2. WARM/COLD is JAX's hit/miss, and both are what this variation does.
    assert (verdict["warm"], observed["hit"]) == (expect.hit, expect.hit)
    assert (run["lookups"], run["hits"]) == (1, int(expect.hit))

    # 3. Misses are explained in one short line, by the components that differ from the
    # manifest's entry, against the run that prewarmed it; the training job's report says
    # the same line from what it recorded.
    differing = differing_components(entry.components, verdict["components"])
    assert set(differing) == expect.differing
    explanation = verdict["explanation"]
    if expect.hit:
        assert verdict["key"] == entry.key and not explanation
        return
    assert len(explanation) == 1 and len(explanation[0]) <= CAUSE_WIDTH, explanation
    store = LocalStore(cache)
    recorded = FunctionRecord(observed["name"], observed["key"], False,
                              components=observed["components"])
    assert store.explain_miss(recorded, store.manifest()) == explanation
    if verdict["function"] != entry.function:
        # Renamed: the key's module-name prefix differs, the manifest has no such function.
        assert variation == "renamed_function"
        assert verdict["key"].split("-")[0] != entry.key.split("-")[0]
        assert explanation == [
            f"no prewarm of {verdict['function']} is recorded in the manifest; it has "
            f"{entry.function} (renamed? a function's name is part of its program)"]
    else:
        assert f"run {entry.run!r}" in explanation[0], explanation
        for component in differing:
            assert component in explanation[0], explanation

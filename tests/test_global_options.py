"""The trainer's process-global JAX settings are part of the contract: the prewarm records
them with each manifest entry, and when the run's differ (here the PRNG implementation,
which also changes the key's shape, so the step looks like another function), the training
job, verify and the report name the option instead of "another function named ..."."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import TRAIN, InitReport
from jaxwarm.core.rundir import report_path
from jaxwarm.store.store import open_store
from tests.conftest import Cli, run_cli
from tests.test_launch_forms import FORMS, write_config

NAMED = "jax_default_prng_impl differs: prewarm threefry2x32, {job} unsafe_rbg"


@pytest.mark.e2e
def test_a_planted_prng_difference_is_named(tmp_path: Path, cli: Cli) -> None:
    config = write_config(tmp_path, tmp_path / "cache", {"module": "tinytrain"}, [FORMS])
    data = json.loads(config.read_text())
    data["entrypoint"]["args"] += ["--prng", "unsafe_rbg"]  # the factory does not set it
    config.write_text(json.dumps(data))

    prewarmed = run_cli("prewarm", str(config), "--local")
    assert prewarmed.returncode == 0, prewarmed.stderr[-3000:]
    entry, = open_store(str(tmp_path / "cache")).manifest().values()
    assert entry.global_options["jax_default_prng_impl"] == "threefry2x32"

    verified = run_cli("verify", str(config), "--local", "step.args={prng: unsafe_rbg}")
    assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
    assert NAMED.format(job="verify") in verified.stdout, verified.stdout
    assert "another function named" not in verified.stdout

    launched = run_cli("launch", str(config), "--local", "--no-prewarm")
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    train = read_record(InitReport, report_path(tmp_path / "runs" / "forms", TRAIN, 0, 0))
    assert train is not None
    assert any(NAMED.format(job="run") in w.text for w in train.warnings), train.warnings
    assert NAMED.format(job="run") in launched.stdout

    shown = cli("report", str(tmp_path / "runs" / "forms"))
    assert NAMED.format(job="run") in shown.stdout, shown.stdout


def test_settings_are_named_before_the_signature_and_beside_the_components(
        tmp_path: Path) -> None:
    from jaxwarm.core.records import FunctionRecord
    from jaxwarm.store.manifest import ManifestEntry
    from jaxwarm.store.misses import CAUSE_WIDTH, MissContext
    from jaxwarm.store.store import LocalStore

    prewarm = {"jax_default_prng_impl": "threefry2x32", "jax_enable_x64": "False",
               "LIBTPU_INIT_ARGS": ""}
    entry = ManifestEntry(function="jit_step", key="jit_step-" + "a" * 64, run="r", config="c",
                          compile_s=1.0, lower_s=0.1, written=True, jax_version="0.10.2",
                          process_count=1, components={"computation": "1"}, signature="s1",
                          global_options=prewarm)
    manifest = {entry.key: entry}
    store = LocalStore(tmp_path)
    run = {**prewarm, "jax_default_prng_impl": "unsafe_rbg", "LIBTPU_INIT_ARGS": "--x=1"}
    def missed(signature: str, global_options: dict[str, str]) -> FunctionRecord:
        return FunctionRecord("jit_step", None, False, components={"computation": "2"},
                              signature=signature, global_options=global_options)

    settings = ("jax_default_prng_impl differs: prewarm threefry2x32, run unsafe_rbg; "
                "LIBTPU_INIT_ARGS differs: prewarm (unset), run --x=1")
    other_types = store.explain_miss(missed("s2", run), manifest, MissContext(run="r"))
    assert other_types == [f"{settings} (against the prewarm of run 'r')"]
    # One cause: the settings, not the component they show up in as well.
    assert store.explain_miss(missed("s1", run), manifest, MissContext(run="r")) == other_types
    # Said by where the difference comes from: the config since the prewarm (its variable
    # differs between the fingerprints), or the two processes under one config.
    changed = store.explain_miss(missed("s1", run), manifest, MissContext(
        run="r", changed={"JAX_DEFAULT_PRNG_IMPL", "LIBTPU_INIT_ARGS"}))
    assert changed == ["jax_default_prng_impl differs: prewarm threefry2x32, run unsafe_rbg; "
                       "changed since the prewarm of run 'r' (config `jax:`) (+1 more)"]
    adapter = store.explain_miss(missed("s1", run), manifest,
                                 MissContext(run="r", changed={"XLA_FLAGS"}))
    assert adapter == ["jax_default_prng_impl differs: prewarm threefry2x32, run unsafe_rbg "
                       "(+1 more); under one config: the step factory must apply the "
                       "trainer's JAX settings"]
    assert all(len(line) <= CAUSE_WIDTH for line in [*other_types, *changed, *adapter])
    # Without recorded settings (an older manifest), the old answer.
    assert "another function of that name" in store.explain_miss(
        missed("s2", {}), manifest)[0]


def test_a_miss_is_explained_by_this_runs_difference_not_another_runs_settings(
        tmp_path: Path) -> None:
    """Another run prewarmed the step later, under its own LIBTPU_INIT_ARGS; this run's
    prewarm (an entry it found WARM and uses: `runs`) differs from this job in the
    computation alone. The why names the computation, not the other run's settings."""
    from jaxwarm.core.records import FunctionRecord
    from jaxwarm.jaxkey.components import likely_causes
    from jaxwarm.store.manifest import ManifestEntry
    from jaxwarm.store.misses import MissContext
    from jaxwarm.store.store import LocalStore

    settings = {"jax_default_prng_impl": "threefry2x32", "LIBTPU_INIT_ARGS": ""}

    def entry(digit: str, run: str, created: float, **extra: object) -> ManifestEntry:
        return ManifestEntry(function="jit_step", key=f"jit_step-{digit * 64}", run=run,
                             config="c", compile_s=1.0, lower_s=0.1, written=True,
                             jax_version="0.10.2", process_count=1, created=created,
                             signature="s1", **extra)  # type: ignore[arg-type]

    ours = entry("a", "first", 1.0, runs=["mine"], global_options=settings,
                 components={"computation": "1", "flags": "f"})
    theirs = entry("b", "other", 2.0, global_options={**settings, "LIBTPU_INIT_ARGS": "--x=1"},
                   components={"computation": "1", "flags": "g"})
    manifest = {e.key: e for e in (ours, theirs)}
    missed = FunctionRecord("jit_step", None, False, components={"computation": "2",
                                                                  "flags": "f"},
                            signature="s1", global_options=settings)
    for run in ("mine", "a run that never prewarmed"):  # its own; else the closest
        why = LocalStore(tmp_path).explain_miss(missed, manifest, MissContext(run=run))
        assert "LIBTPU_INIT_ARGS" not in " ".join(why), why
        assert why == [f"computation differs from the prewarm of run 'first': "
                       f"{likely_causes('computation')}"], why


@pytest.mark.e2e
def test_a_jax_setting_changed_in_the_config_is_said_as_a_change(tmp_path: Path) -> None:
    """The config's `jax:` section changed after the prewarm (the factory applies it, as the
    trainer gets it): verify, verify --trainer and the launch's report say the setting
    changed since the prewarm, not that the step factory must apply the trainer's settings
    (the adapter is right; the config moved)."""
    from tests.test_cli_trainer import cli_args

    prewarmed = run_cli("prewarm", *cli_args(tmp_path))
    assert prewarmed.returncode == 0, prewarmed.stdout + prewarmed.stderr[-3000:]
    highest = (*cli_args(tmp_path), "jax={jax_default_matmul_precision: highest}",
               "cache.min_compile_time_secs=1000")  # the launch leaves the cache as it was
    said = ("why: jax_default_matmul_precision differs: prewarm None, {job} highest; changed "
            "since the prewarm of run 'cli-trainer' (config `jax:`)")
    for how in ((), ("--trainer",)):
        verified = run_cli("verify", *how, *highest)
        assert verified.returncode == 1, verified.stdout + verified.stderr[-3000:]
        assert said.format(job="verify") in verified.stdout, verified.stdout
        assert "must apply" not in verified.stdout
    launched = run_cli("launch", "--no-prewarm", *highest)
    assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
    headline = launched.stdout.split("\njob ")[0]
    assert "jit_train_step: MISS on process 0" in headline, launched.stdout
    assert said.format(job="run") in headline and "must apply" not in launched.stdout

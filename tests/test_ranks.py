"""What the ranks decide from what they told each other (jaxwarm/job/ranks.py), without
a job: the meeting bound from the manifest, the one line of a meeting that timed out, of an
environment or a key that differs between ranks, and all-load-or-all-compile."""

from __future__ import annotations

import dataclasses

from jaxwarm.core.config import MAX_DURATION_S, Config, parse_config
from jaxwarm.core.records import KeyPost, RankState
from jaxwarm.core.words import ranges
from jaxwarm.job.ranks import (
    TIMEOUT_FLOOR_S,
    agree,
    agreement_on,
    environment_line,
    late_line,
    meet_timeout,
)
from jaxwarm.store.manifest import ManifestEntry

COMPONENTS = {"computation": "c0", "jax_lib version": "j0", "backend version": "b0",
              "XLA flags": "x0", "compile_options": "o0", "accelerator_config": "a0",
              "compression": "z0", "custom_hook": "h0"}


def config(**ranks: object) -> Config:
    return parse_config({"run": {"name": "r"}, "step": {"factory": "m:f"},
                         "topology": {"nodes": 8, "processes_per_node": 8},
                         "mesh": {"axes": {"data": 64}}, "entrypoint": {"command": ["t"]},
                         "ranks": ranks})


def entry(compile_s: float, process_count: int) -> ManifestEntry:
    return ManifestEntry(function="jit_step", key="jit_step-" + "0" * 64, run="r", config="c",
                         compile_s=compile_s, lower_s=1.0, written=True, jax_version="0.10.2",
                         process_count=process_count)


def post(rank_components: dict[str, str] | None = None, size: int | None = 1000,
         key: str = "jit_step-k") -> KeyPost:
    return KeyPost(key, {**COMPONENTS, **(rank_components or {})}, size)


def test_rank_lists_fold_into_ranges() -> None:
    assert ranges([7, 0, 1, 2, 4, 8, 2]) == "0-2, 4, 7-8"
    assert ranges([5]) == "5"
    assert ranges(list(range(1, 64))) == "1-63"
    assert ranges([1, 2, 3, 5], "p") == "p1-p3, p5"


def test_the_meeting_bound_is_sized_from_the_compiles_of_this_layout() -> None:
    entries = [entry(900.0, 64), entry(2000.0, 8), entry(60.0, 64)]
    assert meet_timeout(config(), entries) == 2700.0  # 3 x 900 s, not the 8-process entry
    assert meet_timeout(config(), [entry(5.0, 64)]) == TIMEOUT_FLOOR_S
    assert meet_timeout(config(), []) == TIMEOUT_FLOOR_S
    assert meet_timeout(config(meet_timeout_s=42), entries) == 42.0
    # A compile time a shared cache's manifest claims cannot stretch it past the maximum.
    assert meet_timeout(config(), [entry(1e300, 64)]) == MAX_DURATION_S


def test_agreement_is_on_by_default_on_gpu_only() -> None:
    cpu = config()
    gpu = dataclasses.replace(cpu, topology=dataclasses.replace(cpu.topology, platform="gpu"))
    assert not agreement_on(cpu) and agreement_on(gpu)
    assert agreement_on(config(agree=True)) and not agreement_on(
        dataclasses.replace(gpu, ranks=config(agree=False).ranks))


def test_a_timeout_names_the_late_ranks_and_what_they_were_doing_in_one_line() -> None:
    now = 1000.0
    line = late_line("after jit_train_step", 600, {
        3: RankState("compiling jit_train_step", now - 41.2),
        5: RankState("compiling jit_train_step", now - 44.0),
        9: RankState("running its own code after jit_init_state", now - 7),
        12: None}, now)
    assert "\n" not in line
    assert line == (
        "the ranks did not meet after jit_train_step within 600 s (ranks.meet_timeout_s): "
        "ranks 3, 5 still compiling jit_train_step (started 41-44 s ago); rank 9 still "
        "running its own code after jit_init_state (started 7 s ago); rank 12 published no "
        "state (not started, or stopped before its first lowering)")


def test_an_environment_that_differs_on_one_rank_is_one_line_naming_it() -> None:
    same = {"XLA_FLAGS": "--xla_a", "JAXWARM_CONFIG": "/r/config.yaml"}
    environments = {rank: {**same, "JAXWARM_PROCESS_ID": str(rank)} for rank in range(8)}
    assert environment_line(environments) is None  # the process id differs by design
    environments[3] = {**environments[3], "XLA_FLAGS": "--xla_a --xla_b"}
    environments[5] = {k: v for k, v in environments[5].items() if k != "JAXWARM_CONFIG"}
    line = environment_line(environments)
    assert line is not None and "\n" not in line
    assert line.startswith("the ranks' environments differ: JAXWARM_CONFIG is unset on rank 5, "
                           "but '/r/config.yaml' on ranks 0-4, 6-7 (and 1 more variable)")


def test_a_long_value_is_shown_from_where_it_differs() -> None:
    flags = "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=1"
    environments = {rank: {"XLA_FLAGS": flags} for rank in range(4)}
    environments[3] = {"XLA_FLAGS": f"{flags} --xla_cpu_enable_fast_math=true"}
    line = environment_line(environments)
    assert line is not None and line.startswith(
        "the ranks' environments differ: XLA_FLAGS is '...tform_device_count=1 "
        f"--xla_cpu_enable_fast_math=true' on rank 3, but '{flags}' on ranks 0-2;")


def test_same_keys_and_entries_agree_and_every_rank_uses_the_cache() -> None:
    posts = {rank: post() for rank in range(4)}
    assert agree("jit_step", posts, "gpu").stop is None
    assert agree("jit_step", posts, "gpu").skip_cache is None
    cold = {rank: post(size=None) for rank in range(4)}
    assert agree("jit_step", cold, "gpu") == agree("jit_step", posts, "gpu")


def test_a_key_that_differs_stops_naming_the_component_and_the_ranks() -> None:
    posts = {rank: post() for rank in range(8)}
    posts[6] = post({"XLA flags": "x1"})
    decision = agree("jit_step", posts, "gpu")
    assert decision.stop is not None and "\n" not in decision.stop
    assert decision.stop.startswith(
        "jit_step: the ranks would look it up under different cache keys: XLA flags differs "
        "on rank 6 (against ranks 0-5, 7): XLA_FLAGS")


def test_on_cpu_the_per_process_accelerator_config_is_left_out() -> None:
    posts = {0: post({"accelerator_config": "a0"}), 1: post({"accelerator_config": "a1"})}
    assert agree("jit_step", posts, "cpu").stop is None
    assert agree("jit_step", posts, "gpu").stop is not None


def test_ranks_that_see_the_entry_differently_all_compile_and_leave_it() -> None:
    posts = {0: post(size=1000), 1: post(size=None), 2: post(size=1000), 3: post(size=12)}
    decision = agree("jit_step", posts, "gpu")
    assert decision.stop is None
    assert decision.skip_cache == (
        "jit_step: the ranks do not see the same cache entry (1000 bytes on ranks 0, 2; no "
        "entry on rank 1; 12 bytes on rank 3): every rank compiled it without the persistent "
        "cache (none loaded it while another compiled it); the entry was left in place")

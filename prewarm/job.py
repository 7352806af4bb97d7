"""The prewarm job: `python -m prewarm.job` on the run's own process layout.

It builds the step through the same factory, mesh and environment as the trainer, from
abstract inputs only (no parameters materialized, no data read, no step executed), and
verifies before it compiles: a function whose predicted key is already in the cache is
WARM and left alone, so a warm relaunch costs imports and lowering, not a compile, on every
backend. The others are `lower().compile()`d so that process 0 writes the cache entries.
What it compiled, under which key, how long it took and the entry's checksum go into the
manifest in the cache dir. Process 0 decides what is warm and every process follows it:
on GPU, ranks that compile while others load can wait on each other forever.

JAX writes an entry without a lock or an atomic rename when the cache has no size cap, so
two prewarms of the same step (a job array over similar configs) could interleave their
writes of one file. Process 0 therefore compiles each function under a per-key lock: the
second prewarm waits, then loads what the first wrote. Different steps run in parallel.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import nullcontext
from typing import Any, ContextManager
from dataclasses import dataclass
from pathlib import Path

from launcher.environment import is_remote
from launcher.files import locked
from launcher.store.entries import entry_exists
from launcher.injob.hook import config_from_env
from launcher.rundir import PREWARM
from launcher.store.manifest import ManifestEntry, record_entries
from launcher.injob.recorder import FunctionRecord, InitRecorder
from prewarm.jaxkey.guard import jax_job
from prewarm.jaxkey.predict import KeyNotComputed, UnsupportedJaxVersion, predict_key
from prewarm.specs import warn_risky_inputs
from prewarm.step import start_job

log = logging.getLogger("jaxwarm.prewarm")


@dataclass(frozen=True)
class Target:
    """One function of the bundle, lowered, with the key JAX will look it up under."""

    name: str
    lowered: Any
    lower_s: float
    key: str | None


@dataclass(frozen=True)
class Compiled:
    name: str
    lower_s: float
    record: FunctionRecord


def predicted_key(lowered: object) -> str | None:
    """The adapter's key, to cross-check against JAX's; None where the adapter cannot run."""
    try:
        return predict_key(lowered).key
    except (UnsupportedJaxVersion, KeyNotComputed) as exc:
        log.warning("%s; prewarming without the key cross-check", exc)
        return None


WRITER_LOCKS = "jaxwarm-locks"
# A second prewarm of the same key waits while the first compiles it: as long as a big
# compile takes, and no longer.
COMPILE_LOCK_TIMEOUT_S = 3 * 3600.0


def writer_lock(cache_dir: str, key: str | None, is_writer: bool) -> ContextManager[None]:
    """Held by process 0 while it compiles (and JAX writes) one key; nothing elsewhere."""
    if not is_writer or key is None or is_remote(cache_dir):
        return nullcontext()
    folder = Path(cache_dir) / WRITER_LOCKS
    folder.mkdir(mode=0o700, exist_ok=True)
    return locked(folder / f"{key}.lock", f"compile of {key}", COMPILE_LOCK_TIMEOUT_S)


def lower_targets(targets: list) -> list[Target]:
    lowered = []
    for name, function, args in targets:
        warn_risky_inputs(args, name)
        start = time.perf_counter()
        item = function.lower(*args)
        lowered.append(Target(name, item, time.perf_counter() - start, predicted_key(item)))
    return lowered


def warm_on_process_0(targets: list[Target], cache_dir: str) -> list[bool]:
    """Which functions process 0 finds in the cache under their predicted key, as every
    process's answer. Nothing is warm where the key cannot be predicted (untested jax)."""
    import jax
    import numpy as np

    warm = [target.key is not None and entry_exists(cache_dir, target.key)
            for target in targets]
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        warm = [bool(flag) for flag in multihost_utils.broadcast_one_to_all(
            np.asarray(warm, dtype=np.bool_))]
    for target, is_warm in zip(targets, warm):
        log.info("%s  %s  %s: %s", "WARM" if is_warm else "COLD", target.name, target.key,
                 "already in the cache, not compiling it" if is_warm else "compiling it")
    return warm


def compile_targets(recorder: InitRecorder, targets: list[Target], cache_dir: str,
                    is_writer: bool) -> list[Compiled]:
    """Compile each lowered target; the recorder saw its cache key and outcome."""
    compiled = []
    for target in targets:
        with writer_lock(cache_dir, target.key, is_writer):
            target.lowered.compile()
        record = recorder.report.functions[-1]
        if target.key is not None and record.key is not None and target.key != record.key:
            log.warning("%s: jaxwarm predicted key %s but JAX used %s: `jaxwarm verify` "
                        "cannot be trusted on this setup", target.name, target.key, record.key)
        compiled.append(Compiled(target.name, target.lower_s, record))
    return compiled


def describe(item: Compiled, min_compile_time_s: float) -> str:
    record = item.record
    if record.key is None:
        return f"{record.name}: compiled in {record.seconds:.2f} s, but the cache is off"
    if record.hit:
        return f"{record.name}: already in the cache (loaded in {record.seconds:.2f} s)"
    if record.seconds < min_compile_time_s:
        return (f"{record.name}: compiled in {record.seconds:.2f} s, under "
                f"cache.min_compile_time_secs={min_compile_time_s:g}: JAX does not store it")
    return (f"{record.name}: compiled in {record.seconds:.2f} s (lowering {item.lower_s:.2f} s), "
            f"written as {record.key}")


@jax_job
def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import jax

    config = config_from_env()
    recorder, mesh, bundle = start_job(config, PREWARM)
    log.info("prewarming %s on %d process(es) x %d device(s), mesh %s",
             config.step.factory, jax.process_count(), jax.local_device_count(),
             dict(mesh.shape))
    targets = lower_targets(bundle.compile_targets())
    warm = warm_on_process_0(targets, config.cache.dir)
    cold = [target for target, is_warm in zip(targets, warm) if not is_warm]
    if not cold:
        log.info("every function is WARM: nothing to compile")
    compiled = compile_targets(recorder, cold, config.cache.dir, jax.process_index() == 0)
    for item in compiled:
        log.info("%s", describe(item, config.cache.min_compile_time_secs))
    recorder.mark_first_step()
    if jax.process_index() == 0:
        written = [
            ManifestEntry(function=item.record.name, key=item.record.key, run=config.run.name,
                          config=config.source, compile_s=item.record.seconds,
                          lower_s=item.lower_s,
                          written=item.record.seconds >= config.cache.min_compile_time_secs,
                          jax_version=jax.__version__, process_count=jax.process_count(),
                          components=item.record.components,
                          # Checksummed by the hook after the first step (local cache only).
                          sha256=item.record.sha256, size=item.record.size)
            # A hit's seconds are a load, not a compile: keep the entry that wrote it.
            for item in compiled if item.record.key is not None and not item.record.hit]
        if is_remote(config.cache.dir):
            log.info("no manifest for a remote cache dir (it needs a local file lock)")
        else:
            log.info("manifest: %s", record_entries(config.cache.dir, written))
    return 0


if __name__ == "__main__":
    sys.exit(main())

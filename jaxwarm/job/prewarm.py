"""The prewarm job: `python -m jaxwarm.job.prewarm` on the run's own process layout.

It builds the step through the same factory, mesh and environment as the trainer, from
abstract inputs only (no parameters materialized, no data read, no step executed), and
verifies before it compiles, by the same decision as `jaxwarm verify` (`jaxwarm.job.warm`,
process 0's, broadcast): a function whose predicted key is already in the cache is WARM and
left alone, so a warm relaunch costs imports and lowering, not a compile, on every backend.
The others are `lower().compile()`d so that process 0 writes the cache entries. Unlike
verify, the prewarm repairs what its checks found (`repair`). What it compiled, under which
key, how long it took and the entry's checksum and size go into the manifest in the cache
dir as each entry is written, not at the end: a prewarm killed between two compiles leaves
nothing unrecorded, and a failed write is a failure.

JAX writes an entry without a lock or an atomic rename when the cache has no size cap, so
two prewarms of the same step (a job array over similar configs) could interleave their
writes of one file. Process 0 therefore compiles each function under a per-key lock: the
second prewarm waits, then loads what the first wrote. Different steps run in parallel.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass

from jaxwarm.core.config import Config
from jaxwarm.core.errors import EXIT_FAILED, EXIT_OK
from jaxwarm.core.records import PREWARM, FunctionRecord, InputSignature, PrewarmProgress
from jaxwarm.jaxkey.entryformat import function_of
from jaxwarm.job.progress import compiling, finished, last_compile, progress_file
from jaxwarm.job.record.reads import FactoryReads
from jaxwarm.job.record.recorder import InitRecorder, module_name
from jaxwarm.job.start.gpu import mocked_topology
from jaxwarm.job.start.jobstart import job_main, start_job
from jaxwarm.job.start.pinned import config_from_env
from jaxwarm.job.warm import LoweredTarget, WarmDecision, decide, lower_targets
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import open_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compiled:
    target: LoweredTarget
    record: FunctionRecord
    # Why the entry JAX should have written is not in the cache (a full disk, a read-only
    # dir, a torn write); None when it is there intact, or was not meant to be written.
    failure: str | None = None


def repair(config: Config, store: CacheStore, decisions: list[WarmDecision]) -> None:
    """What process 0 of the prewarm does with its warm checks (verify never does it): the
    store repairs what they found and records the WARM targets' entries, as this prewarm
    would record them, as used by this run (`CacheStore.repair`)."""
    warm = [manifest_entry(config, d.target, function_of(d.target.key), d.target.key, 0.0)
            for d in decisions if d.warm and d.target.key]
    store.repair([d.check for d in decisions if d.check is not None], warm, config.run.name)


def manifest_entry(config: Config, target: LoweredTarget, function: str, key: str,
                   compile_s: float, signature: str | None = None) -> ManifestEntry:
    """What the manifest records of one key, but for its file (sha256, size: whether it
    was written), which the store fills in when it records the entry."""
    import jax

    load = target.prediction.load if target.prediction is not None else None
    return ManifestEntry(function=function, key=key, run=config.run.name, config=config.source,
                         compile_s=compile_s, lower_s=target.lower_s, signature=signature,
                         is_step=target.is_step, written=False,
                         jax_version=jax.__version__, process_count=jax.process_count(),
                         global_options=target.global_options,
                         mock_topology=mocked_topology(),
                         xla_flags=os.environ.get("XLA_FLAGS", ""),
                         compile_options=load.compile_options if load else None,
                         device_ids=list(load.device_ids) if load else [])


def record_compile(config: Config, store: CacheStore, target: LoweredTarget,
                   record: FunctionRecord, since: float,
                   inputs: InputSignature | None = None) -> str | None:
    """Right after process 0 compiled a target, still under its writer lock: the store
    checks the entry JAX wrote and records it in the manifest, with the `inputs` it was
    compiled with (`CacheStore.record_compile`); its checksum goes onto the function's
    record. Returns why it failed (the torn entry quarantined), or None."""
    if record.key is None or record.hit:
        return None
    entry = dataclasses.replace(
        manifest_entry(config, target, record.name, record.key, record.seconds,
                       record.signature),
        components=record.components, inputs=inputs)
    written, failure = store.record_compile(entry, since,
                                            not_stored=record.not_stored is not None)
    record.sha256, record.size = written or (None, None)
    return failure


def compile_targets(recorder: InitRecorder, targets: list[LoweredTarget], config: Config,
                    store: CacheStore, is_writer: bool) -> list[Compiled]:
    """Compile each lowered target; the recorder saw its cache key and outcome. Process 0
    (`is_writer`) compiles under each key's writer lock and records each entry as soon as
    it is written (`record_compile`)."""
    import jax

    compiled = []
    manifest = store.manifest(strict=False)
    record_to = progress_file(config.run_dir, is_writer)
    for index, target in enumerate(targets, 1):
        function = function_of(target.key) if target.key else module_name(target.name)
        last = last_compile(manifest, function, recorder.signature(function),
                            jax.process_count())
        progress = PrewarmProgress(function, index, len(targets), time.time(),
                                   last.compile_s if last else None)
        with compiling(progress, record_to), \
                store.writer_lock(target.key if is_writer else None):
            since = time.time()
            target.lowered.compile(target.compiler_options)
            record = recorder.report.functions[-1]
            failure = record_compile(config, store, target, record, since,
                                     recorder.inputs(record.name)) if is_writer else None
        if target.key is not None and record.key is not None and target.key != record.key:
            log.warning("%s: jaxwarm predicted key %s but JAX used %s: `jaxwarm verify` "
                        "cannot be trusted on this setup", target.name, target.key, record.key)
        compiled.append(Compiled(target, record, failure))
    finished(record_to, len(targets))
    return compiled


def evictions(config: Config, store: CacheStore, compiled: list[Compiled]) -> list[Compiled]:
    """With `cache.max_size`, JAX evicts least recently used entries while writing the next
    one: an entry this prewarm wrote (process 0 checksummed it) that is gone by the end was
    evicted by the cap, and the run would miss it; that is a failure, said as such."""
    if config.cache.max_size == -1:
        return compiled
    need = sum(item.record.size or 0 for item in compiled)
    return [dataclasses.replace(item, failure=(
                f"JAX evicted it to keep the cache within cache.max_size="
                f"{config.cache.max_size} bytes; this prewarm's entries need {need} bytes: "
                f"raise cache.max_size"))
            if item.failure is None and item.record.sha256 is not None
            and item.record.key is not None
            and not store.has_entry(item.record.key) else item
            for item in compiled]


def describe(item: Compiled) -> str:
    record = item.record
    if item.failure is not None:
        return f"FAILED {record.name}: compiled, but its entry {record.key}: {item.failure}"
    if record.key is None:
        return (f"{record.name}: compiled in {record.seconds:.2f} s without the persistent "
                f"cache (it is off, or the ranks did not all see the same entry: "
                f"ranks.agree)")
    if record.hit:
        return f"{record.name}: already in the cache (loaded in {record.seconds:.2f} s)"
    if record.not_stored is not None:
        return (f"{record.name}: compiled in {record.seconds:.2f} s; JAX did not store it: "
                f"{record.not_stored}")
    return (f"{record.name}: compiled in {record.seconds:.2f} s "
            f"(lowering {item.target.lower_s:.2f} s), "
            f"written as {record.key}")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import jax

    config = config_from_env()
    reads = FactoryReads([config.cache.dir, config.run_dir])
    recorder, mesh, bundle = start_job(config, PREWARM, reads)
    mocked = mocked_topology()
    log.info("prewarming %s on %d process(es) x %d device(s)%s, mesh %s",
             config.step.factory, jax.process_count(), jax.local_device_count(),
             f" (mocked {mocked} on this one process)" if mocked else "", dict(mesh.shape))
    targets = lower_targets(bundle.compile_targets(), config.source, strict=False)
    decisions = decide(targets, config, recorder, job="this prewarm",
                       repair=lambda store, found: repair(config, store, found))
    cold = [decision.target for decision in decisions if not decision.warm]
    recorder.report.judged_warm = len(decisions) - len(cold)  # its row counts them
    log.info("%s", f"compiling {', '.join(t.name for t in cold)}" if cold else
             "every function is WARM: nothing to compile")
    store = open_store(config.cache.dir)
    compiled = evictions(config, store, compile_targets(recorder, cold, config, store,
                                                        jax.process_index() == 0))
    for item in compiled:
        log.info("%s", describe(item))
    recorder.mark_first_step()
    failed = any(item.failure for item in compiled)
    if jax.process_index() == 0:
        log.info("%s", store.records_where())
        if not failed:  # the launch's fingerprint, the files the factory read, the entries
            store.record_fingerprint(config.run_dir, config.run.name,
                                     [t.key for t in targets if t.key], reads.files)
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(job_main(main))

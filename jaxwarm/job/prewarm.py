"""The prewarm job: `python -m jaxwarm.job.prewarm` on the run's own process layout.

It builds the step through the same factory, mesh and environment as the trainer, from
abstract inputs only (no parameters materialized, no data read, no step executed), and
verifies before it compiles, by the same decision as `jaxwarm verify` (`jaxwarm.job.judge`,
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
from contextlib import nullcontext
from dataclasses import dataclass

from jaxwarm.core.config import Config
from jaxwarm.core.errors import EXIT_FAILED, EXIT_OK
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import (
    PREWARM,
    FunctionRecord,
    InputSignature,
    PrewarmDecision,
    PrewarmProgress,
    PrewarmRecord,
)
from jaxwarm.core.rundir import prewarm_decision_path
from jaxwarm.core.words import plural
from jaxwarm.jaxkey.entryformat import function_of
from jaxwarm.job.judge import decide, lower_targets
from jaxwarm.job.progress import compiling, finished, last_compile, progress_file
from jaxwarm.job.record.reads import FactoryReads
from jaxwarm.job.record.recorder import InitRecorder, module_name
from jaxwarm.job.start.gpu import mocked_topology
from jaxwarm.job.start.jobstart import job_main, start_job
from jaxwarm.job.start.pinned import config_from_env
from jaxwarm.job.warm import LoweredTarget, WarmDecision
from jaxwarm.store.integrity import BEING_WRITTEN, IntegrityCheck
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import CacheStore, LocalStore, open_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compiled:
    target: LoweredTarget
    record: FunctionRecord
    # Why the entry JAX should have written is not in the cache (a full disk, a read-only
    # dir, a torn write); None when it is there intact, or was not meant to be written.
    failure: str | None = None


def repair(config: Config, store: LocalStore, decisions: list[WarmDecision]) -> None:
    """What process 0 of the prewarm does with its warm checks (verify never does it): a torn
    or corrupt entry is quarantined (JAX never replaces one), and so is one a job missed that
    the full check now finds corrupt; one being written by another prewarm is left alone (its
    compile waits for that writer's lock, then loads it). An entry read in full and found
    intact has its check recorded (the next check is the quick one); one no manifest records
    (its prewarm was killed before recording it) is pinned now, and one another run recorded
    is recorded as used by this run too (and, where that record predates `cache.prefetch`,
    with what loading it takes)."""
    checks = [d.check for d in decisions if d.check is not None]
    for check in checks:
        if check.problem not in (None, "missing", BEING_WRITTEN):
            store.quarantine(IntegrityCheck(check.key, 0, check.problem, checksum_known=False))
        store.record_check(check)
    manifest = store.manifest(strict=False)
    warm = [(d.target, d.target.key) for d in decisions if d.warm and d.target.key]
    found = [manifest_entry(config, target, function_of(key), key, 0.0,
                            store.written_since(key, 0.0))
             for target, key in warm if key not in manifest]
    if found:
        store.record_entries(found)
    known = {key: with_load(manifest[key], target) for target, key in warm if key in manifest}
    refreshed = [entry for key, entry in known.items() if entry is not manifest[key]]
    if refreshed:
        store.record_entries(refreshed)
    store.uses_entries(list(known.values()), config.run.name)


def with_load(entry: ManifestEntry, target: LoweredTarget) -> ManifestEntry:
    """A recorded entry with what loading it takes (`cache.prefetch`), from this prewarm's
    probe of the same key, where an older prewarm did not record it; else the entry as is."""
    load = target.prediction.load if target.prediction is not None else None
    if entry.compile_options is not None or load is None:
        return entry
    return dataclasses.replace(entry, compile_options=load.compile_options,
                               device_ids=list(load.device_ids))


def manifest_entry(config: Config, target: LoweredTarget, function: str, key: str, compile_s: float,
                   written: tuple[str, int] | None,
                   signature: str | None = None) -> ManifestEntry:
    """What the manifest records of one key: `written` is the entry's (sha256, size)."""
    import jax

    load = target.prediction.load if target.prediction is not None else None
    return ManifestEntry(function=function, key=key, run=config.run.name, config=config.source,
                         compile_s=compile_s, lower_s=target.lower_s, signature=signature,
                         is_step=target.is_step, written=written is not None,
                         jax_version=jax.__version__, process_count=jax.process_count(),
                         sha256=written[0] if written else None,
                         size=written[1] if written else None,
                         global_options=target.global_options,
                         mock_topology=mocked_topology(),
                         xla_flags=os.environ.get("XLA_FLAGS", ""),
                         compile_options=load.compile_options if load else None,
                         device_ids=list(load.device_ids) if load else [])


def record_compile(config: Config, store: LocalStore, target: LoweredTarget, record: FunctionRecord,
                   since: float, inputs: InputSignature | None = None) -> str | None:
    """Right after process 0 compiled a target, still under its writer lock: check the entry
    JAX wrote and record it in the manifest, with the `inputs` it was compiled with, so no
    prune or crash finds it unrecorded. Returns why it failed (the torn entry
    quarantined), or None."""
    if record.key is None or record.hit:
        return None
    written = store.written_since(record.key, since)
    failure: str | None
    if written is None:
        if record.not_stored is not None:
            return None
        failure = "JAX did not write it (a full disk or a read-only cache dir?)"
    else:
        failure = store.entry_problem(record.key)
        if failure is not None:
            store.quarantine(IntegrityCheck(record.key, written[1], failure, True))
            written = None
    record.sha256, record.size = written or (None, None)
    entry = dataclasses.replace(
        manifest_entry(config, target, record.name, record.key, record.seconds, written,
                       record.signature),
        components=record.components, inputs=inputs)
    try:
        store.record_entries([entry])
    except OSError as exc:
        return failure or f"the manifest could not be written ({exc.strerror})"
    return failure


def compile_targets(recorder: InitRecorder, targets: list[LoweredTarget], config: Config,
                    store: CacheStore, is_writer: bool) -> list[Compiled]:
    """Compile each lowered target; the recorder saw its cache key and outcome. Process 0
    of a local store compiles under each key's writer lock and records each entry as soon
    as it is written (`record_compile`)."""
    import jax

    compiled = []
    writer = store.local if is_writer else None
    manifest = store.manifest(strict=False)
    record_to = progress_file(config.run_dir, is_writer)
    for index, target in enumerate(targets, 1):
        function = function_of(target.key) if target.key else module_name(target.name)
        last = last_compile(manifest, function, recorder.signature(function),
                            jax.process_count())
        progress = PrewarmProgress(function, index, len(targets), time.time(),
                                   last.compile_s if last else None)
        with compiling(progress, record_to), \
                writer.writer_lock(target.key) if writer else nullcontext():
            since = time.time()
            target.lowered.compile(target.compiler_options)
            record = recorder.report.functions[-1]
            failure = record_compile(config, writer, target, record, since,
                                     recorder.inputs(record.name)) if writer else None
        if target.key is not None and record.key is not None and target.key != record.key:
            log.warning("%s: jaxwarm predicted key %s but JAX used %s: `jaxwarm verify` "
                        "cannot be trusted on this setup", target.name, target.key, record.key)
        compiled.append(Compiled(target, record, failure))
    finished(record_to, len(targets))
    return compiled


def evictions(config: Config, compiled: list[Compiled]) -> list[Compiled]:
    """With `cache.max_size`, JAX evicts least recently used entries while writing the next
    one: an entry this prewarm wrote (process 0 checksummed it) that is gone by the end was
    evicted by the cap, and the run would miss it; that is a failure, said as such."""
    local = open_store(config.cache.dir).local
    if config.cache.max_size == -1 or local is None:
        return compiled
    need = sum(item.record.size or 0 for item in compiled)
    return [dataclasses.replace(item, failure=(
                f"JAX evicted it to keep the cache within cache.max_size="
                f"{config.cache.max_size} bytes; this prewarm's entries need {need} bytes: "
                f"raise cache.max_size"))
            if item.failure is None and item.record.sha256 is not None
            and item.record.key is not None
            and not local.has_entry(item.record.key) else item
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
                       repair=lambda local, found: repair(config, local, found))
    cold = [decision.target for decision in decisions if not decision.warm]
    log.info("%s", f"compiling {', '.join(t.name for t in cold)}" if cold else
             "every function is WARM: nothing to compile")
    store = open_store(config.cache.dir)
    compiled = evictions(config, compile_targets(recorder, cold, config, store,
                                                 jax.process_index() == 0))
    for item in compiled:
        log.info("%s", describe(item))
    recorder.mark_first_step()
    failed = any(item.failure for item in compiled)
    if store.local is None:
        log.info("no manifest for a remote cache dir (it needs a local file lock)")
    elif jax.process_index() == 0:
        log.info("manifest: %s", store.local.manifest_path())
        if not failed:
            record_fingerprint(config, store.local, targets, reads.files)
    return EXIT_FAILED if failed else EXIT_OK


def record_fingerprint(config: Config, store: LocalStore, targets: list[LoweredTarget],
                       reads: dict[str, str]) -> None:
    """Record that this prewarm completed under the fingerprint its launch computed (in the
    run dir's decision), with the files its step factory read (`reads`, their hashes) and
    the entries it leaves: a later launch with the same fingerprint and those files
    unchanged can go without a prewarm job. Not when this job runs another jax than the
    launcher saw (its fingerprint would promise keys this job did not make)."""
    import jax
    import jaxlib

    path = prewarm_decision_path(config.run_dir)
    decision = read_record(PrewarmDecision, path)
    if decision is None or decision.fingerprint is None:
        return  # a job script submitted by hand: no launch computed a fingerprint
    found = decision.fingerprint
    here = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    if any(found.parts.get(name) != value for name, value in here.items()):
        log.warning("this job runs jax %s / jaxlib %s but the launcher saw %s / %s: no "
                    "fingerprint recorded, so every launch runs its prewarm job",
                    here["jax"], here["jaxlib"], found.parts.get("jax"),
                    found.parts.get("jaxlib"))
        return
    keys = [t.key for t in targets if t.key and store.has_entry(t.key)]
    store.record_prewarm(PrewarmRecord(dataclasses.replace(found, reads=reads), keys,
                                       config.run.name))
    log.info("fingerprint %s recorded with %d %s: a launch with the same fingerprint "
             "goes without a prewarm job", found.digest, len(keys),
             plural(len(keys), "entry", "entries"))


if __name__ == "__main__":
    sys.exit(job_main(main))

"""The in-job hook: `enable_cache()` after `jax.distributed.initialize()`, before the first compile.

Any trainer can call it. Under the launcher the environment already carries the settings
(JAX reads them at import); the hook re-applies them from the config so that a trainer
started by hand gets the same cache, refuses a process whose environment points elsewhere
(JAX silently ignores a second cache dir), creates the dir from process 0, and starts the
init-report recorder. A trainer that does not call it gets the same recorder from the
launcher (`install_recorder`, run by `jaxwarm.launcher.injob.boot` when the trainer imports jax,
whatever the launch form).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from jaxwarm.launcher.config import Config, ConfigError, load_config
from jaxwarm.launcher.environment import jax_options, owned, resolve_paths
from jaxwarm.launcher.files import GROUP_UMASK, append_line
from jaxwarm.launcher.injob.gpu import mocked_topology
from jaxwarm.launcher.injob.guard import STEP_FACTORY, TRAINER, CacheGuard
from jaxwarm.launcher.injob.ledger import Ledger
from jaxwarm.launcher.injob.phases import after_join
from jaxwarm.launcher.injob.place import Place
from jaxwarm.launcher.injob.prefetch import start_prefetch
from jaxwarm.launcher.injob.ranks import RankCoordinator, agreement_on, meet_timeout
from jaxwarm.launcher.injob.recorder import InitRecorder, InitReport, Prewarmed
from jaxwarm.launcher.injob.stage import node_cache_dir
from jaxwarm.launcher.jaxkey.entryformat import function_of
from jaxwarm.launcher.jaxkey.lookup import watch_lookups
from jaxwarm.launcher.jaxkey.versions import UnsupportedJaxVersion
from jaxwarm.launcher.mlperf import MlperfLog, MlperfUnavailable
from jaxwarm.launcher.records import (
    EntryMissed,
    FirstStep,
    PrewarmDecision,
    Staging,
    compiled_a_step,
    dumps,
    prewarmed_outcomes,
    read_record,
)
from jaxwarm.launcher.rundir import (
    TRAIN,
    first_steps_path,
    mlperf_log_path,
    prewarm_decision_path,
    report_path,
)
from jaxwarm.launcher.store.manifest import ManifestEntry, latest_for_run
from jaxwarm.launcher.store.security import DirIdentity
from jaxwarm.launcher.store.store import LocalStore, open_store
from jaxwarm.launcher.store.usage import job_usage
from jaxwarm.launcher.words import plural

log = logging.getLogger("jaxwarm.hook")


def config_from_env(config: Config | str | Path | None = None) -> Config:
    """The job's config: the given one, or the pinned copy the launcher named in JAXWARM_CONFIG.

    The pinned copy is used as pinned: its paths were resolved once, at launch, and every
    job, rank and restart must see those very strings (on a node where part of the path is
    a symlink, e.g. autofs, resolving again gives another string, hence another cache dir).
    Only a YAML file passed by hand, which no launch resolved, is resolved here."""
    if isinstance(config, Config):
        return config
    if config is not None:
        return resolve_paths(load_config(config))
    pinned = os.environ.get("JAXWARM_CONFIG")
    if not pinned:
        raise ConfigError("no config: pass one to enable_cache() or start the job through "
                          "jaxwarm (which sets JAXWARM_CONFIG)")
    return load_config(pinned)


def note_missed_entries(config: Config, store: LocalStore, jax_dir: LocalStore,
                        report: InitReport, since: float) -> None:
    """A miss on a key whose entry was in the cache JAX read (`jax_dir`: the shared `store`,
    or the node's staged copy of it) before this process started means JAX could not load that
    entry (JAX never replaces it): read it in full to say why (the report shows it), and
    record it in the usage log, so the next prewarm checks the entry in full and replaces it
    if it is corrupt. A process that read another dir (a trainer's own, under cache.enforce
    off) was never offered the entries of `jax_dir`: its misses say where it looked instead."""
    if report.cache_dir != jax_dir.dir:
        return
    for record in report.functions:
        if record.key is None or record.hit or record.sha256 is not None:
            continue
        path = jax_dir.entry_path(record.key)
        if path.exists() and jax_dir.written_since(record.key, since) is None:
            known = store.recorded(strict=False, key=record.key)
            expected = known[record.key].sha256 if record.key in known else None
            record.not_loaded = jax_dir.entry_problem(record.key, expected) or \
                "it reads intact now (was it replaced while this job ran?)"
            log.warning("%s: missed although its entry %s was in the cache (JAX could not load "
                        "it: %s); the next prewarm checks it in full", record.name, path,
                        record.not_loaded)
            store.append_usage(EntryMissed(record.key, config.run.name))


def note_written_entries(store: LocalStore, report: InitReport, since: float) -> None:
    """Checksum each entry this process wrote, once, onto its record (the usage log and
    the prewarm manifest both take it from there)."""
    for record in report.functions:
        if record.key is not None and not record.hit and record.sha256 is None:
            written = store.written_since(record.key, since)
            if written:
                record.sha256, record.size = written


def publish_written(config: Config, store: LocalStore, staging: Staging,
                    report: InitReport | None, since: float) -> None:
    """Publish the entries this process wrote into its node's stage dir to the shared dir
    (`LocalStore.publish_from`), and put each published entry's checksum onto its record for the
    usage log. Only what was published is recorded: an entry another writer put in the
    shared dir first stays that writer's, and the job's own copy stays node-local."""
    published = store.publish_from(staging.dir, since, config.cache.max_size)
    for record in report.functions if report is not None else []:
        if record.key in published and not record.hit and record.sha256 is None:
            record.sha256, record.size = published[record.key]
    if published:
        log.info("published %d %s written in %s to %s", len(published),
                 plural(len(published), "entry", "entries"), staging.dir, config.cache.dir)


_active: InitRecorder | None = None


def install_recorder(config: Config | str | Path | None = None, *, job: str = TRAIN,
                     recompile_warn_s: float = 1.0) -> InitRecorder:
    """Apply the config's cache settings and start the init report, touching no device.

    This is what runs before a wrapped trainer's own code (`jaxwarm.launcher.injob.boot`): the
    trainer may still call `jax.distributed.initialize()` itself, so the process's index
    is learnt at its first lowering (`InitRecorder.bind`). One recorder per process: a
    later `enable_cache()` (a trainer that calls it, under the wrapper) gets this one.
    """
    global _active
    if _active is not None:
        return _active
    import jax

    config = config_from_env(config)
    if config.cache.trusted_group is not None:
        # What JAX creates in the shared cache (entries, atime files, its .lockfile) must be
        # readable and writable by every member of the group, like jaxwarm's own files.
        os.umask(GROUP_UMASK)
    options = jax_options(config)
    staging = None
    if job == TRAIN and config.cache.stage is not None:
        staging = node_cache_dir(config, Place.here())
        options["jax_compilation_cache_dir"] = staging.dir
    for name, value in options.items():
        current = getattr(jax.config, name)
        # The job environment names the shared dir; a staged job reads its node's copy.
        if name == "jax_compilation_cache_dir" and current and \
                current not in (value, config.cache.dir):
            raise ConfigError(
                f"this process already uses compilation cache dir {current!r} but the config "
                f"says {value!r}; JAX ignores a second cache dir, so the run would not hit. "
                f"Start the job through jaxwarm or unset JAX_COMPILATION_CACHE_DIR")
        if current != value:
            jax.config.update(name, value)

    restart = Place.here().restart
    report = InitReport(
        job=job, restart_count=restart, process_index=-1, process_count=0,
        cache_dir=options["jax_compilation_cache_dir"], init_budget_s=config.init_budget_s,
        environment={k: v for k, v in sorted(os.environ.items()) if owned(k)}, stage=staging)
    recorder = InitRecorder(
        report, lambda process: report_path(config.run_dir, job, restart, process),
        recompile_warn_s, CacheGuard.from_options(options, config.cache.enforce,
                                                  actor_of(job))).install()
    # A mocked prewarm is one process compiling for several: no other rank to meet.
    ranks = None if mocked_topology() else RankCoordinator(recorder, agreement_on(config))
    if ranks is not None:
        watch_lookups(ranks.before_lookup, ranks.after_compile)
    recorder.on_bind.append(lambda bound: on_bind(config, bound, staging, ranks))
    if job == TRAIN:
        start_ledger(recorder)
    store = open_store(config.cache.dir).local
    if job == TRAIN and config.cache.prefetch is not False and store is not None:
        jax_dir = LocalStore(options["jax_compilation_cache_dir"])
        begin = once(lambda: begin_prefetch(config, store, jax_dir, recorder))
        after_join.append(begin)
        recorder.on_bind.append(lambda _: begin())  # after on_bind's cache dir checks
    atexit.register(recorder.close)
    _active = recorder
    return recorder


def start_ledger(recorder: InitRecorder) -> None:
    """The init ledger (`jaxwarm.launcher.injob.ledger`): the phase "other" of a training job
    by what its main thread was doing; its cost goes into the report once init is over."""
    ledger = recorder.clock.ledger = Ledger().start()

    def stopped(report: InitReport) -> None:
        ledger.stop()
        report.sampling = ledger.sampling()
    recorder.after_first_step.append(stopped)


def once(callback: Callable[[], None]) -> Callable[[], None]:
    """`callback`, run at the first call only."""
    done: list[bool] = []

    def run() -> None:
        if not done:
            done.append(True)
            callback()
    return run


def begin_prefetch(config: Config, store: LocalStore, jax_dir: LocalStore,
                   recorder: InitRecorder) -> None:
    """`cache.prefetch`, as soon as the process has its backend (after jax.distributed's
    join, or at the first lowering): load this run's prewarmed executables for this layout
    on background threads (`jaxwarm.launcher.injob.prefetch`). On CPU only process 0 does: the
    other processes' keys are their own. Its report goes into the init report, and what
    was never asked for is released once init is over. Nothing is read from a cache dir
    that fails the checks every job makes before JAX loads code from it (the job's own
    check, at its first lowering, says why in one line)."""
    import jax

    if jax.devices()[0].platform == "cpu" and jax.process_index() != 0:
        return
    try:
        store.check(config.cache, config.source)
        if jax_dir.dir != store.dir:
            jax_dir.check(config.cache, config.source, key="cache.stage")
    except ConfigError as exc:
        log.warning("jaxwarm: no prefetch: %s", exc)
        return
    entries = [e for e in latest_for_run(manifest_of(store), config.run.name)
               if e.process_count == jax.process_count()]
    try:
        prefetch = start_prefetch(entries, jax_dir, config.cache.prefetch_max_size,
                                  time.time() - recorder.start_time,
                                  capped=config.cache.max_size != -1)
    except UnsupportedJaxVersion as exc:  # JAX loads at the trainer's call, as without it
        log.warning("jaxwarm: no prefetch: %s", exc)
        return
    if prefetch is not None:
        recorder.report.prefetch = prefetch.report
        recorder.after_first_step.insert(0, lambda _: prefetch.finish())


def manifest_of(store: LocalStore) -> dict[str, ManifestEntry]:
    """The prewarm manifest, read once per job; one that cannot be read counts as empty (and
    says so): bookkeeping never stops training."""
    try:
        return store.manifest(strict=False)
    except OSError as exc:
        log.warning("the prewarm manifest cannot be read: %s", exc)
        return {}


def watch_prewarmed(config: Config, recorder: InitRecorder,
                    manifest: dict[str, ManifestEntry]) -> None:
    """What a training job takes from the prewarm manifest. For a trainer that does not call
    mark_first_step(): the steps any run's prewarm compiled on this layout (same name and
    signature: a run warm from another run's entries, or a cold run of a step prewarmed
    before, is timed by the same function as this run's own prewarm), and, with none, a
    guess (`Found.LARGEST_INPUTS`). And this run's prewarmed functions: a lookup of one is
    marked prewarmed (a step's, with other inputs, still ends the first step), and a miss
    of one is compared with the inputs and the global JAX settings the prewarm lowered it
    with (`InitRecorder._compare_with_prewarm`)."""
    recorder.guess_first_step = True
    recorder.step_functions = {
        (e.function, e.signature): e.run for e in manifest.values()
        if e.is_step and e.process_count == recorder.report.process_count}
    own = latest_for_run(manifest, config.run.name)
    recorder.prewarmed_options = {e.function: e.global_options for e in own
                                  if e.global_options}
    recorder.prewarmed = {e.function: Prewarmed(e.signature, e.inputs, e.is_step, e.run)
                          for e in own}
    recorder.inputs_of = {e.function for e in own if e.inputs is not None}
    recorder.report.run_prewarmed = len(recorder.prewarmed)


def record_first_step(config: Config, report: InitReport, started: float) -> None:
    """Process 0's first step, in the run dir's history (`rundir.first_steps_path`)."""
    path = first_steps_path(config.run_dir)
    hit, missed = prewarmed_outcomes(report.functions)
    append_line(path, dumps(FirstStep(
        restart=report.restart_count, started=started,
        seconds=report.time_to_first_step_s or 0.0, first_step_from=report.first_step_from or "",
        hits=report.hits, lookups=report.lookups, prewarmed_hit=hit,
        prewarmed_missed=missed, run_prewarmed=report.run_prewarmed,
        compiled_a_step=compiled_a_step(report.functions))) + "\n", 0o644,
        "the time to first step")


def on_bind(config: Config, recorder: InitRecorder, staging: Staging | None,
            ranks: RankCoordinator | None) -> None:
    """What needs the process index: the cache dir checks (every rank loads native code from
    it, process 0 creates it), the prewarmed steps to time, the ranks' meeting bound (from
    the compile times the manifest recorded), process 0's bookkeeping (and, on a staged
    node, publishing what it wrote)."""
    import jax

    report = recorder.report
    store = open_store(config.cache.dir).local
    jax_dir = LocalStore(staging.dir) if staging is not None else store
    entries: list[ManifestEntry] = []
    if store is not None and jax_dir is not None:
        if report.process_index == 0:
            checked = store.prepare(config.cache, config.source)
        else:
            checked = store.check(config.cache, config.source)
        if jax_dir.dir != store.dir:
            checked = jax_dir.check(config.cache, config.source, key="cache.stage")
        actor = actor_of(report.job)
        recorder.before_lookup.append(
            lambda: recheck_before_lookup(config, jax_dir.dir, checked, actor))
        if report.job == TRAIN or report.process_count > 1:
            manifest = manifest_of(store)
            entries = latest_for_run(manifest, config.run.name)
            if report.job == TRAIN:
                watch_prewarmed(config, recorder, manifest)
                if report.process_index == 0:
                    recorder.after_first_step.append(
                        lambda done: forget_missed_prewarms(config, store, done))
    elif report.job == TRAIN:
        recorder.guess_first_step = True
    if report.process_index == 0 and report.job == TRAIN:
        recorder.on_first_step.append(
            lambda done: record_first_step(config, done, recorder.start_time))
    if ranks is not None:
        ranks.bind(meet_timeout(config, entries))
    if report.process_index == 0 and report.job == TRAIN and config.report.mlperf:
        start_mlperf_log(config, recorder)
    if report.process_index == 0 and store is not None and jax_dir is not None:
        since = recorder.start_time
        if staging is not None and jax_dir.dir != store.dir:
            recorder.after_first_step.append(
                lambda done: publish_written(config, store, staging, done, since))
            # What it compiles after the first step too, as the process ends.
            atexit.register(publish_at_exit, config, store, staging, since)
        else:
            recorder.after_first_step.append(
                lambda done: note_written_entries(store, done, since))
        recorder.after_first_step += [
            lambda done: note_missed_entries(config, store, jax_dir, done, since),
            lambda done: store.append_usage(job_usage(config, done))]
    log.info("persistent compilation cache at %s (process %d of %d, restart %d)",
             jax.config.jax_compilation_cache_dir, report.process_index,
             report.process_count, report.restart_count)


def forget_missed_prewarms(config: Config, store: LocalStore, report: InitReport) -> None:
    """Process 0 of a job launched under a recorded prewarm's fingerprint looked one of
    that prewarm's functions up under another key: what the login node's fingerprint
    promised does not hold (a GPU driver, a module imported by a computed name). Forget
    that record, so the next launch with this fingerprint runs its prewarm job again. (A
    launch under another fingerprint that misses is no news: its decision said so.)"""
    path = prewarm_decision_path(config.run_dir)
    decision = read_record(PrewarmDecision, path)
    if decision is None or decision.fingerprint is None:
        return
    digest = decision.fingerprint.digest
    record = store.prewarms().get(digest)
    if record is None:
        return
    promised = {function_of(key): key for key in record.keys}
    for function in report.functions:
        key = promised.get(function.name)
        if key is not None and not function.hit and function.key not in (None, key):
            store.forget_prewarm(digest, key,
                           f"{function.name} missed under key {function.key}, not the "
                           f"prewarmed {key}")
            return


def start_mlperf_log(config: Config, recorder: InitRecorder) -> None:
    """MLPerf's init lines from process 0: `init_start` now (dated at the process's start),
    `init_stop` and `run_start` at the first step (dated where its first execution began:
    the step's compile or load ended, and the ranks' meeting after it too). Without the
    package it says so once; training goes on."""
    try:
        lines = MlperfLog(mlperf_log_path(config.run_dir, recorder.report.restart_count),
                          recorder.start_time)
    except (MlperfUnavailable, OSError) as exc:
        log.warning("jaxwarm: no MLPerf lines: %s", exc)
        return
    recorder.after_first_step.append(lambda report: lines.stop(
        recorder.clock.first_step_start or recorder.start_time +
        (report.time_to_first_step_s or 0.0)))


def publish_at_exit(config: Config, store: LocalStore, staging: Staging,
                    since: float) -> None:
    try:
        publish_written(config, store, staging, None, since)
    except OSError as exc:  # bookkeeping must never turn an exit into a failure
        log.warning("jaxwarm: publishing from %s at exit: %s", staging.dir, exc)


def actor_of(job: str) -> str:
    """Whose code besides jaxwarm's runs in a job: the trainer's in the training job, the
    step factory's in the prewarm and verify jobs."""
    return TRAINER if job == TRAIN else STEP_FACTORY


def recheck_before_lookup(config: Config, jax_dir: str, checked: DirIdentity | None,
                          actor: str) -> None:
    """Whatever dir JAX is about to use passes the cache-dir checks again: jaxwarm's (the
    config's, or the node's staged copy) must still be the very dir checked at the start,
    and one the trainer (or a step factory) set instead, with cache.enforce off, gets the
    same checks before JAX reads code from it."""
    import jax

    used = jax.config.jax_compilation_cache_dir
    current = open_store(str(used)).local if used else None
    if current is None:  # no cache, or a remote one: nothing on this node to check
        return
    if current.dir == jax_dir:
        current.recheck(config.cache, config.source, checked,
                        key="cache.dir" if jax_dir == config.cache.dir else "cache.stage")
    else:
        current.check(config.cache, f"{config.source} (set by {actor})")


def enable_cache(config: Config | str | Path | None = None, *, job: str = TRAIN,
                 recompile_warn_s: float = 1.0) -> InitRecorder:
    """Turn the persistent cache on with the config's settings and start the init report.

    Call it after `jax.distributed.initialize()` and before the first compile. Returns the
    recorder: call `mark_first_step()` on it after the first step finished (without that
    call, the end of the first execution of a step a prewarm recorded counts, or with none
    on record the function with the largest inputs: `recorder.Found`). The report is also
    written at exit, with every compile the process made. A function compiled twice under
    different keys is warned about when both compiles took at least `recompile_warn_s`
    (small helpers legitimately compile once per input shape).
    """
    recorder = install_recorder(config, job=job, recompile_warn_s=recompile_warn_s)
    recorder.bind()
    return recorder

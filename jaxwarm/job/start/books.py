"""The books of one job process: what each part of the in-job start adds to the init report
and to the cache's records, and at which moment of the process's init.

The recorder (`jaxwarm.job.record.recorder`) hears JAX; the parts the start sequence
(`jaxwarm.job.start.hook`) sets up around it each add their share, at a few moments the
recorder alone can see: the cache guard its warnings at the end of each lowering, the cache
dir checks theirs before each lookup, the ranks their waits and the meeting's bound, the
init ledger its sampling, the prefetch its report, process 0 the run's first-step history,
its MLPerf lines and the cache's usage log. One `Books` per process, handed to the recorder
once, says what runs at each moment and in which order (`BOUND`, `INIT_OVER`), so the order
is read here, in one place, rather than gathered from lists each part appends to.

Bookkeeping never stops training: at the first step and after it, a step that fails on the
file system says so in the job log and the next one runs.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from jaxwarm.core.config import Config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import append_line
from jaxwarm.core.jsonio import dumps, read_record
from jaxwarm.core.records import (
    PREWARM_FORGOTTEN,
    SETTING_CHANGED,
    TRAIN,
    EntryMissed,
    FirstStep,
    InitReport,
    JobUsage,
    PrewarmDecision,
    ReportWarning,
    Staging,
    UsedFunction,
)
from jaxwarm.core.rundir import first_steps_path, mlperf_log_path, prewarm_decision_path
from jaxwarm.core.warmth import compiled_a_step, prewarmed_outcomes
from jaxwarm.core.words import plural
from jaxwarm.jaxkey.entryformat import function_of
from jaxwarm.jaxkey.versions import UnsupportedJaxVersion
from jaxwarm.job.prefetch import Prefetch, start_prefetch
from jaxwarm.job.ranks import RankCoordinator, meet_timeout
from jaxwarm.job.record.ledger import Ledger
from jaxwarm.job.record.mlperf import MlperfLog, MlperfUnavailable
from jaxwarm.job.record.recorder import InitRecorder, Prewarmed
from jaxwarm.job.start.cacheguard import CacheGuard, actor_of
from jaxwarm.job.warm import fingerprint_keys, launch_fingerprint
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.manifest import Manifest, ManifestEntry
from jaxwarm.store.security import DirIdentity
from jaxwarm.store.store import open_store

log = logging.getLogger(__name__)


@dataclass
class Books:
    """The parts of one process's start and what each adds, moment by moment.

    The start sequence fills the parts it sets up (`guard`, `ranks`, `ledger`, whether a
    `prefetch` is wanted); what needs the process's place is learnt at `bound`."""

    config: Config
    job: str
    # The config's shared cache dir (a remote one, gs://..., keeps no records and has no
    # dir on this node to check: it answers as much, and the books go on the same).
    store: CacheStore
    # The dir JAX reads: that store, or the node's staged copy of it.
    jax_store: CacheStore
    staging: Staging | None
    guard: CacheGuard
    ranks: RankCoordinator | None = None
    ledger: Ledger | None = None
    wants_prefetch: bool = False
    # Learnt at `bound` and after it.
    checked: DirIdentity | None = None
    entries: tuple[ManifestEntry, ...] = ()
    mlperf: MlperfLog | None = None
    prefetch: Prefetch | None = None
    _prefetch_tried: bool = field(default=False, init=False)

    @property
    def staged(self) -> bool:
        """Whether JAX reads the node's staged copy rather than the shared dir."""
        return self.jax_store.dir != self.store.dir

    # -- the moments the recorder calls, in the order a process meets them -----------------

    def lowered(self, recorder: InitRecorder) -> None:
        """The end of each lowering, before anything else of it: a cache setting the trainer
        (or a step factory) changed since is said, and put back under cache.enforce, before
        the lookup that would use it."""
        for line in self.guard.check(looked_up=recorder.report.lookups > 0):
            recorder.add_warning(ReportWarning(SETTING_CHANGED, line), quiet=True)

    def bound(self, recorder: InitRecorder) -> None:
        """The process knows its index and count: `BOUND`, in order."""
        for step in BOUND:
            step(self, recorder)

    def before_lookup(self, recorder: InitRecorder) -> None:
        """Right before JAX computes a key and looks it up: whatever dir JAX is about to
        use passes the cache-dir checks again. jaxwarm's (the config's, or the node's staged
        copy) must still be the very dir checked at `bound`, and one the trainer (or a step
        factory) set instead, with cache.enforce off, gets the same checks before JAX reads
        code from it (a remote one has nothing on this node to check). An exception stops
        that compile."""
        used = _jax_cache_dir()
        if not used:  # no persistent cache: nothing is read
            return
        current = open_store(used)
        config = self.config
        if current.dir == self.jax_store.dir:
            current.recheck(config.cache, config.source, self.checked,
                            key="cache.stage" if self.staged else "cache.dir")
        else:
            current.check(config.cache, f"{config.source} (set by {actor_of(self.job)})")

    def first_step(self, recorder: InitRecorder) -> None:
        """Each time the first step is found (a better-founded finding, or a guess with
        larger inputs, replaces a guess): process 0 of a training job writes it to the run's
        first-step history."""
        if recorder.report.process_index == 0 and self.job == TRAIN:
            _bookkeeping(partial(record_first_step, self.config, recorder.report,
                                 recorder.start_time))

    def init_over(self, recorder: InitRecorder) -> None:
        """Init is over (after the first step, once): `INIT_OVER`, in order."""
        for step in INIT_OVER:
            _bookkeeping(partial(step, self, recorder))

    def joined(self, recorder: InitRecorder) -> None:
        """`jax.distributed` joined: the backend may start now, so can the prefetch."""
        self.prefetch_begun(recorder)

    # -- BOUND: what needs the process's place ----------------------------------------------

    def cache_dir_checked(self, recorder: InitRecorder) -> None:
        """First, because every rank loads native code from the cache dir: process 0
        creates it (or checks it), every other rank checks it, and a staged node's copy is
        checked as well. What was checked is what `before_lookup` holds JAX to."""
        store, jax_store, config = self.store, self.jax_store, self.config
        if recorder.report.process_index == 0:
            self.checked = store.prepare(config.cache, config.source)
        else:
            self.checked = store.check(config.cache, config.source)
        if self.staged:
            self.checked = jax_store.check(config.cache, config.source, key="cache.stage")

    def prewarmed_watched(self, recorder: InitRecorder) -> None:
        """The prewarm manifest, read once the dir is known safe: a training job learns its
        run's prewarmed functions and the steps to time (`watch_prewarmed`), and a
        multi-process job the compile times the ranks' meeting is bounded by. A training
        job on a remote cache has an empty manifest: the function with the largest inputs
        is taken for the step."""
        report = recorder.report
        if self.job != TRAIN and report.process_count <= 1:
            return
        manifest = manifest_of(self.store)
        self.entries = tuple(manifest.for_run(self.config.run.name))
        if self.job == TRAIN:
            watch_prewarmed(self.config, recorder, manifest,
                            fingerprint_keys(self.store,
                                             launch_fingerprint(self.config.run_dir, TRAIN)))

    def ranks_bound(self, recorder: InitRecorder) -> None:
        """After the manifest: the ranks' meeting is bounded by the compile times it
        recorded for this layout (`ranks.meet_timeout`)."""
        if self.ranks is not None:
            self.ranks.bind(meet_timeout(self.config, list(self.entries)))

    def mlperf_started(self, recorder: InitRecorder) -> None:
        """MLPerf's init lines from process 0 of a training job: `init_start` now (dated at
        the process's start); `init_stop` and `run_start` when init is over
        (`mlperf_stopped`). Without the package it says so once; training goes on."""
        if recorder.report.process_index != 0 or self.job != TRAIN or \
                not self.config.report.mlperf:
            return
        try:
            self.mlperf = MlperfLog(mlperf_log_path(self.config.run_dir,
                                                    recorder.report.restart_count),
                                    recorder.start_time)
        except (MlperfUnavailable, OSError) as exc:
            log.warning("jaxwarm: no MLPerf lines: %s", exc)

    def published_at_exit(self, recorder: InitRecorder) -> None:
        """Process 0 on a staged node publishes what it compiles after the first step too,
        as the process ends (what it wrote before is published when init is over)."""
        if recorder.report.process_index == 0 and self.staging is not None and self.staged:
            atexit.register(publish_at_exit, self.config, self.store, self.staging,
                            recorder.start_time)

    def cache_said(self, recorder: InitRecorder) -> None:
        """The job log names the cache dir JAX uses and the process's place, once it is
        known safe to load from."""
        log.info("persistent compilation cache at %s (process %d of %d, restart %d)",
                 _jax_cache_dir(), recorder.report.process_index,
                 recorder.report.process_count, recorder.report.restart_count)

    def prefetch_begun(self, recorder: InitRecorder) -> None:
        """`cache.prefetch`, as soon as the process has its backend (after jax.distributed's
        join, or here, last at the first lowering, after the cache dir checks): load this
        run's prewarmed executables for this layout on background threads
        (`jaxwarm.job.prefetch`). On CPU only process 0 does: the other processes' keys
        are their own. Its report goes into the init report, and what was never asked for is
        released once init is over (`prefetch_finished`). Nothing is read from a cache dir
        that fails the checks every job makes before JAX loads code from it (the job's own
        check, at its first lowering, says why in one line)."""
        store, jax_store, config = self.store, self.jax_store, self.config
        if not self.wants_prefetch or self._prefetch_tried:
            return
        self._prefetch_tried = True
        import jax

        if jax.devices()[0].platform == "cpu" and jax.process_index() != 0:
            return
        try:
            store.check(config.cache, config.source)
            if self.staged:
                jax_store.check(config.cache, config.source, key="cache.stage")
        except ConfigError as exc:
            log.warning("jaxwarm: no prefetch: %s", exc)
            return
        entries = [e for e in manifest_of(store).for_run(config.run.name)
                   if e.process_count == jax.process_count()]
        try:
            self.prefetch = start_prefetch(entries, jax_store,
                                           config.cache.prefetch_max_size,
                                           time.time() - recorder.start_time,
                                           capped=config.cache.max_size != -1,
                                           wait_for_core=config.cache.prefetch == "auto")
        except UnsupportedJaxVersion as exc:  # JAX loads at the trainer's call, as without it
            log.warning("jaxwarm: no prefetch: %s", exc)
            return
        if self.prefetch is not None:
            recorder.report.prefetch = self.prefetch.report

    # -- INIT_OVER: once the first step is done ---------------------------------------------

    def prefetch_finished(self, recorder: InitRecorder) -> None:
        """First: what the prefetch loaded and nobody asked for is released, and its report
        is final, before anything below reads the report."""
        if self.prefetch is not None:
            self.prefetch.finish()

    def ledger_stopped(self, recorder: InitRecorder) -> None:
        """The init ledger stops sampling; its cost goes into the report."""
        if self.ledger is not None:
            self.ledger.stop()
            recorder.report.sampling = self.ledger.sampling()

    def missed_prewarms_forgotten(self, recorder: InitRecorder) -> None:
        """Process 0 of a training job: a prewarmed function it missed under another key
        voids the prewarm record its launch trusted (`forget_missed_prewarms`)."""
        if recorder.report.process_index == 0 and self.job == TRAIN:
            forgot = forget_missed_prewarms(self.config, self.store, recorder.report)
            if forgot is not None:  # the store's own line is in the job's log already
                recorder.add_warning(forgot, quiet=True)

    def mlperf_stopped(self, recorder: InitRecorder) -> None:
        """`init_stop` and `run_start`, dated where the first step's first execution began
        (the step's compile or load ended, and the ranks' meeting after it too)."""
        if self.mlperf is not None:
            self.mlperf.stop(recorder.clock.first_step_start or recorder.start_time +
                             (recorder.report.time_to_first_step_s or 0.0))

    def written_entries_noted(self, recorder: InitRecorder) -> None:
        """Process 0: the checksum of each entry it wrote onto its record, before the usage
        log takes them from there; a staged node's entries are published to the shared dir
        first (`publish_written`)."""
        if recorder.report.process_index != 0:
            return
        if self.staging is not None and self.staged:
            publish_written(self.config, self.store, self.staging, recorder.report,
                            recorder.start_time)
        else:
            note_written_entries(self.store, recorder.report, recorder.start_time)

    def missed_entries_noted(self, recorder: InitRecorder) -> None:
        """Process 0: a miss on an entry that was in the cache is read in full to say why
        (`note_missed_entries`), before the usage log."""
        if recorder.report.process_index == 0:
            note_missed_entries(self.config, self.store, self.jax_store, recorder.report,
                                recorder.start_time)

    def xla_dirs_shared(self, recorder: InitRecorder) -> None:
        """Under a trusted group: what XLA made in the shared dir during init, shared
        (`share_xla_dirs`)."""
        share_xla_dirs(self.config, self.store)

    def usage_logged(self, recorder: InitRecorder) -> None:
        """Last: process 0's line in the cache's usage log, with what the steps above put
        on the report's records."""
        if recorder.report.process_index == 0:
            self.store.append_usage(job_usage(self.config, recorder.report))


Step = Callable[[Books, InitRecorder], None]

# What needs the process's place, at its first lowering (or `enable_cache()`), in order.
BOUND: tuple[Step, ...] = (
    Books.cache_dir_checked,
    Books.prewarmed_watched,
    Books.ranks_bound,
    Books.mlperf_started,
    Books.published_at_exit,
    Books.cache_said,
    Books.prefetch_begun,
)

# Once init is over (the first step, or a guessed one at the process's end), in order.
INIT_OVER: tuple[Step, ...] = (
    Books.prefetch_finished,
    Books.ledger_stopped,
    Books.missed_prewarms_forgotten,
    Books.mlperf_stopped,
    Books.written_entries_noted,
    Books.missed_entries_noted,
    Books.xla_dirs_shared,
    Books.usage_logged,
)


def share_xla_dirs(config: Config, store: CacheStore) -> None:
    """Under `cache.trusted_group`: the sub-cache dirs XLA made in the shared cache dir
    (`store`) for this job (on GPU its autotune dirs, 0750 under the job's umask) made
    group-writable, so that the next member's job may add to them
    (`CacheStore.share_with_group`); said in the job log. Never stops the job."""
    if config.cache.trusted_group is None:
        return
    try:
        changed = store.share_with_group()
    except OSError as exc:
        log.warning("jaxwarm: XLA's dirs in the shared cache dir: %s", exc)
        return
    if changed:
        log.info("jaxwarm: made group-writable (XLA made them without the group's write): %s",
                 ", ".join(str(path) for path in changed))


def _bookkeeping(step: Callable[[], None]) -> None:
    try:
        step()
    except OSError as exc:  # bookkeeping must never stop training
        log.warning("after the first step: %s", exc)


def _jax_cache_dir() -> str:
    import jax

    return str(jax.config.jax_compilation_cache_dir or "")


def manifest_of(store: CacheStore) -> Manifest:
    """The prewarm manifest, read once per job; one that cannot be read counts as empty (and
    says so): bookkeeping never stops training."""
    try:
        return store.manifest(strict=False)
    except OSError as exc:
        log.warning("the prewarm manifest cannot be read: %s", exc)
        return Manifest()


def watch_prewarmed(config: Config, recorder: InitRecorder, manifest: Manifest,
                    same_fingerprint: frozenset[str] = frozenset()) -> None:
    """What a training job takes from the prewarm manifest. For a trainer that does not call
    mark_first_step(): the steps any run's prewarm compiled on this layout (same name and
    signature: a run warm from another run's entries, or a cold run of a step prewarmed
    before, is timed by the same function as this run's own prewarm), and, with none, a
    guess (`Found.LARGEST_INPUTS`). And every prewarmed function, each with the one prewarm
    a lookup of it is compared with (`Manifest.compared`: this run's, else the prewarm of
    this launch's fingerprint, `same_fingerprint`, else the newest): a lookup of one is
    marked prewarmed (a step's, with other inputs, still ends the first step), and a miss
    of one is compared with the inputs and the global JAX settings the prewarm lowered it
    with (`InitRecorder._compare_with_prewarm`), so a relaunch under a new run name names
    its misses too. `run_prewarmed` counts this run's own."""
    recorder.first_step.expect({
        (e.function, e.signature): e.run for e in manifest.values()
        if e.is_step and e.process_count == recorder.report.process_count})
    compared = list(manifest.compared(config.run.name, same_fingerprint).values())
    recorder.expect_prewarmed(
        {e.function: Prewarmed(e.signature, e.inputs, e.is_step, e.run, e.key) for e in compared},
        {e.function: e.global_options for e in compared},
        run_prewarmed=len(manifest.for_run(config.run.name)))


def job_usage(config: Config, report: InitReport) -> JobUsage:
    """What process 0 of a job tells the cache's usage log: which keys it looked up, hit
    or missed, and the checksum of each entry it wrote (for `jaxwarm cache verify`)."""
    return JobUsage(
        run=config.run.name, run_dir=str(config.run_dir), config=config.source, job=report.job,
        restart=report.restart_count,
        functions=[UsedFunction(name=record.name, key=record.key, hit=record.hit,
                                seconds=round(record.seconds, 3), sha256=record.sha256 or None,
                                size=record.size if record.sha256 else None)
                   for record in report.functions if record.key is not None])


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


def note_missed_entries(config: Config, store: CacheStore, jax_dir: CacheStore,
                        report: InitReport, since: float) -> None:
    """A miss on a key whose entry was in the cache JAX read (`jax_dir`: the shared `store`,
    or the node's staged copy of it) before this process started means JAX could not load that
    entry (JAX never replaces it): `jax_dir` says why (`CacheStore.load_problem`, the report
    shows it), and the usage log records it, so the next prewarm checks the entry in full and
    replaces it if it is corrupt. A process that read another dir (a trainer's own, under
    cache.enforce off) was never offered the entries of `jax_dir`: its misses say where it
    looked instead. An entry that was not there because it had been quarantined (by the
    launch's pre-run check, or right before JAX's read) is noted as that (the usage log's
    last word on it, before this job's own line), so that the report does not call it
    pruned or deleted."""
    if report.cache_dir != jax_dir.dir:
        return
    histories = {**store.histories(), **jax_dir.histories()}
    for record in report.functions:
        if record.key is None or record.hit:
            continue
        history = histories.get(record.key)
        record.quarantined = history.quarantined if history is not None else None
        if record.sha256 is not None:
            continue
        record.not_loaded = jax_dir.load_problem(record.key, since, store)
        if record.not_loaded is not None:
            log.warning("%s: missed although its entry %s was in the cache %s (JAX could not "
                        "load it: %s); the next prewarm checks it in full", record.name,
                        record.key, jax_dir.dir, record.not_loaded)
            store.append_usage(EntryMissed(record.key, config.run.name))


def note_written_entries(store: CacheStore, report: InitReport, since: float) -> None:
    """Checksum each entry this process wrote, once, onto its record (the usage log and
    the prewarm manifest both take it from there)."""
    for record in report.functions:
        if record.key is not None and not record.hit and record.sha256 is None:
            written = store.written_since(record.key, since)
            if written:
                record.sha256, record.size = written


def publish_written(config: Config, store: CacheStore, staging: Staging,
                    report: InitReport | None, since: float) -> None:
    """Publish the entries this process wrote into its node's stage dir to the shared dir
    (`CacheStore.publish_from`), and put each published entry's checksum onto its record for the
    usage log. Only what was published is recorded: an entry another writer put in the
    shared dir first stays that writer's, and the job's own copy stays node-local."""
    published = store.publish_from(staging.dir, since, config.cache.max_size)
    for record in report.functions if report is not None else []:
        if record.key in published and not record.hit and record.sha256 is None:
            record.sha256, record.size = published[record.key]
    if published:
        log.info("published %d %s written in %s to %s", len(published),
                 plural(len(published), "entry", "entries"), staging.dir, config.cache.dir)


def publish_at_exit(config: Config, store: CacheStore, staging: Staging,
                    since: float) -> None:
    try:
        publish_written(config, store, staging, None, since)
    except OSError as exc:  # bookkeeping must never turn an exit into a failure
        log.warning("jaxwarm: publishing from %s at exit: %s", staging.dir, exc)


def forget_missed_prewarms(config: Config, store: CacheStore,
                           report: InitReport) -> ReportWarning | None:
    """Process 0 of a job launched under a recorded prewarm's fingerprint looked one of
    that prewarm's functions up under another key: what the login node's fingerprint
    promised does not hold (a GPU driver, a module imported by a computed name). Forget
    that record, so the next launch with this fingerprint runs its prewarm job again. (A
    launch under another fingerprint that misses is no news: its decision said so.) What
    was forgotten is said in one line, for the report (the launch's output, status)."""
    path = prewarm_decision_path(config.run_dir)
    decision = read_record(PrewarmDecision, path)
    if decision is None or decision.fingerprint is None:
        return None
    digest = decision.fingerprint.digest
    record = store.prewarms().get(digest)
    if record is None:
        return None
    promised = {function_of(key): key for key in record.keys}
    for function in report.functions:
        key = promised.get(function.name)
        if key is not None and not function.hit and function.key not in (None, key):
            store.forget_prewarm(digest, key,
                                 f"{function.name} missed under key {function.key}, not the "
                                 f"prewarmed {key}")
            return ReportWarning(PREWARM_FORGOTTEN, (
                f"prewarm record of run {record.run!r} forgotten: {function.name} missed its "
                f"prewarmed key, which this fingerprint promised; the next launch with it "
                f"prewarms again"))
    return None

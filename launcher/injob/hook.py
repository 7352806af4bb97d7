"""The in-job hook: `enable_cache()` after `jax.distributed.initialize()`, before the first compile.

Any trainer can call it. Under the launcher the environment already carries the settings
(JAX reads them at import); the hook re-applies them from the config so that a trainer
started by hand gets the same cache, refuses a process whose environment points elsewhere
(JAX silently ignores a second cache dir), creates the dir from process 0, and starts the
init-report recorder. A trainer that does not call it gets the same recorder from the
launcher (`install_recorder`, run by `launcher.injob.boot` when the trainer imports jax,
whatever the launch form).
"""

from __future__ import annotations

import atexit
import logging
import os
from pathlib import Path

from launcher.config import Config, ConfigError, load_config
from launcher.environment import is_remote, jax_options, owned, resolve_paths
from launcher.files import GROUP_UMASK
from launcher.injob.guard import CacheGuard
from launcher.injob.place import Place
from launcher.injob.ranks import RankCoordinator, agreement_on, meet_timeout
from launcher.injob.recorder import InitRecorder, InitReport
from launcher.jaxkey.lookup import watch_lookups
from launcher.records import EntryMissed
from launcher.rundir import TRAIN, report_path
from launcher.store.entries import entry_path, written_since
from launcher.store.manifest import ManifestEntry, latest_for_run, read_manifest
from launcher.store.security import (
    DirIdentity,
    check_cache_dir,
    prepare_cache_dir,
    recheck_cache_dir,
)
from launcher.store.usage import append_usage, job_usage

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


def note_missed_entries(config: Config, report: InitReport, since: float) -> None:
    """A miss on a key whose entry was in the cache before this process started means JAX
    could not load that entry (JAX never replaces it): say so, and record it in the usage
    log, so the next prewarm checks the entry in full and replaces it if it is corrupt."""
    for record in report.functions:
        if record.key is None or record.hit or record.sha256 is not None:
            continue
        path = entry_path(config.cache.dir, record.key)
        if path.exists() and written_since(config.cache.dir, record.key, since) is None:
            log.warning("%s: missed although its entry %s was in the cache (JAX could not load "
                        "it); the next prewarm checks it in full", record.name, path)
            append_usage(config.cache.dir, EntryMissed(record.key, config.run.name))


def note_written_entries(cache_dir: str, report: InitReport, since: float) -> None:
    """Checksum each entry this process wrote, once, onto its record (the usage log and
    the prewarm manifest both take it from there)."""
    for record in report.functions:
        if record.key is not None and not record.hit and record.sha256 is None:
            written = written_since(cache_dir, record.key, since)
            if written:
                record.sha256, record.size = written


_active: InitRecorder | None = None


def install_recorder(config: Config | str | Path | None = None, *, job: str = TRAIN,
                     recompile_warn_s: float = 1.0) -> InitRecorder:
    """Apply the config's cache settings and start the init report, touching no device.

    This is what runs before a wrapped trainer's own code (`launcher.injob.boot`): the
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
    for name, value in options.items():
        current = getattr(jax.config, name)
        if name == "jax_compilation_cache_dir" and current and current != value:
            raise ConfigError(
                f"this process already uses compilation cache dir {current!r} but the config "
                f"says {value!r}; JAX ignores a second cache dir, so the run would not hit. "
                f"Start the job through jaxwarm or unset JAX_COMPILATION_CACHE_DIR")
        if current != value:
            jax.config.update(name, value)

    restart = Place.here().restart
    report = InitReport(
        job=job, restart_count=restart, process_index=-1, process_count=0,
        cache_dir=config.cache.dir, init_budget_s=config.init_budget_s,
        environment={k: v for k, v in sorted(os.environ.items()) if owned(k)})
    recorder = InitRecorder(
        report, lambda process: report_path(config.run_dir, job, restart, process),
        recompile_warn_s, CacheGuard.from_options(options, config.cache.enforce)).install()
    ranks = RankCoordinator(recorder, agreement_on(config))
    watch_lookups(ranks.before_lookup, ranks.after_compile)
    recorder.on_bind.append(lambda bound: on_bind(config, bound, ranks))
    atexit.register(recorder.write)
    _active = recorder
    return recorder


def prewarmed(config: Config) -> list[ManifestEntry]:
    """What this run's prewarm compiled: the first execution of one of its steps ends the
    first step of a trainer that does not call mark_first_step(), a miss of one of them is
    checked against the global JAX settings it was lowered under, and their compile times
    size how long the ranks wait for each other (`ranks.meet_timeout`)."""
    try:  # a broken manifest reads as empty (and says so): bookkeeping never stops training
        manifest = read_manifest(config.cache.dir, strict=False)
    except OSError as exc:
        log.warning("no time to first step without mark_first_step(): %s", exc)
        return []
    return latest_for_run(manifest, config.run.name)


def on_bind(config: Config, recorder: InitRecorder, ranks: RankCoordinator) -> None:
    """What needs the process index: the cache dir checks (every rank loads native code from
    it, process 0 creates it), the prewarmed steps to time, the ranks' meeting bound (from
    the compile times the manifest recorded), process 0's bookkeeping."""
    import jax

    report = recorder.report
    entries: list[ManifestEntry] = []
    if not is_remote(config.cache.dir):
        if report.process_index == 0:
            checked = prepare_cache_dir(Path(config.cache.dir), config.cache, config.source)
        else:
            checked = check_cache_dir(Path(config.cache.dir), config.cache, config.source)
        recorder.before_lookup.append(lambda: recheck_before_lookup(config, checked))
        if report.job == TRAIN or report.process_count > 1:
            entries = prewarmed(config)
        if report.job == TRAIN:
            recorder.step_functions = {(e.function, e.signature) for e in entries if e.is_step}
            recorder.prewarmed_options = {e.function: e.global_options for e in entries
                                          if e.global_options}
    ranks.bind(meet_timeout(config, entries))
    if report.process_index == 0 and not is_remote(config.cache.dir):
        recorder.after_first_step += [
            lambda done: note_written_entries(config.cache.dir, done, recorder.start_time),
            lambda done: note_missed_entries(config, done, recorder.start_time),
            lambda done: append_usage(config.cache.dir, job_usage(config, done))]
    log.info("persistent compilation cache at %s (process %d of %d, restart %d)",
             jax.config.jax_compilation_cache_dir, report.process_index,
             report.process_count, report.restart_count)


def recheck_before_lookup(config: Config, checked: DirIdentity | None) -> None:
    """Whatever dir JAX is about to use passes the cache-dir checks again: the config's must
    still be the very dir checked at the start, and one the trainer set instead (with
    cache.enforce off) gets the same checks before JAX reads code from it."""
    import jax

    current = jax.config.jax_compilation_cache_dir
    if not current or is_remote(str(current)):
        return
    if current == config.cache.dir:
        recheck_cache_dir(Path(current), config.cache, config.source, checked)
    else:
        check_cache_dir(Path(current), config.cache, f"{config.source} (set by the trainer)")


def enable_cache(config: Config | str | Path | None = None, *, job: str = TRAIN,
                 recompile_warn_s: float = 1.0) -> InitRecorder:
    """Turn the persistent cache on with the config's settings and start the init report.

    Call it after `jax.distributed.initialize()` and before the first compile. Returns the
    recorder: call `mark_first_step()` on it after the first step finished (without that
    call, the end of the first execution of a prewarmed step counts). The report is also
    written at exit, with every compile the process made. A function compiled twice under
    different keys is warned about when both compiles took at least `recompile_warn_s`
    (small helpers legitimately compile once per input shape).
    """
    recorder = install_recorder(config, job=job, recompile_warn_s=recompile_warn_s)
    recorder.bind()
    return recorder

"""The in-job hook: `enable_cache()` after `jax.distributed.initialize()`, before the first compile.

Any trainer can call it. Under the launcher the environment already carries the settings
(JAX reads them at import); the hook re-applies them from the config so that a trainer
started by hand gets the same cache, refuses a process whose environment points elsewhere
(JAX silently ignores a second cache dir), and starts the init-report recorder. A trainer
that does not call it gets the same recorder from the launcher (`install_recorder`, run by
`jaxwarm.job.start.jaximport` when the trainer imports jax, whatever the launch form).

The start is `INSTALL`, a named sequence read top to bottom, run before the trainer's own
code can touch a device; what needs the process's place (the cache dir checks, the
manifest, the ranks' bound, process 0's records) follows at its first lowering, in the
order `jaxwarm.job.start.books.BOUND` gives, and what the job adds to its report after the
first step in that of `INIT_OVER`.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxwarm.core.config import Config
from jaxwarm.core.environment import jax_options, owned
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import GROUP_UMASK
from jaxwarm.core.records import TRAIN, VERIFY, InitReport, Staging
from jaxwarm.core.rundir import report_path
from jaxwarm.jaxkey.entryload import guard_reads
from jaxwarm.jaxkey.lookup import watch_lookups
from jaxwarm.job.ranks import RankCoordinator, agreement_on
from jaxwarm.job.record.ledger import Ledger
from jaxwarm.job.record.phases import call_after_join
from jaxwarm.job.record.recorder import InitRecorder
from jaxwarm.job.stage import node_cache_dir
from jaxwarm.job.start.books import Books, share_xla_dirs
from jaxwarm.job.start.cacheguard import CacheGuard, actor_of
from jaxwarm.job.start.distributed import bound_trainer_joins
from jaxwarm.job.start.gpu import mocked_topology
from jaxwarm.job.start.pinned import config_from_env
from jaxwarm.job.start.place import Place
from jaxwarm.store.store import open_store


@dataclass
class Start:
    """What the steps of `INSTALL` hand each other: the job's config and kind, and what the
    earlier steps set up."""

    config: Config
    job: str
    recompile_warn_s: float
    # The JAX settings the config makes (the cache dir: the node's staged copy, if staged).
    options: dict[str, Any] = field(default_factory=dict)
    staging: Staging | None = None
    books: Books = field(init=False)
    recorder: InitRecorder = field(init=False)


def group_shared(start: Start) -> None:
    """First, before JAX or jaxwarm creates a file in the shared cache: under a trusted
    group, what JAX creates there (entries, atime files, its .lockfile) must be readable and
    writable by every member of the group, like jaxwarm's own files. XLA's own sub-cache
    dirs ignore the umask's group write (made 0755, so 0750): this job makes those it
    made group-writable at its first step (`Books.xla_dirs_shared`) and at its exit."""
    if start.config.cache.trusted_group is not None:
        os.umask(GROUP_UMASK)
        atexit.register(share_xla_dirs, start.config, open_store(start.config.cache.dir))


def node_staged(start: Start) -> None:
    """Before the settings: a training job with `cache.stage` reads its node's copy of the
    shared dir (`jaxwarm.job.stage`), so JAX's cache dir is that copy."""
    start.options = jax_options(start.config)
    if start.job == TRAIN and start.config.cache.stage is not None:
        start.staging = node_cache_dir(start.config, Place.here())
        start.options["jax_compilation_cache_dir"] = start.staging.dir


def cache_settings_applied(start: Start) -> None:
    """The config's JAX settings, before the first compile (JAX opens its cache dir at the
    first lookup and keeps it). A process already pointed at another cache dir is refused:
    JAX would ignore the second one. The job environment names the shared dir, which a
    staged job may replace with its node's copy."""
    import jax

    config = start.config
    for name, value in start.options.items():
        current = getattr(jax.config, name)
        if name == "jax_compilation_cache_dir" and current and \
                current not in (value, config.cache.dir):
            raise ConfigError(
                f"this process already uses compilation cache dir {current!r} but the config "
                f"says {value!r}; JAX ignores a second cache dir, so the run would not hit. "
                f"Start the job through jaxwarm or unset JAX_COMPILATION_CACHE_DIR")
        if current != value:
            jax.config.update(name, value)


def recorder_installed(start: Start) -> None:
    """The recorder, listening to JAX from here on, with its books: the cache guard holds
    the settings just applied (a later change by the trainer, or a step factory, is said
    and undone under cache.enforce). The process's index is not known yet and no device
    may be touched (the trainer may still call `jax.distributed.initialize()` itself): it is
    learnt at the first lowering (`InitRecorder.bind`)."""
    config, job, options = start.config, start.job, start.options
    restart = Place.here().restart
    report = InitReport(
        job=job, restart_count=restart, process_index=-1, process_count=0,
        cache_dir=options["jax_compilation_cache_dir"], init_budget_s=config.init_budget_s,
        environment={k: v for k, v in sorted(os.environ.items()) if owned(k)},
        stage=start.staging)
    store = open_store(config.cache.dir)
    start.books = Books(
        config, job, store=store,
        jax_store=open_store(start.staging.dir) if start.staging is not None else store,
        staging=start.staging,
        guard=CacheGuard.from_options(options, config.cache.enforce, actor_of(job)))
    start.recorder = InitRecorder(
        report, lambda process: report_path(config.run_dir, job, restart, process),
        start.recompile_warn_s, start.books).install()


def entries_guarded(start: Start) -> None:
    """Right before JAX itself reads an entry, whatever was checked before: the file under
    the key must still be a regular one within the cap, opened without blocking; anything
    else (a link to /dev/zero, a FIFO, planted after the launch's and the job's checks) is
    quarantined (left where it is by a verify, which writes nothing into the cache dir)
    and the lookup is a miss, in one line (`jaxwarm.store.integrity.refuse_read`). Before
    the prefetch, which reads what it loads itself, within its own bounds."""
    repair = start.job != VERIFY

    def refuse(cache_dir: str, key: str) -> bool:
        return open_store(cache_dir).refuse_read(key, repair)

    guard_reads(refuse)


def ranks_watching(start: Start) -> None:
    """The ranks' meeting and agreement around each multi-process lookup
    (`jaxwarm.job.ranks`), set up before the first lookup; bound at the first lowering.
    A mocked prewarm is one process compiling for several: no other rank to meet."""
    if mocked_topology():
        return
    ranks = start.books.ranks = RankCoordinator(start.recorder, agreement_on(start.config))
    watch_lookups(ranks.before_lookup, ranks.after_compile)


def joins_bounded(start: Start) -> None:
    """The trainer's own `jax.distributed` join, bounded (`ranks.join_timeout_s`) with one
    line naming a rank that never came (`jaxwarm.job.start.distributed`)."""
    bound_trainer_joins(start.config)


def ledger_sampling(start: Start) -> None:
    """A training job's init ledger (`jaxwarm.job.record.ledger`): the phase "other" by what
    its main thread was doing, sampled from here to the end of init."""
    if start.job == TRAIN:
        start.books.ledger = start.recorder.clock.ledger = Ledger().start()


def prefetch_after_join(start: Start) -> None:
    """`cache.prefetch` in a training job: it begins once the process has its backend,
    after jax.distributed's join or at the first lowering, whichever comes first
    (`Books.prefetch_begun`; a remote cache's empty manifest names nothing to load)."""
    config = start.config
    if start.job != TRAIN or config.cache.prefetch is False:
        return
    start.books.wants_prefetch = True
    books, recorder = start.books, start.recorder
    call_after_join(lambda: books.joined(recorder))


def report_at_exit(start: Start) -> None:
    """Last: the report is written at the process's exit, with every compile it made."""
    atexit.register(start.recorder.close)


InstallStep = Callable[[Start], None]

# The in-job start, in order, before the trainer's own code touches a device.
INSTALL: tuple[InstallStep, ...] = (
    group_shared,
    node_staged,
    cache_settings_applied,
    recorder_installed,
    entries_guarded,
    ranks_watching,
    joins_bounded,
    ledger_sampling,
    prefetch_after_join,
    report_at_exit,
)

_active: InitRecorder | None = None


def install_recorder(config: Config | str | Path | None = None, *, job: str = TRAIN,
                     recompile_warn_s: float = 1.0) -> InitRecorder:
    """Apply the config's cache settings and start the init report, touching no device:
    `INSTALL`, in order.

    This is what runs before a wrapped trainer's own code (`jaxwarm.job.start.jaximport`). One
    recorder per process: a later `enable_cache()` (a trainer that calls it, under the
    wrapper) gets this one.
    """
    global _active
    if _active is not None:
        return _active
    start = Start(config_from_env(config), job, recompile_warn_s)
    for step in INSTALL:
        step(start)
    _active = start.recorder
    return start.recorder


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

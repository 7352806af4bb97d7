"""Before any job starts: resolve and pin the config into the run dir, get the cache dir ready.

Both run on the submitting machine, once per launch, so that every job, rank and restart
reads one resolved config, and a bad entry is out of the way before a job trips on it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jaxwarm.core.config import Config, config_digest, pinned_text
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import atomic_write, locked, make_dirs, read_capped
from jaxwarm.core.rundir import (
    earlier_reports_dir,
    lock_path,
    pinned_config,
    report_paths,
    verify_config,
)
from jaxwarm.core.trust import check_run_dir, prepare_run_dir
from jaxwarm.core.words import plural
from jaxwarm.core.yamlio import CONFIG_CAP, load_yaml
from jaxwarm.job.start.pinned import resolve_paths
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.store import open_store

log = logging.getLogger(__name__)


def resolve_run(config: Config, base: Path | None = None,
                verify: bool = False) -> tuple[Config, Path]:
    """The config with canonical paths, and where its pinned copy goes (a verify's to
    `verify_config`, beside its verdicts). Checks the cache dir and the run dir
    (`check_run_dir`) but writes nothing: a launch refused by a later check (a missing
    entrypoint, a busy run dir) must leave the run dir, and the pinned config that requeued
    jobs read, as they were.
    """
    open_store(config.cache.dir).check(config.cache, config.source, writing=True, base=base)
    config = resolve_paths(config, base)
    check_run_dir(config)
    refuse_small_cap(config)
    return config, (verify_config if verify else pinned_config)(config.run_dir)


def refuse_small_cap(config: Config) -> None:
    """A `cache.max_size` below what the run's prewarm wrote would have JAX's own LRU evict
    the run's entries while writing them (the step then misses, for no visible reason)."""
    if config.cache.max_size == -1:
        return
    entries = open_store(config.cache.dir).run_entries(config.run.name)
    need = sum(entry.size or 0 for entry in entries)
    if need > config.cache.max_size:
        raise ConfigError(f"{config.source}: cache.max_size: {config.cache.max_size} bytes is "
                          f"less than the {need} bytes of the {len(entries)} entries run "
                          f"{config.run.name!r} prewarms; JAX would evict them to stay under "
                          f"it and the run would miss. Raise it (or -1: no cap)")


def keep_earlier_reports(run_dir: Path, jobs: tuple[str, ...] | None = None) -> Path | None:
    """Before a launch's jobs write their init reports: the earlier launch's (of `jobs`'
    kinds; None: every kind), under the same names (`train-r0-p0.json`), moved aside into
    the next numbered dir (`rundir.earlier_reports_dir`), never overwritten. Where they
    went; None: none."""
    found = [path for name, path in report_paths(run_dir)
             if path.is_file() and (jobs is None or name.job in jobs)]
    if not found:
        return None
    launch = 1
    while earlier_reports_dir(run_dir, launch).exists():
        launch += 1
    kept = earlier_reports_dir(run_dir, launch)
    make_dirs(kept)
    for path in found:
        path.rename(kept / path.name)
    log.info("the earlier launch's init reports are kept in %s", kept)
    return kept


def write_run_dir(config: Config, pinned: Path | None = None) -> str:
    """Create the cache and run dirs and write the pinned config (to `pinned`, where
    `resolve_run` put it: the run's own, or a verify's); only once every check passed, and
    under the run dir's lock when launching. Returns the sha256 of what it wrote, which the
    jobs check the file against (`config.load_pinned`)."""
    open_store(config.cache.dir).prepare(config.cache, config.source)
    pinned = pinned or pinned_config(config.run_dir)
    make_dirs(pinned.parent)
    readers = "every job of this run reads it" if pinned == pinned_config(config.run_dir) \
        else "the verify job reads it; the run's own is left as it was"
    text = pinned_text(config, readers).encode()
    atomic_write(pinned, text)
    return config_digest(text)


def adopt_run_dir(config: Config) -> str:
    """What a job script submitted by hand (`jaxwarm render`) needs, without touching a run
    that exists: a new run dir gets its pinned config; an existing one must already pin
    this very config, since its requeued jobs read it. Call under the run dir's lock.
    Returns the sha256 of the pinned config (`write_run_dir`)."""
    path = pinned_config(config.run_dir)
    try:
        data = read_capped(path, CONFIG_CAP, "a config")
        pinned = load_yaml(data.decode("utf-8"), str(path))
    except FileNotFoundError:
        return write_run_dir(config)
    except (OSError, UnicodeDecodeError, ConfigError) as exc:
        raise ConfigError(f"{config.source}: run.name: {path} cannot be read ({exc}); "
                          f"render writes no pinned config over it") from None
    if pinned != config.to_dict():
        raise ConfigError(f"{config.source}: run.name: run dir {config.run_dir} is pinned to "
                          f"other values ({path}); render writes nothing over a run's pinned "
                          f"config: use another run.name, or render the config it pins")
    return config_digest(data)


@contextmanager
def holding_run_dir(config: Config) -> Iterator[None]:
    """The run dir's lock, for a launch's whole life: a second launch into the same run dir
    would train into the same checkpoints and overwrite the reports, so it is refused at
    once, naming the first (`files.describe_holder`)."""
    prepare_run_dir(config)
    with locked(lock_path(config.run_dir), f"run dir {config.run_dir}", timeout_s=0):
        yield


def pin_config(config: Config, base: Path | None = None) -> tuple[Config, Path]:
    """`resolve_run` and `write_run_dir` in one, for callers that need no check between."""
    config, path = resolve_run(config, base)
    write_run_dir(config, path)
    return config, path


def prepare_cache(config: Config, store: CacheStore, check: bool,
                  repair: bool = True) -> dict[str, str]:
    """Size-capped caches get the atime files JAX's eviction needs, and the entries this
    run's prewarm recorded are checked in full (a corrupt one is quarantined, so the job
    compiles and rewrites it instead of crashing or missing forever). Without `repair`
    (verify, which writes nothing into the cache dir) nothing is added or moved: the bad
    entries are said and returned, by key, with why. (A remote dir records no entries of
    a run: nothing is checked there.)"""
    if repair and config.cache.max_size != -1:
        store.ensure_atime_files()
    if not check:
        return {}
    keys = [e.key for e in store.run_entries(config.run.name)]
    checks, seconds = store.check_and_quarantine(keys, strict=False, repair=repair)
    bad = {c.key: c.problem or "" for c in checks if not c.ok}
    log.info("cache check: %d %s of run %s checked in %.0f ms, %d %s "
             "(--no-check-cache skips this)", len(checks), plural(len(checks), "entry", "entries"),
             config.run.name, 1e3 * seconds, len(bad),
             "quarantined" if repair else
             "bad, left for the next prewarm or launch to quarantine (verify writes nothing)")
    return bad

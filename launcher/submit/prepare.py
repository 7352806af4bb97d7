"""Before any job starts: pin the config into the run dir and get the cache dir ready.

Both run on the submitting machine, once per launch, so that every job, rank and restart
reads one resolved config, and a bad entry is out of the way before a job trips on it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from launcher.config import Config
from launcher.environment import is_remote, resolve_paths
from launcher.files import atomic_write
from launcher.rundir import pinned_config
from launcher.store.entries import ensure_atime_files
from launcher.store.integrity import check_and_quarantine
from launcher.store.manifest import latest_for_run, read_manifest
from launcher.store.security import prepare_cache_dir

log = logging.getLogger("jaxwarm.prepare")


def pin_config(config: Config, base: Path | None = None) -> tuple[Config, Path]:
    """Resolve paths once, check and create the run and cache dirs, write the pinned config.

    The cache dir is created before its path is made canonical, so a symlink that points
    to it is resolved now and never differs between jobs.
    """
    if not is_remote(config.cache.dir):
        cache = Path(config.cache.dir).expanduser()
        prepare_cache_dir(cache if cache.is_absolute() else (base or Path.cwd()) / cache,
                          config.cache, config.source)
    config = resolve_paths(config, base)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    path = atomic_write(
        pinned_config(config.run_dir),
        f"# Pinned by jaxwarm from {config.source}; every job of this run reads it.\n"
        + yaml.safe_dump(config.to_dict(), sort_keys=False))
    return config, path


def prepare_cache(config: Config, check: bool) -> None:
    """Size-capped caches get the atime files JAX's eviction needs, and the entries this
    run's prewarm recorded are checked (a corrupt one is quarantined, so the job compiles
    and rewrites it instead of crashing or missing forever)."""
    if is_remote(config.cache.dir):
        return
    if config.cache.max_size != -1:
        ensure_atime_files(config.cache.dir)
    if not check:
        return
    keys = [e.key for e in latest_for_run(read_manifest(config.cache.dir), config.run.name)]
    checks, seconds = check_and_quarantine(config.cache.dir, keys)
    bad = [c for c in checks if not c.ok]
    log.info("cache check: %d entr%s of run %s checked in %.0f ms, %d quarantined "
             "(--no-check-cache skips this)", len(checks), "y" if len(checks) == 1 else "ies",
             config.run.name, 1e3 * seconds, len(bad))

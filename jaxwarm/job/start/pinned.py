"""The config every job sees: resolved once, at launch, pinned into the run dir, and read back
by each job, rank and restart as it was pinned.

The cache dir's string enters the key before jax 0.11 (`jaxwarm.core.environment`), so it is
resolved once, by the store that owns the dir (a local dir is made canonical, a remote one is
kept as written), and XLA's own sub-caches are turned off where that dir cannot hold them
(plain file I/O). The store answers both: nothing here asks which kind of dir it is.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from jaxwarm.core.config import Config, load_config, load_pinned
from jaxwarm.core.environment import PINNED_DIGEST
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import canonical_path
from jaxwarm.store.store import open_store


def resolve_paths(config: Config, base: Path | None = None) -> Config:
    """Return the config with out_dir and cache.dir as canonical absolute strings, and the
    XLA sub-caches the cache dir can hold.

    Done once by the launcher; the result is pinned into the run dir so that a job started
    from another working directory, node or restart never re-resolves them differently.
    """
    store = open_store(config.cache.dir)
    return dataclasses.replace(
        config,
        run=dataclasses.replace(config.run, out_dir=canonical_path(config.run.out_dir, base)),
        cache=dataclasses.replace(config.cache, dir=store.resolved(base),
                                  xla_caches=store.xla_caches(config.cache.xla_caches)),
    )


def config_from_env(config: Config | str | Path | None = None) -> Config:
    """A job's config: the given one, or the pinned copy the launcher named in JAXWARM_CONFIG.

    The pinned copy is used as pinned: its paths were resolved once, at launch, and every
    job, rank and restart must see those very strings (on a node where part of the path is
    a symlink, e.g. autofs, resolving again gives another string, hence another cache dir).
    Only a YAML file passed by hand, which no launch resolved, is resolved here. The pinned
    copy is read as `load_pinned` reads it: owned by this user, writable by nobody else, and
    the file the launch wrote."""
    if isinstance(config, Config):
        return config
    if config is not None:
        return resolve_paths(load_config(config))
    pinned = os.environ.get("JAXWARM_CONFIG")
    if not pinned:
        raise ConfigError("no config: pass one to enable_cache() or start the job through "
                          "jaxwarm (which sets JAXWARM_CONFIG)")
    return load_pinned(pinned, os.environ.get(PINNED_DIGEST))

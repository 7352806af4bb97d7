"""The run directory: the pinned config every job reads, and where logs and reports go.

Layout of `<out_dir>/<run name>/`: config.yaml (resolved paths, overrides applied),
logs/<job>-p<process>.log, reports/<job>-r<restart>-p<process>.json, checkpoints/,
metrics.jsonl.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from launcher.config import Config
from launcher.environment import is_remote, resolve_paths
from launcher.security import prepare_cache_dir

PINNED_CONFIG = "config.yaml"


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
    path = config.run_dir / PINNED_CONFIG
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(f"# Pinned by jaxwarm from {config.source}; every job of this run reads it.\n"
                   + yaml.safe_dump(config.to_dict(), sort_keys=False))
    os.replace(tmp, path)
    return config, path


def log_path(run_dir: Path, job: str, process: int) -> Path:
    return Path(run_dir) / "logs" / f"{job}-p{process}.log"

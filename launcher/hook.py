"""The in-job hook: `enable_cache()` after `jax.distributed.initialize()`, before the first compile.

Any trainer can call it. Under the launcher the environment already carries the settings
(JAX reads them at import); the hook re-applies them from the config so that a trainer
started by hand gets the same cache, refuses a process whose environment points elsewhere
(JAX silently ignores a second cache dir), creates the dir from process 0, and starts the
init-report recorder.
"""

from __future__ import annotations

import atexit
import logging
import os
from pathlib import Path

from launcher.config import Config, load_config
from launcher.environment import is_remote, jax_options, owned, resolve_paths
from launcher.recorder import InitRecorder, InitReport, report_path, restart_count

log = logging.getLogger(__name__)


def config_from_env(config: Config | str | Path | None = None) -> Config:
    """The job's config: the given one, or the pinned copy the launcher named in JAXWARM_CONFIG."""
    if isinstance(config, Config):
        return config
    path = config or os.environ.get("JAXWARM_CONFIG")
    if not path:
        raise RuntimeError("no config: pass one to enable_cache() or start the job through "
                           "jaxwarm (which sets JAXWARM_CONFIG)")
    return resolve_paths(load_config(path))


def enable_cache(config: Config | str | Path | None = None, *, job: str = "init",
                 recompile_warn_s: float = 1.0) -> InitRecorder:
    """Turn the persistent cache on with the config's settings and start the init report.

    Returns the recorder: call `mark_first_step()` on it after the first step finished.
    The report is also written at exit, with every compile the process made. A function
    compiled twice under different keys is warned about when both compiles took at least
    `recompile_warn_s` (small helpers legitimately compile once per input shape).
    """
    import jax

    config = config_from_env(config)
    for name, value in jax_options(config).items():
        current = getattr(jax.config, name)
        if name == "jax_compilation_cache_dir" and current and current != value:
            raise RuntimeError(
                f"this process already uses compilation cache dir {current!r} but the config "
                f"says {value!r}; JAX ignores a second cache dir, so the run would not hit. "
                f"Start the job through jaxwarm or unset JAX_COMPILATION_CACHE_DIR")
        if current != value:
            jax.config.update(name, value)

    if jax.process_index() == 0 and not is_remote(config.cache.dir):
        Path(config.cache.dir).mkdir(parents=True, exist_ok=True)

    restart = restart_count()
    report = InitReport(
        job=job, restart_count=restart, process_index=jax.process_index(),
        process_count=jax.process_count(), cache_dir=config.cache.dir,
        init_budget_s=config.init_budget_s,
        environment={k: v for k, v in sorted(os.environ.items()) if owned(k)})
    path = report_path(config.run_dir, job, restart, jax.process_index())
    recorder = InitRecorder(report, path, recompile_warn_s).install()
    atexit.register(recorder.write)
    log.info("persistent compilation cache at %s (process %d of %d, restart %d)",
             config.cache.dir, jax.process_index(), jax.process_count(), restart)
    return recorder

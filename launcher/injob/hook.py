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
from launcher.injob.recorder import InitRecorder, InitReport, restart_count
from launcher.rundir import TRAIN, report_path
from launcher.store.security import check_cache_dir, prepare_cache_dir
from launcher.store.entries import written_since
from launcher.store.usage import append_usage

log = logging.getLogger("jaxwarm.hook")


def config_from_env(config: Config | str | Path | None = None) -> Config:
    """The job's config: the given one, or the pinned copy the launcher named in JAXWARM_CONFIG."""
    if isinstance(config, Config):
        return config
    path = config or os.environ.get("JAXWARM_CONFIG")
    if not path:
        raise RuntimeError("no config: pass one to enable_cache() or start the job through "
                           "jaxwarm (which sets JAXWARM_CONFIG)")
    return resolve_paths(load_config(path))


def note_written_entries(cache_dir: str, report: InitReport, since: float) -> None:
    """Checksum each entry this process wrote, once, onto its record (the usage log and
    the prewarm manifest both take it from there)."""
    for record in report.functions:
        if record.key is not None and not record.hit and record.sha256 is None:
            written = written_since(cache_dir, record.key, since)
            if written:
                record.sha256, record.size = written


def usage_record(config: Config, report: InitReport) -> dict:
    """What process 0 of a job tells the cache's usage log: which keys it looked up, hit
    or missed, and the checksum of each entry it wrote (for `jaxwarm cache verify`)."""
    functions = []
    for record in report.functions:
        if record.key is None:
            continue
        item = {"name": record.name, "key": record.key, "hit": record.hit,
                "seconds": round(record.seconds, 3)}
        if record.sha256:
            item["sha256"], item["size"] = record.sha256, record.size
        functions.append(item)
    return {"run": config.run.name, "run_dir": str(config.run_dir), "config": config.source,
            "job": report.job, "restart": report.restart_count, "functions": functions}


def enable_cache(config: Config | str | Path | None = None, *, job: str = TRAIN,
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

    if not is_remote(config.cache.dir):
        # Every rank refuses an unsafe dir: each one would load native code from it.
        if jax.process_index() == 0:
            prepare_cache_dir(Path(config.cache.dir), config.cache, config.source)
        else:
            check_cache_dir(Path(config.cache.dir), config.cache, config.source)

    restart = restart_count()
    report = InitReport(
        job=job, restart_count=restart, process_index=jax.process_index(),
        process_count=jax.process_count(), cache_dir=config.cache.dir,
        init_budget_s=config.init_budget_s,
        environment={k: v for k, v in sorted(os.environ.items()) if owned(k)})
    path = report_path(config.run_dir, job, restart, jax.process_index())
    recorder = InitRecorder(report, path, recompile_warn_s).install()
    atexit.register(recorder.write)
    if jax.process_index() == 0 and not is_remote(config.cache.dir):
        recorder.after_first_step += [
            lambda done: note_written_entries(config.cache.dir, done, recorder.start_time),
            lambda done: append_usage(config.cache.dir, usage_record(config, done))]
    log.info("persistent compilation cache at %s (process %d of %d, restart %d)",
             config.cache.dir, jax.process_index(), jax.process_count(), restart)
    return recorder

"""The prewarm job: `python -m prewarm.job` on the run's own process layout.

It builds the step through the same factory, mesh and environment as the trainer, from
abstract inputs only (no parameters materialized, no data read, no step executed), and
`lower().compile()`s each function so that process 0 writes the cache entries. What it
compiled, under which key and how long it took goes into the manifest in the cache dir.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass

from launcher.hook import config_from_env
from launcher.manifest import ManifestEntry, record_entries
from launcher.recorder import FunctionRecord, InitRecorder
from prewarm.cache_key import UnsupportedJaxVersion, predict_key
from prewarm.specs import warn_risky_inputs
from prewarm.step import start_job

log = logging.getLogger("jaxwarm.prewarm")


@dataclass(frozen=True)
class Compiled:
    name: str
    lower_s: float
    record: FunctionRecord


def predicted_key(lowered: object) -> str | None:
    """The adapter's key, to cross-check against JAX's; None where the adapter cannot run."""
    try:
        return predict_key(lowered).key
    except UnsupportedJaxVersion as exc:
        log.warning("%s; prewarming without the key cross-check", exc)
        return None


def compile_targets(recorder: InitRecorder, targets: list) -> list[Compiled]:
    """Lower and compile each target; the recorder saw its cache key and outcome."""
    compiled = []
    for name, function, args in targets:
        warn_risky_inputs(args, name)
        start = time.perf_counter()
        lowered = function.lower(*args)
        lower_s = time.perf_counter() - start
        predicted = predicted_key(lowered)
        lowered.compile()
        record = recorder.report.functions[-1]
        if predicted is not None and record.key is not None and predicted != record.key:
            log.warning("%s: jaxwarm predicted key %s but JAX used %s: `jaxwarm verify` "
                        "cannot be trusted on this setup", name, predicted, record.key)
        compiled.append(Compiled(name, lower_s, record))
    return compiled


def describe(item: Compiled, min_compile_time_s: float) -> str:
    record = item.record
    if record.key is None:
        return f"{record.name}: compiled in {record.seconds:.2f} s, but the cache is off"
    if record.hit:
        return f"{record.name}: already in the cache (loaded in {record.seconds:.2f} s)"
    if record.seconds < min_compile_time_s:
        return (f"{record.name}: compiled in {record.seconds:.2f} s, under "
                f"cache.min_compile_time_secs={min_compile_time_s:g}: JAX does not store it")
    return (f"{record.name}: compiled in {record.seconds:.2f} s (lowering {item.lower_s:.2f} s), "
            f"written as {record.key}")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import jax

    config = config_from_env()
    recorder, mesh, bundle = start_job(config, "prewarm")
    log.info("prewarming %s on %d process(es) x %d device(s), mesh %s",
             config.step.factory, jax.process_count(), jax.local_device_count(),
             dict(mesh.shape))
    compiled = compile_targets(recorder, bundle.compile_targets())
    for item in compiled:
        log.info("%s", describe(item, config.cache.min_compile_time_secs))
    recorder.mark_first_step()
    if jax.process_index() == 0:
        written = [
            ManifestEntry(function=item.record.name, key=item.record.key, run=config.run.name,
                          config=config.source, compile_s=item.record.seconds,
                          lower_s=item.lower_s,
                          written=item.record.seconds >= config.cache.min_compile_time_secs,
                          jax_version=jax.__version__, process_count=jax.process_count(),
                          components=item.record.components)
            # A hit's seconds are a load, not a compile: keep the entry that wrote it.
            for item in compiled if item.record.key is not None and not item.record.hit]
        path = record_entries(config.cache.dir, written)
        log.info("manifest: %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
